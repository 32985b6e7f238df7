package meshconsole

import (
	"sync"

	"sandstorm/api"
)

// Ring keeps the last refusals, in memory: a console shows what happened
// recently, and a flood of refusals (an attacker's) costs a bounded
// amount — the oldest are dropped.
type Ring struct {
	mu    sync.Mutex
	items []api.MeshRefusal // a circle of cap len(items) once full
	next  int
	seq   int64
}

// DefaultRingSize is how many refusals sam-one keeps: a screenful many
// times over, a few hundred KiB at most.
const DefaultRingSize = 500

// NewRing keeps the last n refusals.
func NewRing(n int) *Ring {
	if n < 1 {
		n = 1
	}
	return &Ring{items: make([]api.MeshRefusal, 0, n)}
}

// Add records r, numbering it.
func (g *Ring) Add(r api.MeshRefusal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	r.Seq = g.seq
	if len(g.items) < cap(g.items) {
		g.items = append(g.items, r)
		return
	}
	g.items[g.next] = r
	g.next = (g.next + 1) % len(g.items)
}

// List is what is kept, newest first.
func (g *Ring) List() []api.MeshRefusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]api.MeshRefusal, 0, len(g.items))
	// The newest is just before next (or the last appended while not full).
	n := len(g.items)
	for i := 1; i <= n; i++ {
		out = append(out, g.items[((g.next-i)%n+n)%n])
	}
	return out
}
