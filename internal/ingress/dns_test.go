package ingress

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
)

func testDNS() *DNS {
	return &DNS{
		Zone:    "Sandbox.Example",
		Self:    netip.MustParseAddr("192.0.2.1"),
		Records: map[string][]netip.Addr{"api": {netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("2001:db8::9")}},
		Steer: func(id string) (netip.Addr, bool) {
			if id == "onc" {
				return netip.MustParseAddr("192.0.2.3"), true
			}
			return netip.Addr{}, false
		},
		Serial: func() uint32 { return 7 },
	}
}

// TestDNSAnswer: what the zone's server answers, decided on the name
// alone: a sandbox another node holds with that node's address, any other
// sandbox name (its own, or one whose route has not come) with this
// node's, fixed records, the zone's SOA, NXDOMAIN for a name it does not
// know and REFUSED, never a recursion, outside its zone.
func TestDNSAnswer(t *testing.T) {
	d := testDNS()
	for _, c := range []struct {
		name  string
		qtype uint16
		rcode int
		want  []string // the answers' addresses (or "SOA")
		auth  bool     // an SOA in the authority section
	}{
		{"49983-onc.sandbox.example.", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.3"}, false},
		{"8080-OnC.SANDBOX.example.", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.3"}, false}, // case folds
		{"49983-here.sandbox.example.", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.1"}, false},
		{"49983-onc.sandbox.example.", dns.TypeAAAA, dns.RcodeSuccess, nil, true}, // no v6: NODATA
		{"49983-onc.sandbox.example.", dns.TypeTXT, dns.RcodeSuccess, nil, true},
		{"api.sandbox.example.", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.9"}, false},
		{"api.sandbox.example.", dns.TypeAAAA, dns.RcodeSuccess, []string{"2001:db8::9"}, false},
		{"sandbox.example.", dns.TypeSOA, dns.RcodeSuccess, []string{"SOA"}, false},
		{"sandbox.example.", dns.TypeA, dns.RcodeSuccess, nil, true},
		{"www.sandbox.example.", dns.TypeA, dns.RcodeNameError, nil, true},
		{"a.49983-onc.sandbox.example.", dns.TypeA, dns.RcodeNameError, nil, true},
		{"onc.sandbox.example.", dns.TypeA, dns.RcodeNameError, nil, true},
		{"example.", dns.TypeA, dns.RcodeRefused, nil, false},
		{"xsandbox.example.", dns.TypeA, dns.RcodeRefused, nil, false},
		{"google.com.", dns.TypeA, dns.RcodeRefused, nil, false},
	} {
		req := new(dns.Msg)
		req.SetQuestion(c.name, c.qtype)
		m := d.answer(req)
		var got []string
		for _, rr := range m.Answer {
			switch rr := rr.(type) {
			case *dns.A:
				got = append(got, rr.A.String())
			case *dns.AAAA:
				got = append(got, rr.AAAA.String())
			case *dns.SOA:
				got = append(got, "SOA")
			}
			if rr.Header().Name != c.name {
				t.Errorf("%s: answer named %s (the question's spelling is kept)", c.name, rr.Header().Name)
			}
		}
		if m.Rcode != c.rcode || !slices.Equal(got, c.want) || (len(m.Ns) == 1) != c.auth {
			t.Errorf("%s %s: %s %v, authority %v; want %s %v, SOA %v", c.name, dns.TypeToString[c.qtype], dns.RcodeToString[m.Rcode], got, m.Ns, dns.RcodeToString[c.rcode], c.want, c.auth)
		}
		if m.RecursionAvailable || m.Authoritative != (c.rcode != dns.RcodeRefused) {
			t.Errorf("%s: RA %v AA %v", c.name, m.RecursionAvailable, m.Authoritative)
		}
	}
	// Not a plain query, or more than one question.
	req := new(dns.Msg)
	req.SetQuestion("49983-onc.sandbox.example.", dns.TypeA)
	req.Opcode = dns.OpcodeUpdate
	if m := d.answer(req); m.Rcode != dns.RcodeNotImplemented || len(m.Answer) != 0 {
		t.Errorf("an update: %s", dns.RcodeToString[m.Rcode])
	}
	req = new(dns.Msg)
	req.Question = []dns.Question{{Name: "49983-onc.sandbox.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, {Name: "api.sandbox.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}}
	if m := d.answer(req); m.Rcode != dns.RcodeFormatError {
		t.Errorf("two questions: %s", dns.RcodeToString[m.Rcode])
	}
	req = new(dns.Msg)
	req.SetQuestion("49983-onc.sandbox.example.", dns.TypeA)
	req.Question[0].Qclass = dns.ClassCHAOS
	if m := d.answer(req); m.Rcode != dns.RcodeRefused {
		t.Errorf("class CHAOS: %s", dns.RcodeToString[m.Rcode])
	}
}

// TestDNSNameServers: the apex's NS records are the delegation's names,
// with the addresses of those under the zone beside them; the first is the
// SOA's primary; with none given NS has no records (NODATA) and the SOA
// names the zone.
func TestDNSNameServers(t *testing.T) {
	d := testDNS()
	ask := func(name string, qtype uint16) *dns.Msg {
		req := new(dns.Msg)
		req.SetQuestion(name, qtype)
		return d.answer(req)
	}
	if m := ask("sandbox.example.", dns.TypeNS); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 || len(m.Ns) != 1 {
		t.Errorf("NS with none given: %v", m)
	}
	if soa := ask("sandbox.example.", dns.TypeSOA).Answer[0].(*dns.SOA); soa.Ns != "sandbox.example." {
		t.Errorf("the SOA's primary with no NS: %s", soa.Ns)
	}
	d.NS = []string{"ns1.sandbox.example", "ns.other.example"}
	d.Records["ns1"] = []netip.Addr{netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("2001:db8::53")}
	m := ask("SANDBOX.example.", dns.TypeNS)
	var ns, extra []string
	for _, rr := range m.Answer {
		if n, ok := rr.(*dns.NS); ok && rr.Header().Name == "SANDBOX.example." {
			ns = append(ns, n.Ns)
		}
	}
	for _, rr := range m.Extra {
		switch rr := rr.(type) {
		case *dns.A:
			extra = append(extra, rr.Hdr.Name+" "+rr.A.String())
		case *dns.AAAA:
			extra = append(extra, rr.Hdr.Name+" "+rr.AAAA.String())
		}
	}
	if !m.Authoritative || !slices.Equal(ns, []string{"ns1.sandbox.example.", "ns.other.example."}) ||
		!slices.Equal(extra, []string{"ns1.sandbox.example. 192.0.2.53", "ns1.sandbox.example. 2001:db8::53"}) {
		t.Errorf("NS: %v, additional %v (AA %v)", ns, extra, m.Authoritative)
	}
	if soa := ask("sandbox.example.", dns.TypeSOA).Answer[0].(*dns.SOA); soa.Ns != "ns1.sandbox.example." {
		t.Errorf("the SOA's primary: %s, want the first NS", soa.Ns)
	}
	if m := ask("ns1.sandbox.example.", dns.TypeA); len(m.Answer) != 1 {
		t.Errorf("ns1's own A: %v", m.Answer)
	}
	if m := ask("api.sandbox.example.", dns.TypeNS); len(m.Answer) != 0 || m.Rcode != dns.RcodeSuccess {
		t.Errorf("NS below the apex: %v (no delegation there)", m)
	}
}

// TestDNSServes: Go's own stub resolver, over UDP and TCP, resolves a
// sandbox's name through the server, and is told a name outside the zone
// is not found there.
func TestDNSServes(t *testing.T) {
	pc, ln := dnsSockets(t)
	d := testDNS()
	for i := range 100 { // more than fits 512 bytes: truncated over UDP, whole over TCP
		d.Records["many"] = append(d.Records["many"], netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}))
	}
	d.Serve(pc, ln)
	for _, network := range []string{"udp", "tcp"} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, asked, _ string) (net.Conn, error) {
			var d net.Dialer
			if network == "tcp" {
				asked = "tcp"
			}
			return d.DialContext(ctx, asked, pc.LocalAddr().String())
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		addrs, err := r.LookupHost(ctx, "49983-onc.sandbox.example")
		if err != nil || !slices.Equal(addrs, []string{"192.0.2.3"}) {
			t.Errorf("over %s: %v %v", network, addrs, err)
		}
		if addrs, err := r.LookupHost(ctx, "api.sandbox.example"); err != nil || len(addrs) != 2 {
			t.Errorf("over %s, api: %v %v", network, addrs, err)
		}
		if addrs, err := r.LookupHost(ctx, "many.sandbox.example"); err != nil || len(addrs) != 100 {
			t.Errorf("over %s, 100 addresses: %d %v", network, len(addrs), err)
		}
		if _, err := r.LookupHost(ctx, "www.sandbox.example"); !isNotFound(err) {
			t.Errorf("over %s, an unknown name: %v", network, err)
		}
		cancel()
	}
}

func isNotFound(err error) bool {
	de, ok := err.(*net.DNSError)
	return ok && de.IsNotFound
}

// dnsSockets are a UDP socket and a TCP listener on one loopback port,
// as a DNS server has them, closed at the test's end: a port whose TCP
// twin another process holds is let go and another tried.
func dnsSockets(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err != nil {
			pc.Close()
			continue
		}
		t.Cleanup(func() { pc.Close(); ln.Close() })
		return pc, ln
	}
	t.Fatal("no loopback port free over both UDP and TCP in 20 tries")
	return nil, nil
}

