package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
)

// Version is the handoff protocol this binary speaks: the record's layout
// and what an entry's kind means. A process hands its descriptors only to
// a binary that says it speaks the same (`sandstormd handoff-version`):
// one that does not would find its addresses taken by the descriptors it
// does not know it holds.
const Version = 1

// Kinds of descriptor a record carries.
const (
	KindListener = "listener" // a stream listener: TCP or Unix
	KindPacket   = "packet"   // a datagram socket: UDP
	KindFile     = "file"     // an open file (the data dir's lock)
)

// Record is what one process leaves for the next across execve(2): which
// descriptor numbers it kept open, and what each is. It is written to a
// file of mode 0600 whose path is in EnvVar.
type Record struct {
	Version int `json:"version"`
	// Nonce names the exec this record was written for: the next process
	// serves under it (its readiness says so), so a waiter can tell the
	// old process from the new one although they share a PID.
	Nonce string `json:"nonce"`
	// FromPID is the process that wrote it (the same PID runs on).
	FromPID int     `json:"from_pid"`
	Entries []Entry `json:"entries"`
}

// Entry is one inherited descriptor.
type Entry struct {
	FD   int    `json:"fd"`
	Kind string `json:"kind"`
	// Network is the socket's network as it was listened on ("tcp",
	// "unix", "udp"…); empty for a file.
	Network string `json:"network,omitempty"`
	// Address is what the listener was asked for (host:port, a socket
	// path) or the file's path: the next process claims it by asking for
	// the same.
	Address string `json:"address"`
}

func (e Entry) key() key { return key{e.Kind, e.Network, e.Address} }

// key identifies a descriptor the way its owner asks for it.
type key struct{ kind, network, address string }

func (k key) String() string {
	if k.network == "" {
		return k.kind + " " + k.address
	}
	return k.kind + " " + k.network + " " + k.address
}

// Decode parses and checks a record: the version this binary speaks,
// descriptors above stderr, each named once, kinds and networks it knows.
func Decode(b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("handoff record: %w", err)
	}
	if r.Version != Version {
		return r, fmt.Errorf("handoff record of version %d; this binary speaks %d", r.Version, Version)
	}
	if r.Nonce == "" {
		return r, errors.New("handoff record without a nonce")
	}
	fds := map[int]bool{}
	keys := map[key]bool{}
	for _, e := range r.Entries {
		switch {
		case e.FD < 3:
			return r, fmt.Errorf("handoff record: descriptor %d of %s is stdin, stdout or stderr", e.FD, e.key())
		case fds[e.FD]:
			return r, fmt.Errorf("handoff record: descriptor %d named twice", e.FD)
		case keys[e.key()]:
			return r, fmt.Errorf("handoff record: %s named twice", e.key())
		case e.Address == "":
			return r, fmt.Errorf("handoff record: descriptor %d has no address", e.FD)
		}
		if err := checkNetwork(e.Kind, e.Network); err != nil {
			return r, fmt.Errorf("handoff record: descriptor %d: %w", e.FD, err)
		}
		fds[e.FD], keys[e.key()] = true, true
	}
	return r, nil
}

func checkNetwork(kind, network string) error {
	switch kind {
	case KindListener:
		switch network {
		case "tcp", "tcp4", "tcp6", "unix":
			return nil
		}
	case KindPacket:
		switch network {
		case "udp", "udp4", "udp6":
			return nil
		}
	case KindFile:
		if network == "" {
			return nil
		}
	default:
		return fmt.Errorf("unknown kind %q", kind)
	}
	return fmt.Errorf("network %q is not one a %s is passed with", network, kind)
}

// sameAddress reports whether a socket inherited for want (as its owner
// asked for it: "127.0.0.1:8080", "[::]:80", a path) is bound where got
// (its Addr) says. It is checked before an inherited descriptor is used,
// so a record that names the wrong descriptor is refused, not served.
func sameAddress(network, want string, got net.Addr) bool {
	if got == nil {
		return false
	}
	if network == "unix" {
		return filepath.Clean(want) == filepath.Clean(got.String())
	}
	wh, wp, err1 := net.SplitHostPort(want)
	gh, gp, err2 := net.SplitHostPort(got.String())
	if err1 != nil || err2 != nil || wp != gp {
		return false
	}
	// An empty or unspecified host listens on every address; Go reports
	// it as "::" or "0.0.0.0" depending on the network.
	unspec := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	if unspec(wh) || unspec(gh) {
		return unspec(wh) && unspec(gh)
	}
	gip := net.ParseIP(gh)
	if gip == nil {
		return false
	}
	if wip := net.ParseIP(strings.Trim(wh, "[]")); wip != nil {
		return wip.Equal(gip)
	}
	// A name ("localhost:8080"): Listen bound one of its addresses.
	ips, err := net.LookupIP(wh)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if ip.Equal(gip) {
			return true
		}
	}
	return false
}
