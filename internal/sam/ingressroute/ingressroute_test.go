package ingressroute

import "testing"

// TestLocal: a listener on every address is dialled on loopback, of its
// family; one on an address, there.
func TestLocal(t *testing.T) {
	for in, want := range map[string]string{
		":8443":          "127.0.0.1:8443",
		"0.0.0.0:8443":   "127.0.0.1:8443",
		"[::]:8443":      "[::1]:8443",
		"10.0.0.5:443":   "10.0.0.5:443",
		"127.0.0.1:9000": "127.0.0.1:9000",
	} {
		got, err := Local(in)
		if err != nil || got.String() != want {
			t.Errorf("Local(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	if got, err := Local("localhost:8443"); err != nil || !got.Addr().IsLoopback() || got.Port() != 8443 {
		t.Errorf("Local(localhost:8443) = %v, %v; want loopback", got, err)
	}
	for _, bad := range []string{"8443", "", "no-such-host.invalid:8443"} {
		if _, err := Local(bad); err == nil {
			t.Errorf("Local(%q): no error", bad)
		}
	}
}

// TestMatch: the names of sandboxes' ports under the domain, on the
// route's ports; a nil route matches nothing.
func TestMatch(t *testing.T) {
	r := &Route{Domain: "sb.test", Ports: []uint16{443, 8443}}
	for host, want := range map[string]bool{
		"8080-abc.sb.test":     true,
		"api.sb.test":          false,
		"x-abc.sb.test":        false,
		"8080-abc.sb.test.com": false,
		"a.8080-abc.sb.test":   false,
		"8080-abc.other.test":  false,
	} {
		if got := r.Match(host, 8443); got != want {
			t.Errorf("Match(%q) = %v", host, got)
		}
	}
	if r.Match("8080-abc.sb.test", 80) {
		t.Error("matched on a port the route does not serve")
	}
	if (*Route)(nil).Match("8080-abc.sb.test", 443) {
		t.Error("a nil route matched")
	}
}
