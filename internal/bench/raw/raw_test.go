package raw

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sandstorm/api"
)

func TestPickSubnet(t *testing.T) {
	cands := candidates()
	if len(cands) != 8 || cands[0].String() != "10.180.0.0/16" || cands[7].String() != "10.187.0.0/16" {
		t.Fatalf("candidates %v", cands)
	}
	nodeDefault := netip.MustParsePrefix("10.219.0.0/16")
	for _, c := range cands {
		if c.Overlaps(nodeDefault) || !c.Addr().IsPrivate() {
			t.Errorf("candidate %s: overlaps the node's default subnet, or is not private", c)
		}
	}
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	got, err := pickSubnet(cands, []netip.Prefix{p("127.0.0.0/8"), p("192.0.2.0/24"), p("10.253.0.0/30")})
	if err != nil || got != p("10.180.0.0/16") {
		t.Errorf("nothing in the way: %v, %v", got, err)
	}
	// An address inside the first candidate, and a wider route over the
	// second and third, push it to the fourth.
	got, err = pickSubnet(cands, []netip.Prefix{p("10.180.3.1/32"), p("10.181.0.0/15"), p("10.182.0.0/16")})
	if err != nil || got != p("10.183.0.0/16") {
		t.Errorf("first three taken: %v, %v", got, err)
	}
	if _, err := pickSubnet(cands, []netip.Prefix{p("10.0.0.0/8")}); err == nil {
		t.Error("a route over all of 10/8: no error")
	}
}

// TestNames keeps the raw sandboxes' kernel and runsc names within their
// limits, for a run ID as bench/tiers makes them (6 hex digits; its
// TestRunID keeps it so): an interface name of 15 bytes, a container ID
// of 32 (gvisor's maxIDLen) and a --root short enough for runsc's control
// socket.
func TestNames(t *testing.T) {
	id := "ffffff"
	nw := netFor(id)
	if len(nw.HostIf) > 15 || strings.HasPrefix(nw.HostIf, "ssv") {
		t.Errorf("veth %q: longer than 15 bytes, or named like the node's (ssv*), whose firewall resets host connections", nw.HostIf)
	}
	cid := "raw-" + id + "-app64-1000"
	if len(cid) > 32 {
		t.Errorf("container ID %q longer than 32", cid)
	}
	if r := root("/tmp/ssraw-4294967295"); len(r) >= 60 {
		t.Errorf("root %q is %d bytes", r, len(r))
	}
}

func TestTemplate(t *testing.T) {
	a := api.Template{Name: "web", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}, Env: []string{"X=1"}, Cwd: "/srv"}, Ports: []int{8000}, MemoryMiB: 128}
	s := Template(a)
	if s.Name != "web" || s.Rootfs != "/r" || !slices.Equal(s.Process.Args, a.Process.Args) || s.Process.Cwd != "/srv" ||
		!slices.Equal(s.Process.Env, a.Process.Env) || s.MemoryMiB != 128 || !slices.Equal(s.Ports, a.Ports) {
		t.Errorf("Template = %+v", s)
	}
}

func TestURL(t *testing.T) {
	e := &Env{}
	e.net.Sandbox = netip.MustParsePrefix("10.180.0.2/30")
	if got := e.URL(8000); got != "http://10.180.0.2:8000/" {
		t.Errorf("URL = %q", got)
	}
	if got := e.Addr(); got != netip.MustParseAddr("10.180.0.2") {
		t.Errorf("Addr = %s", got)
	}
}
