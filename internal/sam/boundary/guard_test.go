package boundary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/testenv"
)

// rebindPolicy allows names that resolve (in the test's resolver) to every
// kind of address a sandbox must never reach, as DNS rebinding or a hostile
// resolver would make them, and literals of the node's own address.
const rebindPolicy = `
roles:
  - name: r
    egress: ["*.rebind.test", "good.test", "mixed.test", "lan.test", "198.51.100.9"]
    egress_private: ["10.20.0.0/24"]
bindings:
  - {principal: agent-a, roles: [r]}
`

// rebindHosts: name → what the resolver answers, and the class the guard
// must refuse it as.
var rebindHosts = []struct{ name, addr, class string }{
	{"loopback.rebind.test", "127.0.0.1", "loopback"},
	{"loopback2.rebind.test", "127.9.9.9", "loopback"},
	{"v6loopback.rebind.test", "::1", "loopback"},
	{"mapped.rebind.test", "::ffff:127.0.0.1", "loopback"},
	{"nat64.rebind.test", "64:ff9b::7f00:1", "loopback"},
	{"zero.rebind.test", "0.0.0.0", "unspecified"},
	{"v6zero.rebind.test", "::", "unspecified"},
	{"metadata.rebind.test", "169.254.169.254", "link_local"},
	{"synthetic.rebind.test", "169.254.64.1", "link_local"},
	{"v6ll.rebind.test", "fe80::1", "link_local"},
	{"mcast.rebind.test", "224.0.0.251", "multicast"},
	{"v6mcast.rebind.test", "ff02::1", "multicast"},
	{"bcast.rebind.test", "255.255.255.255", "broadcast"},
	{"private.rebind.test", "192.168.1.1", "private"},
	{"private10.rebind.test", "10.1.2.3", "private"},
	{"cgnat.rebind.test", "100.100.100.200", "private"},
	{"ula.rebind.test", "fd12::1", "private"},
	{"sandbox.rebind.test", "10.213.0.1", "sandbox"},           // the node's sandbox subnet
	{"othersandbox.rebind.test", "203.0.113.6", "sandbox"},     // routed into a sandbox veth (another daemon's subnet)
	{"node.rebind.test", "198.51.100.7", "node"},               // an address of the node (a local route)
	{"neighbour.rebind.test", "198.51.100.8", "local_network"}, // on-link, no gateway
	{"reserved.rebind.test", "240.1.2.3", "reserved"},
}

// routesOfTheNode is the routing table the guard sees in these tests.
var routesOfTheNode = map[string]dialguard.Route{
	"203.0.113.6":  {Type: dialguard.RouteUnicast, Oif: "ssv99aabbcc", Gateway: true},
	"198.51.100.7": {Type: dialguard.RouteLocal, Oif: "lo"},
	"198.51.100.9": {Type: dialguard.RouteLocal, Oif: "lo"},
	"198.51.100.8": {Type: dialguard.RouteUnicast, Oif: "eth0"},
}

func newRebindEnv(t *testing.T, addr netip.Addr, mod func(*Config)) *env {
	e := newEnv(t, "agent-a", addr, func(c *Config) {
		c.Guard = testGuard(routesOfTheNode)
		if mod != nil {
			mod(c)
		}
	})
	e.pol.Store(mustPolicy(t, rebindPolicy))
	// Under the recorder's lock: the boundary is listening already, and a
	// flow of the test may resolve while the names are added (go test -race).
	e.rec.mu.Lock()
	for _, h := range rebindHosts {
		e.rec.hosts[h.name] = h.addr
	}
	e.rec.hosts["good.test"] = "198.51.100.1"
	e.rec.hosts["lan.test"] = "10.20.0.1"
	e.rec.mu.Unlock()
	return e
}