// TestSteerThroughDNS: the fleet's DNS on a node answers a sandbox that
// another node holds with that node's public address (its IngressInfo's,
// asked over the seam as the passthrough does), so a client goes there
// straight; and with this node's own when it cannot steer: a sandbox
// here, paused (its resume is asked from here), on a node that gives no
// public address, listens on another port, or speaks the other of TLS
// and plain HTTP, or not known yet.
func TestSteerThroughDNS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	other := fmt.Sprint(mustAtoi(t, port) + 1)
	ingressOf := map[string]nodeapi.IngressInfo{
		"b": {Address: "127.0.0.2:" + port, Public: "198.51.100.2"},
		"c": {Address: ":" + port, Public: "198.51.100.3"}, // every address: the seam's host
		"d": {Address: "127.0.0.4:" + port},
		"e": {Address: "127.0.0.5:" + other, Public: "198.51.100.5"},
		"f": {Address: "127.0.0.6:" + port, Public: "198.51.100.6", TLS: true},
	}
	table := NewTable()
	pt := &Passthrough{Self: "a", Domain: "sb.test", Table: table, Log: slog.New(slog.DiscardHandler),
		IngressOf: func(_ context.Context, peer, _ string) (nodeapi.IngressInfo, error) {
			if in, ok := ingressOf[peer]; ok {
				return in, nil
			}
			return nodeapi.IngressInfo{}, errdefs.New(errdefs.ErrNotFound, "no ingress")
		}}
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go srv.Serve(pt.Listen(ln))
	defer srv.Close()
	var set []nodeapi.Route
	for _, r := range []struct {
		id, node string
		paused   bool
	}{{"sbb", "b", false}, {"sbc", "c", false}, {"sba", "a", false}, {"sbp", "b", true}, {"sbd", "d", false}, {"sbe", "e", false}, {"sbf", "f", false}} {
		set = append(set, nodeapi.Route{ID: r.id, Node: r.node, Address: "127.0.0.9:7443", Generation: 1, AccessToken: "t", Paused: r.paused})
	}
	if err := table.Apply(nodeapi.Routes{Full: true, Version: 1, Set: set}); err != nil {
		t.Fatal(err)
	}
	pc, tl := dnsSockets(t)
	(&DNS{Zone: "sb.test", Self: netip.MustParseAddr("198.51.100.1"), Steer: pt.Steer}).Serve(pc, tl)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, pc.LocalAddr().String())
	}}
	for id, want := range map[string]string{"sbb": "198.51.100.2", "sbc": "198.51.100.3", "sba": "198.51.100.1", "sbp": "198.51.100.1",
		"sbd": "198.51.100.1", "sbe": "198.51.100.1", "sbf": "198.51.100.1", "sbnew": "198.51.100.1"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		addrs, err := r.LookupHost(ctx, "49983-"+id+".sb.test")
		cancel()
		if err != nil || len(addrs) != 1 || addrs[0] != want {
			t.Errorf("%s: %v %v, want %s", id, addrs, err, want)
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
