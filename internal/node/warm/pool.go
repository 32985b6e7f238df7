package warm

import (
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"sandstorm/internal/store"
)

// The warm pool: sandboxes of a warm template restored ahead of demand
// and paused, so that a create takes one and only resumes it.
//
// Why: a restore of the warm image is most of a warm start, and for a
// small app it is as slow as the app's own start. Measured here
// (bench/results/2026-12-01-954c996-systrap, p50): the Python web demo
// starts cold in 194 ms to its first answer, raw `runsc restore` of its
// warm image answers in 105 ms and a warm start in 116 ms (0.60 of cold);
// issue 8 asks for 0.5. A resume is 6 ms (raw-resume/web/runsc), so a
// pooled start is bounded by the reseed and the network, not by runsc.
//
// What a pooled sandbox is before it is taken: its own ID, address slot,
// network namespace, veth, overlay and bundle, restored from the warm
// image, reseeded, and paused. It has no boundary (it has no principal
// yet): the firewall admits nothing from it but the boundary's ports, and
// nothing listens there, so it can reach nothing — and it is paused. It
// has no row in the store, so lists and the tier loop never see it; its
// slot and ID are reserved by the node as a create's are, so neither an
// allocation nor the orphan sweep takes them.
//
// Its hostname is set by the restore (gVisor takes it from the spec), so
// it must be known before the name is: it is "sb-<id>" (PooledName), the
// name a sandbox created without one gets. Only such creates take from
// the pool; a create with a name restores the warm image itself (the
// 0.60 path), so every sandbox's hostname is its name. Pooled sandboxes
// are what the node drops first under memory pressure (they are
// speculation), and a pool is refilled only while the node has twice
// their memory to spare.

// Pooled is one sandbox in a warm pool.
type Pooled struct {
	ID       string
	Slot     int
	Template string
	LimitMiB int64
	Made     time.Time
}

// PooledName is the name (and hostname) of pooled sandbox id.
func PooledName(id string) string { return "sb-" + id }

// Core is what a Pool needs of its node: the templates, whether one's
// pool may be filled now, and making and removing a pooled sandbox.
type Core interface {
	// Templates lists the templates whose pools may be filled now (none
	// while the node cannot checkpoint or is reconciling), after making
	// any warm image this run cannot restore again.
	Templates() []store.Template
	// Ready reports whether template name has a warm image this runtime
	// can restore.
	Ready(name string) bool
	// Room says why the node has no room for another pooled sandbox of t
	// ("" if it has).
	Room(t store.Template) string
	// Make restores one sandbox of t ahead of demand, paused.
	Make(t store.Template) (Pooled, error)
	// Discard removes a pooled sandbox and frees its slot.
	Discard(p Pooled)
}

// FillEvery is how often the pools are checked for refilling when no
// take has asked for it (a pool that could not be filled for memory, a
// template newly made warm).
const FillEvery = 2 * time.Second

// RefillAfter is how long after a take the pool is refilled. A refill is
// a runsc restore, about 150 ms of both of a 2-core node's cores; started
// at the take, it ran beside the very create that took the sandbox (its
// runsc resume took 28–48 ms instead of 10, its reseed 28–60) and beside
// the client's first command, which comes right after. A burst of
// creates is no slower for the wait: the pool refills one at a time.
const RefillAfter = 250 * time.Millisecond

// Pool is a node's warm pools: each warm template's pooled sandboxes.
type Pool struct {
	core Core
	log  *slog.Logger
	kick chan struct{}

	mu    sync.Mutex
	pools map[string][]Pooled
	// drains counts each template's drains: a sandbox made while its
	// template's pool was drained (the template removed or registered
	// again during the restore) is discarded, not pooled.
	drains map[string]int
}

// NewPool is an empty pool of the node core.
func NewPool(core Core, log *slog.Logger) *Pool {
	return &Pool{core: core, log: log, kick: make(chan struct{}, 1), pools: map[string][]Pooled{}, drains: map[string]int{}}
}