// Every name policy allows that resolves somewhere a sandbox must never
// reach is refused as policy refuses a name — SOCKS5 0x02 and CONNECT 403,
// over the Unix socket and the sandbox-facing port — nothing is dialled,
// and each refusal is counted by class.
func TestAddressGuardRefuses(t *testing.T) {
	e := newRebindEnv(t, netip.MustParseAddr("127.77.0.20"), nil)
	_, accepted := echoServer(t, "127.0.0.1:0")
	want := map[string]uint64{}
	for _, h := range rebindHosts {
		if rep := e.rawSOCKS(t, h.name, 80); rep != socksNotAllowed {
			t.Errorf("SOCKS5 %s (%s): reply %#x, want 0x02", h.name, h.addr, rep)
		}
		if st := rawCONNECT(t, "unix", e.sock, h.name+":80"); st != 403 {
			t.Errorf("CONNECT %s (%s): %d, want 403", h.name, h.addr, st)
		}
		if st := rawCONNECT(t, "tcp", "127.77.0.20:1080", h.name+":80"); st != 403 {
			t.Errorf("CONNECT on the proxy port %s (%s): %d, want 403", h.name, h.addr, st)
		}
		want[h.class] += 3
	}
	// An allowed literal that is the node's own address.
	if rep := e.rawSOCKS(t, "198.51.100.9", 80); rep != socksNotAllowed {
		t.Errorf("SOCKS5 to the node's own address as an allowed literal: %#x", rep)
	}
	want["node"]++
	if _, dialled := e.rec.touched(); len(dialled) != 0 {
		t.Fatalf("refused addresses were dialled: %v", dialled)
	}
	if accepted.Load() != 0 {
		t.Fatal("a refused flow reached a listener")
	}
	st := e.b.Stats()
	for class, n := range want {
		if st.AddressRefusals[class] != n {
			t.Errorf("address refusals %s = %d, want %d (all: %v)", class, st.AddressRefusals[class], n, st.AddressRefusals)
		}
	}
	if st.Allowed != 0 || st.Flows["external/denied"] != uint64(3*len(rebindHosts)+1) {
		t.Errorf("flows: %v", st.Flows)
	}
}

// A name with good and bad addresses is dialled only at the good ones; an
// opted-in private network is reachable, a private one not opted into is
// not; an ordinary public address works.
func TestAddressGuardAllows(t *testing.T) {
	e := newRebindEnv(t, netip.Addr{}, nil)
	ln, accepted := echoServer(t, "127.0.0.1:0")
	port := portOf(t, ln)
	e.rec.mu.Lock()
	e.rec.hosts["mixed.test"] = "127.0.0.1"
	e.rec.mu.Unlock()
	mixed := func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host == "mixed.test" {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("198.51.100.1")}, nil
		}
		return e.rec.resolve(ctx, host)
	}
	e2 := newRebindEnv(t, netip.Addr{}, func(c *Config) { c.Resolve = mixed })
	for _, c := range []struct {
		e    *env
		host string
	}{{e, "good.test"}, {e, "lan.test"}, {e2, "mixed.test"}} {
		conn, err := c.e.socksDialer(t, "unix", nil).DialContext(context.Background(), "tcp", fmt.Sprintf("%s:%d", c.host, port))
		if err != nil {
			t.Fatalf("%s: %v", c.host, err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, "bye\n")
		if b, _ := io.ReadAll(conn); string(b) != "BYE\n" {
			t.Errorf("%s: %q", c.host, b)
		}
		conn.Close()
	}
	if accepted.Load() != 3 {
		t.Errorf("echo server accepted %d, want 3", accepted.Load())
	}
	if _, dialled := e2.rec.touched(); len(dialled) != 1 || dialled[0] != fmt.Sprintf("198.51.100.1:%d", port) {
		t.Errorf("mixed.test dialled %v, want only its public address", dialled)
	}
	if st := e2.b.Stats(); st.AddressRefusals["loopback"] != 1 || st.AddressRefusals["link_local"] != 1 {
		t.Errorf("mixed.test refusals: %v", st.AddressRefusals)
	}
}

