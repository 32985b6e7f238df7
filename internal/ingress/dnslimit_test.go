package ingress

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"sandstorm/internal/testenv"
)

// TestDNSLimitDecide: each client network has Rate answers a second of
// each kind, Burst at once; past it every Slip-th is slipped and the rest
// dropped; the allowance refills with time; other networks and other
// kinds are apart; a host of the same /24 (or /56) shares it.
func TestDNSLimitDecide(t *testing.T) {
	l := &DNSLimit{Rate: 2, Burst: 2, Slip: 2, Max: 100}
	t0 := time.Unix(1_000_000, 0)
	a := netip.MustParseAddr("198.51.100.7")
	var got []limitVerdict
	for range 6 {
		got = append(got, l.decide(a, "A x.", t0))
	}
	want := []limitVerdict{limitSend, limitSend, limitDrop, limitSlip, limitDrop, limitSlip}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("six at once at rate 2, burst 2, slip 2: %v, want %v", got, want)
		}
	}
	for _, c := range []struct {
		who  string
		kind string
		want limitVerdict
	}{
		{"198.51.100.200", "A x.", limitDrop},       // the same /24: the same allowance
		{"::ffff:198.51.100.9", "A x.", limitSlip},  // a mapped v4 address is that v4
		{"198.51.101.7", "A x.", limitSend},         // another /24
		{"198.51.100.7", "A y.", limitSend},         // another name
		{"198.51.100.7", "error", limitSend},        // errors: their own kind
		{"2001:db8:0:1::1", "A x.", limitSend},      // v6
		{"2001:db8:0:1:ffff::2", "A x.", limitSend}, // the same /56: the second of the burst
		{"2001:db8:0:1:ffff::3", "A x.", limitDrop}, // … and past it
		{"2001:db8:0:100::1", "A x.", limitSend},    // another /56
	} {
		if v := l.decide(netip.MustParseAddr(c.who), c.kind, t0); v != c.want {
			t.Errorf("%s %q: %v, want %v", c.who, c.kind, v, c.want)
		}
	}
	// Half a second gives one answer back; a long idle no more than Burst.
	if v := l.decide(a, "A x.", t0.Add(500*time.Millisecond)); v != limitSend {
		t.Errorf("after half a second at rate 2: %v, want sent", v)
	}
	if v := l.decide(a, "A x.", t0.Add(500*time.Millisecond)); v == limitSend {
		t.Error("the refilled answer was spent, and another went")
	}
	t1 := t0.Add(time.Hour)
	for i := range 3 {
		if v := l.decide(a, "A x.", t1); (v == limitSend) != (i < 2) {
			t.Errorf("answer %d after an hour idle: %v (burst 2)", i+1, v)
		}
	}
	for _, off := range []*DNSLimit{nil, {Rate: 0, Burst: 5}} {
		for range 10 {
			if v := off.decide(a, "A x.", t0); v != limitSend {
				t.Fatalf("limit %+v: %v, want every answer sent", off, v)
			}
		}
	}
	l = &DNSLimit{Rate: 1, Burst: 1, Slip: 1, Max: 10}
	if v := l.decide(a, "error", t0); v != limitSend {
		t.Error(v)
	}
	if v := l.decide(a, "error", t0); v != limitSlip {
		t.Errorf("slip 1: %v, want every answer over the rate slipped", v)
	}
	l.Slip = 0
	if v := l.decide(a, "error", t0); v != limitDrop {
		t.Errorf("slip 0: %v, want none slipped", v)
	}
}

// TestDNSLimitBounded: forged sources cannot grow the table past Max:
// new ones share one allowance, and allowances full again are forgotten
// (at most once a refill) to make room.
func TestDNSLimitBounded(t *testing.T) {
	l := &DNSLimit{Rate: 10, Burst: 10, Slip: 2, Max: 64}
	t0 := time.Unix(1_000_000, 0)
	sent := 0
	for i := range 10_000 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1})
		if l.decide(a, "error", t0) == limitSend {
			sent++
		}
	}
	if len(l.buckets) != 64 {
		t.Errorf("%d allowances kept, want Max (64)", len(l.buckets))
	}
	if sent != 64*1+10 { // one each for the 64 kept, a burst for the rest
		t.Errorf("%d answers of 10,000 from forged networks sent, want 74", sent)
	}
	// A second on, every kept allowance is full again: a new client gets
	// its own.
	b := netip.MustParseAddr("192.0.2.1")
	if l.decide(b, "error", t0.Add(time.Second)) != limitSend {
		t.Fatal("a new client after the table refilled: not sent")
	}
	if _, ok := l.buckets[limitKey{limitPrefix(b), "error"}]; !ok || len(l.buckets) != 1 {
		t.Errorf("after the sweep: %d allowances, the new client's kept %v", len(l.buckets), ok)
	}
}

// TestDNSLimitServes: over UDP a client past its allowance gets some
// answers truncated and empty, which sends it to TCP, and the rest
// nothing; over TCP it is answered whole however fast it asks.
func TestDNSLimitServes(t *testing.T) {
	pc, ln := dnsSockets(t)
	d := testDNS()
	// One answer back every 100 s: none within the test.
	d.Limit = &DNSLimit{Rate: 0.01, Burst: 3, Slip: 2, Max: 16}
	var mu sync.Mutex
	outcomes := map[string]int{}
	d.Counted = func(o string) { mu.Lock(); outcomes[o]++; mu.Unlock() }
	d.Serve(pc, ln)

	udp, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	const asked = 11
	for i := range asked {
		q := new(dns.Msg)
		q.SetQuestion("49983-onc.sandbox.example.", dns.TypeA)
		q.Id = uint16(100 + i)
		b, _ := q.Pack()
		if _, err := udp.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "11 questions decided", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return outcomes["sent"]+outcomes["slipped"]+outcomes["dropped"] == asked
	})
	mu.Lock()
	sent, slipped, dropped := outcomes["sent"], outcomes["slipped"], outcomes["dropped"]
	mu.Unlock()
	if sent != 3 || slipped != 4 || dropped != 4 {
		t.Fatalf("11 at once, burst 3, slip 2: sent %d, slipped %d, dropped %d; want 3, 4, 4", sent, slipped, dropped)
	}
	full, truncated := 0, 0
	buf := make([]byte, 1500)
	udp.SetReadDeadline(time.Now().Add(10 * time.Second))
	for range sent + slipped {
		n, err := udp.Read(buf)
		if err != nil {
			t.Fatalf("after %d full and %d truncated answers: %v", full, truncated, err)
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:n]); err != nil {
			t.Fatal(err)
		}
		switch {
		case m.Truncated && len(m.Answer) == 0 && len(m.Ns) == 0:
			truncated++
		case !m.Truncated && len(m.Answer) == 1:
			full++
		default:
			t.Errorf("an answer neither whole nor slipped: %v", m)
		}
	}
	if full != sent || truncated != slipped {
		t.Errorf("answers came whole %d, truncated %d; the server counted %d sent, %d slipped", full, truncated, sent, slipped)
	}
	// TCP is never limited: the same question, many times.
	c := &dns.Client{Net: "tcp", Timeout: 10 * time.Second}
	for range 10 {
		q := new(dns.Msg)
		q.SetQuestion("49983-onc.sandbox.example.", dns.TypeA)
		m, _, err := c.Exchange(q, pc.LocalAddr().String())
		if err != nil || len(m.Answer) != 1 {
			t.Fatalf("over TCP while UDP is limited: %v %v", m, err)
		}
	}
}
