package ingress

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
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

// TestDNSServes: Go's own stub resolver, over UDP and TCP, resolves a
// sandbox's name through the server, and is told a name outside the zone
// is not found there.
func TestDNSServes(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Skipf("the UDP port's TCP twin is taken: %v", err)
	}
	defer pc.Close()
	defer ln.Close()
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
