package boundary

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"sandstorm/api"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/testenv"
)

// A sandbox's own egress rules narrow what the policy allows, and never
// widen it: denyOut all leaves only what allowOut names; a name allowOut
// lists that the policy does not allow stays refused; SetEgress applies
// to the next flow at once.
func TestEgressRulesNarrow(t *testing.T) {
	ln, accepted := echoServer(t, "127.0.0.1:0")
	port := portOf(t, ln)
	rules := func(allow, deny []string) *egress.Rules {
		r, err := egress.Parse(allow, deny)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) {
		// allowed.test and example.com both resolve to 198.51.100.1 (the
		// echo server); only the name tells them apart.
		c.Egress = rules([]string{"allowed.test", "not-in-policy.test"}, []string{egress.AllTraffic})
	})
	for _, c := range []struct {
		host string
		want byte
	}{
		{"allowed.test", 0},                     // listed by name
		{"example.com", socksNotAllowed},        // the policy allows it, the rule does not
		{"198.51.100.1", socksNotAllowed},       // the same address by literal: not by name
		{"not-in-policy.test", socksNotAllowed}, // the rule lists it, the policy does not
	} {
		if rep := e.rawSOCKS(t, c.host, port); rep != c.want {
			t.Errorf("%s with denyOut all, allowOut allowed.test: reply %#x, want %#x", c.host, rep, c.want)
		}
	}
	// Refused by name alone: never looked up (egress.DeniesName).
	e.rec.mu.Lock()
	resolved := slices.Clone(e.rec.resolved)
	e.rec.mu.Unlock()
	if slices.Contains(resolved, "example.com") {
		t.Errorf("example.com, which only allow_out's names could reach, was looked up: %v", resolved)
	}
	// An address in allowOut: that address, by any name the policy allows.
	e.b.SetEgress(rules([]string{"198.51.100.1/32"}, []string{egress.AllTraffic}))
	if rep := e.rawSOCKS(t, "example.com", port); rep != 0 {
		t.Errorf("example.com at an allowed address: reply %#x", rep)
	}
	// denyOut of that range only.
	e.b.SetEgress(rules(nil, []string{"198.51.100.0/24"}))
	if rep := e.rawSOCKS(t, "allowed.test", port); rep != socksNotAllowed {
		t.Errorf("allowed.test inside a denied range: reply %#x", rep)
	}
	// No rules: the policy alone again.
	e.b.SetEgress(nil)
	if rep := e.rawSOCKS(t, "example.com", port); rep != 0 {
		t.Errorf("example.com with no rules: reply %#x", rep)
	}
	testenv.WaitFor(t, 10*time.Second, "the allowed flows accepted", func() bool { return accepted.Load() >= 3 })
	if got := accepted.Load(); got != 3 {
		t.Errorf("the server accepted %d flows, want 3 (the allowed ones)", got)
	}
}

// With deny_out all and only names in allow_out, the boundary's DNS
// answers a name the policy grants but allow_out lacks NXDOMAIN, as one
// the policy lacks (the rules only narrow), logged with the rule, and
// makes no lookup of it.
func TestEgressRulesRefuseNamesAtDNS(t *testing.T) {
	var mu sync.Mutex
	var flows []api.EgressFlow
	rules, err := egress.Parse([]string{"allowed.test"}, []string{egress.AllTraffic})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.10"), func(c *Config) {
		c.Egress = rules
		c.Flows = func(f api.EgressFlow) { mu.Lock(); flows = append(flows, f); mu.Unlock() }
	})
	srv := "127.77.0.10:53"
	if r := dnsQuery(t, "udp", srv, "example.com.", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("example.com (granted, not in allow_out): %v, want NXDOMAIN", r)
	}
	if r := dnsQuery(t, "udp", srv, "allowed.test.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("allowed.test: %v", r)
	}
	// Rules lifted: the policy alone answers again.
	e.b.SetEgress(nil)
	if r := dnsQuery(t, "udp", srv, "example.com.", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("example.com with no rules: %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(flows) != 1 || flows[0].Name != "example.com" || flows[0].Route != api.EgressRouteDNS || !strings.Contains(flows[0].Rule, "allow_out") {
		t.Errorf("egress log %+v, want example.com's refusal by the rules", flows)
	}
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	if len(e.rec.resolved) != 0 {
		t.Errorf("the DNS looked names up: %v", e.rec.resolved)
	}
}

// A name the DNS refuses is handed to the egress log, with the reason, for
// each query (the log keeps one of a lookup's several: egresslog); a
// granted name's answer is not a flow and is not listed.
func TestEgressLogsRefusedNames(t *testing.T) {
	var mu sync.Mutex
	var flows []api.EgressFlow
	newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.9"), func(c *Config) {
		c.Flows = func(f api.EgressFlow) { mu.Lock(); flows = append(flows, f); mu.Unlock() }
	})
	srv := "127.77.0.9:53"
	for _, q := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeA} {
		if r := dnsQuery(t, "udp", srv, "Nowhere.Test.", q); r.Rcode != dns.RcodeNameError {
			t.Fatalf("nowhere.test: %v", r)
		}
	}
	if r := dnsQuery(t, "udp", srv, "allowed.test.", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("allowed.test: %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(flows) != 3 {
		t.Fatalf("egress log %+v, want an entry for each query of nowhere.test", flows)
	}
	for _, f := range flows {
		if f.Name != "nowhere.test" || f.Route != api.EgressRouteDNS || f.Outcome != "denied" || f.Rule == "" || f.Port != 0 {
			t.Errorf("entry %+v", f)
		}
	}
}
