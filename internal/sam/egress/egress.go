// Package egress is one sandbox's own egress rules (E2B's network
// allowOut, denyOut and allowInternetAccess), which its boundary applies
// on top of the operator's policy. They can only narrow it: a flow goes
// out if the policy allows its name and the address passes the dial guard
// (internal/sam/policy, internal/sam/dialguard) *and* these rules let it;
// nothing here lets through what they refuse. The decision is pure, as
// the policy's is, so it is tested apart from the boundary's I/O.
//
// The rules read as E2B documents them (js-sdk SandboxNetworkOpts):
// denyOut lists CIDRs (or single addresses) whose traffic is dropped;
// allowOut lists names ("api.example.com", "*.example.com"), addresses and
// CIDRs that go out even so — allow wins over deny. With no denyOut
// everything the policy allows goes out (allowOut alone narrows nothing).
// allowInternetAccess false is denyOut ["0.0.0.0/0"]. "0.0.0.0/0" (E2B's
// ALL_TRAFFIC) denies IPv6 too: a sandbox told "nothing out" must not get
// out by the other family.
package egress

import (
	"fmt"
	"net/netip"
	"strings"
)

// AllTraffic is E2B's ALL_TRAFFIC.
const AllTraffic = "0.0.0.0/0"

// MaxEntries bounds each list: rules are checked on every dial.
const MaxEntries = 256

// Rules are parsed egress rules. The zero value and nil deny nothing.
type Rules struct {
	names []string // exact names and "*.domain" patterns, lower case
	allow []netip.Prefix
	deny  []netip.Prefix
}

// Parse reads allowOut and denyOut entries; a malformed one is an error
// naming it.
func Parse(allowOut, denyOut []string) (*Rules, error) {
	if len(allowOut) > MaxEntries || len(denyOut) > MaxEntries {
		return nil, fmt.Errorf("at most %d entries in allow_out and in deny_out", MaxEntries)
	}
	r := &Rules{}
	for _, e := range allowOut {
		if p, ok, err := prefix(e); err != nil {
			return nil, fmt.Errorf("allow_out %q: %w", e, err)
		} else if ok {
			r.allow = append(r.allow, p...)
			continue
		}
		n, err := name(e)
		if err != nil {
			return nil, fmt.Errorf("allow_out %q: %w", e, err)
		}
		r.names = append(r.names, n)
	}
	for _, e := range denyOut {
		p, ok, err := prefix(e)
		if err == nil && !ok {
			err = fmt.Errorf("takes addresses and CIDRs only (a name is matched by allow_out)")
		}
		if err != nil {
			return nil, fmt.Errorf("deny_out %q: %w", e, err)
		}
		r.deny = append(r.deny, p...)
	}
	return r, nil
}

// AllowAlone is the refusal of allow_out without deny_out, which makes
// exceptions to nothing. E2B accepts it and changes nothing (its API is
// served as it is); this product's own API and CLI refuse it, so that a
// user who meant "only these" learns so at once.
func AllowAlone(allowOut, denyOut []string) error {
	if len(allowOut) > 0 && len(denyOut) == 0 {
		return fmt.Errorf(`allow_out makes exceptions to deny_out and does nothing alone; add deny_out ["0.0.0.0/0"] to let out only what allow_out names`)
	}
	return nil
}

// prefix reads an address or CIDR; ok is false for what is neither (a
// name). AllTraffic stands for both families.
func prefix(e string) (p []netip.Prefix, ok bool, err error) {
	e = strings.TrimSpace(e)
	if e == AllTraffic || e == "::/0" {
		return []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}, true, nil
	}
	if strings.Contains(e, "://") {
		return nil, false, fmt.Errorf("a URL: give the host name alone (no scheme, path or port)")
	}
	if strings.Contains(e, "/") {
		pp, err := netip.ParsePrefix(e)
		if err != nil {
			// netip's own message names its function: say what is wanted.
			return nil, false, fmt.Errorf("not a CIDR (an address, a slash and its prefix length: 10.0.0.0/8, fd00::/8)")
		}
		return []netip.Prefix{pp.Masked()}, true, nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if a.Zone() != "" {
			return nil, false, fmt.Errorf("an address with a zone")
		}
		a = a.Unmap()
		return []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}, true, nil
	}
	return nil, false, nil
}

