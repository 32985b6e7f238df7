package dialguard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestGuardCheck(t *testing.T) {
	lookups := 0
	g := &Guard{SandboxNets: testSandboxNets, SandboxIfPrefix: "ssv", Lookup: func(a netip.Addr) (Route, error) {
		lookups++
		switch a.String() {
		case "198.51.100.1":
			return Route{Type: RouteLocal, Oif: "lo"}, nil
		case "198.51.100.99":
			return Route{}, errors.New("network is unreachable")
		}
		return Route{Type: RouteUnicast, Oif: "eth0", Gateway: true}, nil
	}}
	if err := g.Check(netip.MustParseAddr("198.51.100.10"), nil); err != nil {
		t.Errorf("public address: %v", err)
	}
	var r *Refusal
	if err := g.Check(netip.MustParseAddr("198.51.100.1"), nil); !errors.As(err, &r) || r.Class != NodeAddress {
		t.Errorf("a local route: %v, want a NodeAddress refusal", err)
	}
	n := lookups
	if err := g.Check(netip.MustParseAddr("::ffff:127.0.0.1"), nil); !errors.As(err, &r) || r.Class != Loopback || r.Addr.String() != "127.0.0.1" {
		t.Errorf("mapped loopback: %v", err)
	}
	if lookups != n {
		t.Error("a statically refused address needed no route lookup, but one was made")
	}
	if err := g.Check(netip.MustParseAddr("198.51.100.99"), nil); err == nil || errors.As(err, &r) {
		t.Errorf("failed lookup: %v, want a plain error (nothing dialled)", err)
	}
	if err := g.Check(netip.MustParseAddr("10.20.0.5"), optIn); err != nil {
		t.Errorf("opted-in private: %v", err)
	}
	if err := g.Check(netip.MustParseAddr("10.20.0.5"), nil); !errors.As(err, &r) || r.Class != Private {
		t.Errorf("private without opt-in: %v", err)
	}
	if msg := (&Refusal{Addr: netip.MustParseAddr("10.0.0.1"), Class: Private}).Error(); !strings.Contains(msg, "egress_private") {
		t.Errorf("a private refusal should say how to opt in: %q", msg)
	}
}

// TestControlStopsTheConnect proves the hook runs on the socket before it
// connects: a listener on loopback sees no connection at all.
func TestControlStopsTheConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	g := &Guard{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// By name too: the dialer resolves localhost itself, and the hook sees
	// the address it resolved to.
	for _, addr := range []string{ln.Addr().String(), "localhost:" + strings.Split(ln.Addr().String(), ":")[1]} {
		c, err := (&net.Dialer{Control: Control(g, nil)}).DialContext(ctx, "tcp", addr)
		var r *Refusal
		if err == nil {
			c.Close()
			t.Fatalf("dial %s succeeded", addr)
		}
		if !errors.As(err, &r) || r.Class != Loopback {
			t.Fatalf("dial %s: %v, want a loopback refusal", addr, err)
		}
	}
	// The listener is still open and has seen nothing: a plain dial to it
	// is the first connection it accepts.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-accepted
	select {
	case <-accepted:
		t.Fatal("the guarded dials reached the listener")
	default:
	}
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// TestKernelRoute asks the real routing table, on a link of the test's
// own (no packet is sent): an address added to the node after the
// guard was made is refused as the node's from then on, and a route out of
// a sandbox-named link is a sandbox's.
func TestKernelRoute(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test must run as root: it adds a link of its own")
	}
	var rb [3]byte
	rand.Read(rb[:])
	link := "dgt" + hex.EncodeToString(rb[:])
	t.Cleanup(func() { exec.Command("ip", "link", "del", link).Run() })
	// A veth pair (this kernel has no dummy links); its peer stays down
	// in the host namespace, so nothing can be delivered over it.
	run(t, "ip", "link", "add", link, "type", "veth", "peer", "name", link+"p")
	run(t, "ip", "link", "set", link, "up")
	run(t, "ip", "addr", "add", "198.18.255.1/30", "dev", link)
	run(t, "ip", "route", "add", "203.0.113.128/25", "via", "198.18.255.2", "dev", link, "onlink")

	g := &Guard{SandboxIfPrefix: "nomatch"}
	own := netip.MustParseAddr("203.0.113.200")
	if err := g.Check(own, nil); err != nil {
		t.Fatalf("%s before it is the node's: %v", own, err)
	}
	run(t, "ip", "addr", "add", own.String()+"/32", "dev", link)
	var r *Refusal
	if err := g.Check(own, nil); !errors.As(err, &r) || r.Class != NodeAddress {
		t.Fatalf("%s once it is the node's: %v, want a NodeAddress refusal", own, err)
	}
	rt, err := KernelRoute(netip.MustParseAddr("203.0.113.130"))
	if err != nil || rt.Type != RouteUnicast || rt.Oif != link || !rt.Gateway {
		t.Fatalf("route to 203.0.113.130: %+v %v, want unicast through a gateway via %s", rt, err, link)
	}
	// The gateway itself is on-link: the node's own network.
	if err := g.Check(netip.MustParseAddr("198.18.255.2"), nil); !errors.As(err, &r) || r.Class != LocalNetwork {
		t.Fatalf("an on-link neighbour: %v, want a LocalNetwork refusal", err)
	}
	if err := g.Check(netip.MustParseAddr("198.18.255.2"), []netip.Prefix{netip.MustParsePrefix("198.18.255.0/30")}); err != nil {
		t.Fatalf("an on-link neighbour the policy opted into: %v", err)
	}
	g.SandboxIfPrefix = "dgt"
	if err := g.Check(netip.MustParseAddr("203.0.113.130"), nil); !errors.As(err, &r) || r.Class != SandboxNet {
		t.Fatalf("routed out of a sandbox-named link: %v", err)
	}
	if rt, err := KernelRoute(netip.MustParseAddr("127.0.0.1")); err != nil || rt.Type != RouteLocal {
		t.Fatalf("127.0.0.1: %+v %v, want a local route", rt, err)
	}
}

// BenchmarkCheck is the per-dial cost of the guard on this machine: the
// route lookup is a netlink round trip.
func BenchmarkCheck(b *testing.B) {
	g := &Guard{SandboxIfPrefix: "ssv"}
	a := netip.MustParseAddr("198.51.100.10")
	for b.Loop() {
		g.Check(a, nil)
	}
}
