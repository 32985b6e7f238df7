// Package synthaddr hands a sandbox's boundary synthetic addresses for the
// names it resolves (the boundary answers DNS with them, and a flow to one
// is a flow to its name): decided on names, never on what a name resolves
// to inside the sandbox.
package synthaddr

import (
	"encoding/binary"
	"hash/fnv"
	"net/netip"
	"sync"
)

// Pool hands out synthetic addresses: the name's FNV-1a hash picks its
// place in the pool, probing linearly past taken places, so the same name
// gets the same address across restarts unless names collide.
type Pool struct {
	prefix  netip.Prefix
	base    uint32
	size    uint32 // usable places: the pool less its first and last address
	exclude netip.Addr

	mu     sync.RWMutex
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
}

// New is the pool of p's addresses less its first and last, and exclude
// (the boundary's own listen address).
func New(p netip.Prefix, exclude netip.Addr) *Pool {
	a := p.Addr().As4()
	return &Pool{
		prefix:  p.Masked(),
		base:    binary.BigEndian.Uint32(a[:]),
		size:    uint32(1)<<(32-p.Bits()) - 2,
		exclude: exclude,
	}
}

func (s *Pool) addr(i uint32) netip.Addr {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], s.base+1+i)
	return netip.AddrFrom4(a)
}

// Assign is name's address: the one it has, else a new one; false when
// the pool is full.
func (s *Pool) Assign(name string) (netip.Addr, bool) {
	s.mu.RLock()
	a, ok := s.byName[name]
	s.mu.RUnlock()
	if ok {
		return a, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.byName[name]; ok {
		return a, true
	}
	if s.byName == nil {
		s.byName = map[string]netip.Addr{}
		s.byAddr = map[netip.Addr]string{}
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	start := uint32(h.Sum64() % uint64(s.size))
	for i := uint32(0); i < s.size; i++ {
		a := s.addr((start + i) % s.size)
		if _, taken := s.byAddr[a]; taken || a == s.exclude {
			continue
		}
		s.byName[name] = a
		s.byAddr[a] = name
		return a, true
	}
	return netip.Addr{}, false
}

// Lookup is the name address a stands for, if it was assigned one.
func (s *Pool) Lookup(a netip.Addr) (string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	name, ok := s.byAddr[a.Unmap()]
	return name, ok
}

// Contains reports whether a is in the pool's prefix: an address that can
// only stand for a name (assigned or not), never one to dial.
func (s *Pool) Contains(a netip.Addr) bool { return s.prefix.Contains(a.Unmap()) }
