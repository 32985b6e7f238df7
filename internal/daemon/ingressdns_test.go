package daemon

import (
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestIngressDNSPlan: the DNS flags' checks, and the public address each
// case gives.
func TestIngressDNSPlan(t *testing.T) {
	base := Options{IngressListen: "10.0.0.5:8443", HostDomain: "sb.example"}
	for _, c := range []struct {
		name   string
		mod    func(*Options)
		public string
		err    string
	}{
		{"nothing asked", func(*Options) {}, "", ""},
		{"dns on the listener's host", func(o *Options) { o.IngressDNS = ":53" }, "10.0.0.5", ""},
		{"public given", func(o *Options) { o.IngressPublic = "203.0.113.5" }, "203.0.113.5", ""},
		{"public over the listener's", func(o *Options) { o.IngressDNS = ":53"; o.IngressPublic = "::ffff:203.0.113.5" }, "203.0.113.5", ""},
		{"every address, no public", func(o *Options) { o.IngressListen = ":8443"; o.IngressDNS = ":53" }, "", "give --ingress-public"},
		{"every address, public", func(o *Options) { o.IngressListen = ":8443"; o.IngressDNS = ":53"; o.IngressPublic = "203.0.113.5" }, "203.0.113.5", ""},
		{"public not an address", func(o *Options) { o.IngressPublic = "node-a.example" }, "", "give the IP address"},
		{"public unspecified", func(o *Options) { o.IngressPublic = "0.0.0.0" }, "", "give the IP address"},
		{"no ingress", func(o *Options) { o.IngressListen = ""; o.IngressDNS = ":53" }, "", "give --ingress-listen"},
		{"requests only", func(o *Options) { o.IngressDNS = ":53"; o.IngressRequests = true }, "", "--ingress-requests-only"},
		{"records without dns", func(o *Options) { o.IngressDNSRecords = []string{"api=192.0.2.9"} }, "", "need --ingress-dns"},
		{"dns not host:port", func(o *Options) { o.IngressDNS = "53" }, "", "want HOST:PORT"},
		{"record not name=ip", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSRecords = []string{"api"} }, "", "want NAME=IP"},
		{"record of a bad name", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSRecords = []string{"a b=192.0.2.9"} }, "", "NAME is a name under"},
		{"rate negative", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSRate = -1 }, "", "--ingress-dns-rate -1"},
		{"rate not a number", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSRate = math.NaN() }, "", "--ingress-dns-rate NaN"},
		{"rate off", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSRate = 0 }, "10.0.0.5", ""},
		{"ns without dns", func(o *Options) { o.IngressDNSNS = []string{"ns.other.example"} }, "", "need --ingress-dns"},
		{"ns elsewhere", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSNS = []string{"ns.other.example."} }, "10.0.0.5", ""},
		{"ns inside with its address", func(o *Options) {
			o.IngressDNS, o.IngressDNSNS, o.IngressDNSRecords = ":53", []string{"ns1", "NS2.sb.example"}, []string{"ns1=192.0.2.53", "ns2=192.0.2.54"}
		}, "10.0.0.5", ""},
		{"ns inside without", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSNS = []string{"ns1"} }, "", "--ingress-dns-record ns1=IP"},
		{"ns the apex without", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSNS = []string{"sb.example"} }, "", "--ingress-dns-record @=IP"},
		{"ns the apex with", func(o *Options) {
			o.IngressDNS, o.IngressDNSNS, o.IngressDNSRecords = ":53", []string{"sb.example."}, []string{"@=192.0.2.1"}
		}, "10.0.0.5", ""},
		{"ns not a name", func(o *Options) { o.IngressDNS = ":53"; o.IngressDNSNS = []string{"ns 1.example"} }, "", "want a host name"},
	} {
		o := base
		c.mod(&o)
		p, err := ingressDNSPlan(o)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.err)
			continue
		}
		if err == nil && p.public != c.public {
			t.Errorf("%s: public %q, want %q", c.name, p.public, c.public)
		}
		if c.name == "ns inside with its address" && !slices.Equal(p.ns, []string{"ns1.sb.example", "ns2.sb.example"}) {
			t.Errorf("%s: %v", c.name, p.ns)
		}
	}
	recs, err := parseDNSRecords([]string{"API=192.0.2.9", "api.sb.example.=2001:db8::9", "@=192.0.2.1", "x.y=192.0.2.2"}, "sb.example")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]netip.Addr{
		"api": {netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("2001:db8::9")},
		"":    {netip.MustParseAddr("192.0.2.1")},
		"x.y": {netip.MustParseAddr("192.0.2.2")},
	}
	for k, v := range want {
		if !slices.Equal(recs[k], v) {
			t.Errorf("records[%q] = %v, want %v", k, recs[k], v)
		}
	}
}
