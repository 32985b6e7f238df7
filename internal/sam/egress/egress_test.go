package egress

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ allow, deny []string }{
		{allow: []string{"api.*.com"}},
		{allow: []string{"example.com."}},
		{allow: []string{"example.com:443"}},
		{allow: []string{"https://example.com"}},
		{allow: []string{"10.0.0.0/33"}},
		{allow: []string{""}},
		{deny: []string{"example.com"}},
		{deny: []string{"fe80::1%eth0"}},
		{allow: make([]string, MaxEntries+1)},
	} {
		if _, err := Parse(c.allow, c.deny); err == nil {
			t.Errorf("Parse(%q, %q): no error", c.allow, c.deny)
		}
	}
}

func TestCheck(t *testing.T) {
	a := netip.MustParseAddr
	// No denyOut: allowOut alone narrows nothing.
	r, err := Parse([]string{"api.example.com"}, nil)
	if err != nil || !r.Empty() || r.Check(a("203.0.113.9"), false) != nil {
		t.Fatalf("allowOut alone: %v %v", r, err)
	}
	// Deny everything but a name, a domain's names, an address and a CIDR.
	r, err = Parse([]string{"API.example.com", "*.pypi.org", "198.51.100.7", "192.0.2.0/24"}, []string{AllTraffic})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"api.example.com": true, "API.EXAMPLE.COM.": true, "files.pypi.org": true, "a.b.pypi.org": true,
		"pypi.org": false, "example.com": false, "evilpypi.org": false, "api.example.com.evil": false,
	} {
		if got := r.AllowsName(host); got != want {
			t.Errorf("AllowsName(%q) = %v, want %v", host, got, want)
		}
	}
	for addr, ok := range map[string]bool{
		"198.51.100.7": true, "192.0.2.200": true, "::ffff:192.0.2.1": true,
		"198.51.100.8": false, "203.0.113.1": false, "2001:db8::1": false, // ALL_TRAFFIC covers IPv6 too
	} {
		err := r.Check(a(addr), false)
		var ref *Refusal
		if ok != (err == nil) || (!ok && !errors.As(err, &ref)) {
			t.Errorf("Check(%s) = %v, want allowed %v", addr, err, ok)
		}
	}
	// A flow whose name allowOut lists goes out at any address.
	if err := r.Check(a("203.0.113.1"), true); err != nil {
		t.Errorf("a flow by an allowed name: %v", err)
	}
	// denyOut of one range leaves the rest.
	r, _ = Parse(nil, []string{"203.0.113.0/24"})
	if r.Check(a("203.0.113.5"), false) == nil || r.Check(a("198.51.100.1"), false) != nil {
		t.Error("denyOut of one range")
	}
	// nil denies nothing.
	var none *Rules
	if none.Check(a("203.0.113.5"), false) != nil || none.AllowsName("x") || !none.Empty() {
		t.Error("nil rules")
	}
}

// DeniesName refuses a name before any lookup only when nothing but
// allow_out's names can go out: deny_out covering both families and no
// address or CIDR in allow_out.
func TestDeniesName(t *testing.T) {
	for _, c := range []struct {
		allow, deny []string
		host        string
		refused     bool
	}{
		{[]string{"api.test"}, []string{AllTraffic}, "other.test", true},
		{[]string{"api.test"}, []string{AllTraffic}, "API.test.", false},                  // listed, any case, trailing dot
		{[]string{"*.api.test"}, []string{AllTraffic}, "x.api.test", false},               // below a wildcard
		{[]string{"api.test", "192.0.2.0/24"}, []string{AllTraffic}, "other.test", false}, // it may resolve into the allowed range
		{[]string{"api.test"}, []string{"0.0.0.0/0"}, "other.test", true},                 // 0.0.0.0/0 is both families (E2B's ALL_TRAFFIC)
		{[]string{"api.test"}, []string{"0.0.0.0/1", "128.0.0.0/1"}, "other.test", false}, // IPv6 not denied
		{[]string{"api.test"}, []string{"10.0.0.0/8"}, "other.test", false},
		{nil, nil, "other.test", false},
	} {
		r, err := Parse(c.allow, c.deny)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.DeniesName(c.host) != nil; got != c.refused {
			t.Errorf("allow %v deny %v: %s refused %v, want %v", c.allow, c.deny, c.host, got, c.refused)
		}
	}
	var none *Rules
	if none.DeniesName("x.test") != nil {
		t.Error("no rules refused a name")
	}
}