// name reads a host name or "*.domain": DNS labels only, no port, no
// trailing dot, no inner wildcard.
func name(e string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(e))
	host := strings.TrimPrefix(n, "*.")
	if host == "" || len(host) > 253 || strings.HasSuffix(host, ".") {
		return "", fmt.Errorf("not an address, CIDR or host name")
	}
	for _, l := range strings.Split(host, ".") {
		if !validLabel(l) {
			return "", fmt.Errorf("not an address, CIDR or host name (label %q)", l)
		}
	}
	return n, nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, c := range l {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Names are the names allowOut lists ("*.domain" patterns as written):
// what a create checks against the policy, so that a team learns at once
// that a name its policy lacks will never go out.
func (r *Rules) Names() []string {
	if r == nil {
		return nil
	}
	return append([]string(nil), r.names...)
}

// Empty reports whether r narrows nothing.
func (r *Rules) Empty() bool { return r == nil || len(r.deny) == 0 }

// AllowsName reports whether allowOut names host (exactly, or below a
// "*.domain"): such a flow goes out whatever its address (the policy and
// the dial guard still judge it).
func (r *Rules) AllowsName(host string) bool {
	if r == nil {
		return false
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	for _, n := range r.names {
		if d, ok := strings.CutPrefix(n, "*."); ok {
			if strings.HasSuffix(h, "."+d) {
				return true
			}
		} else if h == n {
			return true
		}
	}
	return false
}

// DeniesName is the refusal of host by name alone, before it is looked
// up: when deny_out covers every address of both families and allow_out
// lists no address or CIDR, only allow_out's names can go out, so a name
// it does not list cannot, whatever it resolves to. Decided here, no
// query for it leaves the boundary: a sandbox so confined cannot use the
// lookups of names it may not reach as a channel out (their zones'
// servers would see them). nil when the name may yet go out.
func (r *Rules) DeniesName(host string) error {
	if r.Empty() || len(r.allow) > 0 || !r.deniesAll() || r.AllowsName(host) {
		return nil
	}
	return &NameRefusal{Host: host}
}

// deniesAll reports whether deny_out covers every IPv4 and IPv6 address.
func (r *Rules) deniesAll() bool {
	v4, v6 := false, false
	for _, p := range r.deny {
		if p.Bits() == 0 {
			v4, v6 = v4 || p.Addr().Is4(), v6 || p.Addr().Is6()
		}
	}
	return v4 && v6
}

// NameRefusal is a name the rules refused before any lookup (DeniesName).
type NameRefusal struct{ Host string }

func (e *NameRefusal) Error() string {
	return fmt.Sprintf("%s: not in this sandbox's allow_out, and its deny_out denies every address", e.Host)
}

// Refusal is a dial the rules refused.
type Refusal struct {
	Addr netip.Addr
	Rule string // the denyOut entry that matched
}

func (e *Refusal) Error() string {
	return fmt.Sprintf("address %s: denied by this sandbox's egress rule deny_out %s", e.Addr, e.Rule)
}

// Check decides one address about to be dialled for a flow whose name
// allowOut did (byName) or did not list: nil to go out, a *Refusal if a
// denyOut entry covers it and no allowOut entry does.
func (r *Rules) Check(a netip.Addr, byName bool) error {
	if r.Empty() || byName {
		return nil
	}
	a = a.Unmap()
	for _, p := range r.allow {
		if p.Contains(a) {
			return nil
		}
	}
	for _, p := range r.deny {
		if p.Contains(a) {
			return &Refusal{Addr: a, Rule: p.String()}
		}
	}
	return nil
}