// Kick asks the loop to look at the pools now.
func (p *Pool) Kick() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Loop keeps the pools filled until stop is closed.
func (p *Pool) Loop(stop <-chan struct{}) {
	tick := time.NewTicker(FillEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		case <-p.kick:
		}
		p.Fill(stop)
	}
}

// Fill tops up the pool of every warm template with an image this
// runtime can restore, one sandbox at a time, while there is room for it.
func (p *Pool) Fill(stop <-chan struct{}) {
	// The drain counts from before the templates are listed: a drain that
	// lands after the listing (a template removed then, its image not yet
	// gone) makes stale what this pass restores of it, even a restore
	// begun after the drain.
	p.mu.Lock()
	seen := maps.Clone(p.drains)
	p.mu.Unlock()
	for _, t := range p.core.Templates() {
		for t.Warm != nil && p.Len(t.Name) < t.Warm.Pool && p.core.Ready(t.Name) {
			select {
			case <-stop:
				return
			default:
			}
			if why := p.core.Room(t); why != "" {
				p.log.Debug("warm pool not refilled", "template", t.Name, "why", why)
				break
			}
			drains := seen[t.Name] + seen[""]
			s, err := p.core.Make(t)
			if err != nil {
				p.log.Warn("warm pool: could not restore a sandbox ahead of demand", "template", t.Name, "err", err)
				break
			}
			p.mu.Lock()
			stale := p.drains[t.Name]+p.drains[""] != drains
			if !stale {
				p.pools[t.Name] = append(p.pools[t.Name], s)
			}
			p.mu.Unlock()
			if stale {
				p.log.Debug("warm pool: a sandbox made while its pool was drained is discarded", "template", t.Name, "id", s.ID)
				p.core.Discard(s)
				break
			}
			p.log.Debug("warm pool: sandbox ready", "template", t.Name, "id", s.ID)
		}
	}
}

// Len is how many sandboxes template's pool holds.
func (p *Pool) Len(template string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pools[template])
}

// Size is how many sandboxes the pools hold.
func (p *Pool) Size() int {
	k := 0
	for _, c := range p.Sizes() {
		k += c
	}
	return k
}

// Sizes is how many sandboxes each warm template's pool holds.
func (p *Pool) Sizes() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.pools))
	for t, ps := range p.pools {
		if len(ps) > 0 {
			out[t] = len(ps)
		}
	}
	return out
}

// Take hands out a pooled sandbox of template with memory limit
// limitMiB, if the pool has one, and asks for the pool to be refilled
// once the create that took it is done (RefillAfter).
func (p *Pool) Take(template string, limitMiB int64) (Pooled, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.pools[template]
	i := slices.IndexFunc(ps, func(s Pooled) bool { return s.LimitMiB == limitMiB })
	if i < 0 {
		return Pooled{}, false
	}
	s := ps[i]
	p.pools[template] = slices.Delete(ps, i, i+1)
	time.AfterFunc(RefillAfter, p.Kick)
	return s, true
}

// Drain removes every pooled sandbox of template name ("" for all).
func (p *Pool) Drain(name string) int {
	p.mu.Lock()
	var out []Pooled
	for t, ps := range p.pools {
		if name == "" || t == name {
			out = append(out, ps...)
			delete(p.pools, t)
		}
	}
	p.drains[name]++ // "" counts for every template
	p.mu.Unlock()
	for _, s := range out {
		p.core.Discard(s)
	}
	return len(out)
}

// DropOldest removes the oldest pooled sandbox, if there is one: what
// memory pressure gives up first.
func (p *Pool) DropOldest(why string) bool {
	p.mu.Lock()
	var (
		best Pooled
		ok   bool
	)
	for _, ps := range p.pools {
		for _, s := range ps {
			if !ok || s.Made.Before(best.Made) {
				best, ok = s, true
			}
		}
	}
	if ok {
		ps := p.pools[best.Template]
		p.pools[best.Template] = slices.DeleteFunc(ps, func(s Pooled) bool { return s.ID == best.ID })
	}
	p.mu.Unlock()
	if !ok {
		return false
	}
	p.log.Info("memory: dropping a pooled sandbox", "template", best.Template, "id", best.ID, "why", why)
	p.core.Discard(best)
	return true
}
