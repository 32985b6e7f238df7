package meshpeer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"

	"sandstorm/internal/sam/discovery"
)

const (
	// lookupTimeout bounds one router's answer to a lookup.
	lookupTimeout = 3 * time.Second
	// lookupGrace is how long a lookup waits for the other routers once
	// one has answered: every member publishes to every router, so the
	// first answer is normally whole, and a router that hangs (cut off,
	// not yet taken for gone) must not hold every cold lookup for
	// lookupTimeout. A router that restarted and is not yet given the
	// records again answers at once, with less: it is waited for.
	lookupGrace = 300 * time.Millisecond
)

// lookup asks every joined router for the providers of name (a
// GET_PROVIDERS message each, at once) and returns what they hold
// together. A lookup that no router answered is an error, so that the
// cache keeps its last good answer (internal/sam/discovery).
func (p *Peer) lookup(ctx context.Context, name string) ([]peer.AddrInfo, error) {
	var rs []*router
	for _, r := range p.routers {
		if p.usable(r) {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return nil, ErrNoRouter
	}
	key := discovery.Key(name).Hash()
	type answer struct {
		provs []*peer.AddrInfo
		err   error
	}
	answers := make(chan answer, len(rs))
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	for _, r := range rs {
		go func() {
			provs, _, err := p.msgr.GetProviders(ctx, r.info.ID, key)
			if err != nil {
				err = fmt.Errorf("router %s: %w", r.info.ID, err)
			}
			answers <- answer{provs, err}
		}()
	}
	byID := map[peer.ID]*peer.AddrInfo{}
	var order []peer.ID
	var errs []error
	answered := 0
	var grace <-chan time.Time
	for range rs {
		var a answer
		select {
		case a = <-answers:
		case <-grace:
			return merged(order, byID), nil
		}
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		answered++
		if grace == nil {
			grace = time.After(lookupGrace)
		}
		for _, ai := range a.provs {
			if have := byID[ai.ID]; have != nil {
				have.Addrs = append(have.Addrs, ai.Addrs...)
				continue
			}
			byID[ai.ID] = &peer.AddrInfo{ID: ai.ID, Addrs: ai.Addrs}
			order = append(order, ai.ID)
		}
	}
	if answered == 0 {
		return nil, errors.Join(errs...)
	}
	return merged(order, byID), nil
}

func merged(order []peer.ID, byID map[peer.ID]*peer.AddrInfo) []peer.AddrInfo {
	out := make([]peer.AddrInfo, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	return out
}

// Find finds the members that provide name (cached, shared; see
// internal/sam/discovery), this one among them if it does.
func (p *Peer) Find(ctx context.Context, name string) ([]peer.AddrInfo, error) {
	return p.find.Get(ctx, name)
}

// FindNow is Find past the cache: the routers asked now (sam-node's
// admin listener, GET /mesh/providers; tests).
func (p *Peer) FindNow(ctx context.Context, name string) ([]peer.AddrInfo, error) {
	return p.lookup(ctx, name)
}

// Providers implements meshnode.Mesh: the other members that provide
// name, by peer ID; their addresses go to the peerstore for the call.
func (p *Peer) Providers(ctx context.Context, name string) ([]string, error) {
	found, err := p.Find(ctx, name)
	var out []string
	for _, ai := range found {
		if ai.ID == p.Host.ID() {
			continue
		}
		p.Host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
		out = append(out, ai.ID.String())
	}
	return out, err
}
