package host

import (
	"path/filepath"
	"testing"

	"sandstorm/internal/netns"
	"sandstorm/internal/store"
)

// TestNamesAndLimits: a sandbox's kernel objects fit an interface name,
// its network is its slot's in the pool, and its memory limit is its
// own, else its template's, else the node's.
func TestNamesAndLimits(t *testing.T) {
	pool, err := netns.ParsePool("10.77.0.0/24")
	if err != nil {
		t.Fatal(err)
	}
	h := New(Config{DataDir: "/data", Pool: pool, DefaultMemoryMiB: 1024})
	nw, err := h.Net("0123456789ab", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(nw.HostIf) > 15 || nw.Name != NetnsPrefix+"0123456789ab" {
		t.Errorf("network %+v", nw)
	}
	host, sb, _ := pool.Addrs(3)
	if nw.Host != host || nw.Sandbox != sb {
		t.Errorf("slot 3's addresses %v %v, want %v %v", nw.Host, nw.Sandbox, host, sb)
	}
	if got := h.Dir("x").Log(); got != filepath.Join("/data", "sandboxes", "x", "console.log") {
		t.Errorf("log at %s", got)
	}
	tpl := store.Template{MemoryMiB: 256}
	for _, c := range []struct {
		sb   store.Sandbox
		t    store.Template
		want int64
	}{
		{store.Sandbox{MemoryMiB: 512}, tpl, 512},
		{store.Sandbox{}, tpl, 256},
		{store.Sandbox{}, store.Template{}, 1024},
	} {
		if got := h.LimitOf(c.sb, c.t); got != c.want {
			t.Errorf("LimitOf(%d, %d) = %d, want %d", c.sb.MemoryMiB, c.t.MemoryMiB, got, c.want)
		}
	}
	if PrincipalOf(store.Sandbox{Name: "n"}) != "n" || PrincipalOf(store.Sandbox{Name: "n", Principal: "p"}) != "p" {
		t.Error("PrincipalOf")
	}
}