// flipGuard allows an address the first time it is asked and refuses it
// after: a route that changed between the boundary's check and the dial.
type flipGuard struct{ n atomic.Int64 }

func (g *flipGuard) Check(a netip.Addr, _ []netip.Prefix) error {
	if g.n.Add(1) == 1 {
		return nil
	}
	return &dialguard.Refusal{Addr: a, Class: dialguard.NodeAddress}
}

// The check is made again on the socket about to connect (the dialer's
// Control hook), so an address that became forbidden after the first check
// is still never connected to.
func TestAddressGuardOnTheSocket(t *testing.T) {
	ln, accepted := echoServer(t, "127.0.0.1:0")
	g := &flipGuard{}
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) {
		c.Guard = g
		c.Dial = nil // the boundary's own dialer, with its Control hook
		c.Resolve = func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
	})
	if rep := e.rawSOCKS(t, "allowed.test", portOf(t, ln)); rep != socksNotAllowed {
		t.Fatalf("reply %#x, want 0x02", rep)
	}
	if g.n.Load() != 2 {
		t.Errorf("guard asked %d times, want twice (before the dial and on the socket)", g.n.Load())
	}
	// The listener is open: a plain connection is accepted, and it is the
	// only one.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	testenv.WaitFor(t, 10*time.Second, "a connection accepted", func() bool { return accepted.Load() >= 1 })
	if accepted.Load() != 1 {
		t.Fatalf("the listener accepted %d connections: the refused flow reached it", accepted.Load())
	}
	if st := e.b.Stats(); st.AddressRefusals["node"] != 1 {
		t.Errorf("refusals: %v", st.AddressRefusals)
	}
}

// The sandbox-facing listeners serve only the sandbox's own address: a
// connection or DNS query from any other source (another sandbox's flow, a
// process on the host) is reset or dropped, and counted.
func TestForeignSourceRefused(t *testing.T) {
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.21"), nil)
	other := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: 5 * time.Second}
	for _, port := range []int{DefaultProxyPort, DefaultDNSPort, DefaultTransparentPort} {
		c, err := other.Dial("tcp", fmt.Sprintf("127.77.0.21:%d", port))
		if isReset(err) {
			continue // reset before the dial even returned
		}
		if err != nil {
			t.Fatalf("port %d: %v", port, err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte{5, 1, 0})
		_, err = c.Read(make([]byte, 1))
		if !isReset(err) && !errors.Is(err, io.EOF) {
			t.Errorf("port %d from 127.0.0.9: %v, want a reset", port, err)
		}
		c.Close()
	}
	// DNS over UDP from another source: no answer.
	uc, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP("127.0.0.9")}, &net.UDPAddr{IP: net.ParseIP("127.77.0.21"), Port: 53})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	m := new(dns.Msg)
	m.SetQuestion("mesh.sam.alt.", dns.TypeA)
	q, _ := m.Pack()
	uc.Write(q)
	uc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := uc.Read(make([]byte, 512)); err == nil {
		t.Error("a DNS query from another source was answered")
	}
	testenv.WaitFor(t, 10*time.Second, "four foreign flows counted", func() bool { return e.b.Stats().Foreign == 4 })
	// From the sandbox's own address all of it works.
	if rep := e.rawSOCKS(t, "mesh.sam.alt", 80); rep != socksSucceeded {
		t.Errorf("the sandbox itself (Unix socket): %#x", rep)
	}
	if r := dnsQuery(t, "udp", "127.77.0.21:53", "mesh.sam.alt.", dns.TypeA); len(r.Answer) != 1 {
		t.Errorf("the sandbox's own DNS query: %v", r)
	}
	if st := e.b.Stats(); st.Foreign != 4 || st.HandshakeErrors != 0 {
		t.Errorf("stats: foreign %d, handshake errors %d", st.Foreign, st.HandshakeErrors)
	}
}
