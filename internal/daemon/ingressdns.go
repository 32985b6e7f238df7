package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strings"

	"sandstorm/internal/ingress"
	"sandstorm/internal/metrics"
)

// dnsPlan is what --ingress-public, --ingress-dns and
// --ingress-dns-record ask of a node's ingress.
type dnsPlan struct {
	public  string // the address its peers give for its sandboxes ("": none)
	self    netip.Addr
	records map[string][]netip.Addr
	ns      []string // --ingress-dns-ns, full names
}

// ingressDNSPlan checks the ingress's DNS flags. The node's public
// address is --ingress-public, else, for --ingress-dns, --ingress-listen's
// host when that is one address: what the DNS answers for the names this
// node serves, and what its peers' DNS answer for its sandboxes.
func ingressDNSPlan(o Options) (dnsPlan, error) {
	var p dnsPlan
	if o.IngressDNS == "" && o.IngressPublic == "" && len(o.IngressDNSRecords)+len(o.IngressDNSNS) == 0 {
		return p, nil
	}
	switch {
	case o.IngressListen == "":
		return p, errors.New("--ingress-dns, --ingress-public and --ingress-dns-record are a node's ingress's: give --ingress-listen too")
	case o.IngressRequests:
		return p, errors.New("--ingress-dns and --ingress-public steer clients to the holder's own ingress, which --ingress-requests-only turns off")
	case o.IngressDNS == "" && len(o.IngressDNSRecords)+len(o.IngressDNSNS) > 0:
		return p, errors.New("--ingress-dns-record and --ingress-dns-ns need --ingress-dns ADDR (where the DNS answers)")
	case o.IngressDNSRate < 0 || math.IsNaN(o.IngressDNSRate) || math.IsInf(o.IngressDNSRate, 0):
		return p, fmt.Errorf("--ingress-dns-rate %v: give answers a second, 0 for no limit", o.IngressDNSRate)
	}
	if o.IngressPublic != "" {
		a, err := netip.ParseAddr(o.IngressPublic)
		if err != nil || a.IsUnspecified() {
			return p, fmt.Errorf("--ingress-public %q: give the IP address clients reach this node's ingress at", o.IngressPublic)
		}
		p.self = a.Unmap()
	} else if host, _, err := net.SplitHostPort(o.IngressListen); err == nil {
		if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() {
			p.self = a.Unmap()
		}
	}
	if o.IngressDNS != "" && !p.self.IsValid() {
		return p, fmt.Errorf("--ingress-dns answers with this node's public address, and --ingress-listen %s is every address: give --ingress-public IP", o.IngressListen)
	}
	if p.self.IsValid() {
		p.public = p.self.String()
	}
	if o.IngressDNS != "" {
		if _, _, err := net.SplitHostPort(o.IngressDNS); err != nil {
			return p, fmt.Errorf("--ingress-dns %q: want HOST:PORT (UDP and TCP), e.g. :53", o.IngressDNS)
		}
	}
	recs, err := parseDNSRecords(o.IngressDNSRecords, o.HostDomain)
	if err != nil {
		return p, err
	}
	p.records = recs
	p.ns, err = parseDNSNS(o.IngressDNSNS, o.HostDomain, recs)
	return p, err
}

// parseDNSNS reads --ingress-dns-ns NAME: a host name, or a label under
// the domain ("ns1"). One under the domain must have its address in
// recs (--ingress-dns-record ns1=IP): a resolver that is told to ask
// ns1.<domain> for <domain> can only learn where it is from the glue and
// from it.
func parseDNSNS(flags []string, domain string, recs map[string][]netip.Addr) ([]string, error) {
	var out []string
	for _, f := range flags {
		name := strings.ToLower(strings.TrimSuffix(f, "."))
		if !strings.Contains(name, ".") {
			name += "." + domain
		}
		if !validLabels(name) {
			return nil, fmt.Errorf("--ingress-dns-ns %q: want a host name, e.g. ns1.%s or ns1 for it", f, domain)
		}
		label, under := strings.CutSuffix(name, "."+domain)
		if name == domain {
			label, under = "", true
		}
		if under && len(recs[label]) == 0 {
			flag := label
			if flag == "" {
				flag = "@"
			}
			return nil, fmt.Errorf("--ingress-dns-ns %s is in %s: give its address too, --ingress-dns-record %s=IP (the parent's glue)", name, domain, flag)
		}
		out = append(out, name)
	}
	return out, nil
}

// parseDNSRecords reads --ingress-dns-record NAME=IP: NAME a label under
// the domain ("api", which E2B's SDK calls; "@" the domain itself), one
// flag per address.
func parseDNSRecords(flags []string, domain string) (map[string][]netip.Addr, error) {
	recs := map[string][]netip.Addr{}
	for _, f := range flags {
		name, ip, ok := strings.Cut(f, "=")
		a, err := netip.ParseAddr(ip)
		if !ok || err != nil || a.IsUnspecified() {
			return nil, fmt.Errorf("--ingress-dns-record %q: want NAME=IP, e.g. api=203.0.113.10", f)
		}
		name = strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(name, "."), "."+domain))
		if name == "@" {
			name = ""
		}
		if name != "" && !validLabels(name) {
			return nil, fmt.Errorf("--ingress-dns-record %q: NAME is a name under %s (\"api\"; \"@\" for %s itself)", f, domain, domain)
		}
		recs[name] = append(recs[name], a.Unmap())
	}
	return recs, nil
}

// validLabels: name is dot-separated labels of letters, digits and '-'.
func validLabels(name string) bool {
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > 63 || strings.Trim(l, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return false
		}
	}
	return true
}

// startIngressDNS answers the fleet's zone on --ingress-dns (UDP and
// TCP on one port), if set (ingress.DNS), for as long as the process
// runs; a reload hands both sockets on.
func startIngressDNS(o Options, plan dnsPlan, pt *ingress.Passthrough, table *ingress.Table, m *metrics.Ingress, log *slog.Logger) error {
	if o.IngressDNS == "" {
		return nil
	}
	pc, err := o.reg.ListenPacket("udp", o.IngressDNS, nil)
	if err != nil {
		return fmt.Errorf("--ingress-dns: %w", err)
	}
	// The same port over TCP (a truncated answer's retry, RFC 7766).
	ln, err := o.reg.Listen("tcp", pc.LocalAddr().String(), nil)
	if err != nil {
		pc.Close()
		return fmt.Errorf("--ingress-dns (TCP): %w", err)
	}
	d := &ingress.DNS{Zone: o.HostDomain, Self: plan.self, Records: plan.records, NS: plan.ns, Steer: pt.Steer, Log: log,
		Serial:  func() uint32 { v, _ := table.Stat(); return uint32(v) },
		Counted: m.DNSAnswer, Limit: dnsLimit(o.IngressDNSRate)}
	d.Serve(pc, ln)
	log.Info("sandstormd node answering the fleet's DNS", "dns", pc.LocalAddr().String(), "zone", o.HostDomain, "self", plan.self, "rate_limit", o.IngressDNSRate)
	return nil
}

// dnsLimit is --ingress-dns-rate's limit: a burst of two seconds' worth
// (at least one), every second answer over it slipped (BIND's default
// slip), and at most 1<<16 allowances (a name is at most 255 bytes: 25
// MB at worst), past which new clients share one.
func dnsLimit(rate float64) *ingress.DNSLimit {
	if rate <= 0 {
		return nil
	}
	return &ingress.DNSLimit{Rate: rate, Burst: max(2*rate, 1), Slip: 2, Max: 1 << 16}
}
