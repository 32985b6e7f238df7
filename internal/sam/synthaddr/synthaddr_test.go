package synthaddr

import (
	"fmt"
	"net/netip"
	"testing"
)

// The synthetic pool: deterministic, collision-free, never the listen
// address, and bounded.
func TestPool(t *testing.T) {
	p := New(netip.MustParsePrefix("10.9.0.0/29"), netip.MustParseAddr("10.9.0.3"))
	seen := map[netip.Addr]string{}
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("n%d.test", i)
		a, ok := p.Assign(name)
		if !ok {
			t.Fatalf("pool full after %d", i)
		}
		if a == netip.MustParseAddr("10.9.0.3") || a == netip.MustParseAddr("10.9.0.0") || a == netip.MustParseAddr("10.9.0.7") {
			t.Errorf("%s got %s", name, a)
		}
		if seen[a] != "" {
			t.Errorf("%s and %s share %s", name, seen[a], a)
		}
		seen[a] = name
		if b, _ := p.Assign(name); b != a {
			t.Errorf("%s: %s then %s", name, a, b)
		}
	}
	if _, ok := p.Assign("one-too-many.test"); ok {
		t.Error("assigned beyond the pool")
	}
}
