// Package egresslog keeps each sandbox's egress log: the last flows its
// boundary allowed or refused (issue 33, item 5), bounded per sandbox,
// read in pages by sequence number and followed as they come. It is kept
// in the node's memory: it outlives the boundary (a sandbox's tiers take
// its boundary down and up again) and ends with the sandbox, or the
// node's process.
package egresslog

import (
	"context"
	"errors"
	"sync"
	"time"

	"sandstorm/api"
)

// DefaultBound is how many flows a sandbox's log keeps when New is given
// none: at ~200 bytes a flow, 200 KiB a sandbox at most.
const DefaultBound = 1000

// Logs is every sandbox's log on one node.
type Logs struct {
	bound int
	mu    sync.Mutex
	m     map[string]*log
}

type log struct {
	last  int64            // the seq of the newest flow (0: none yet)
	ring  []api.EgressFlow // the newest len(ring) flows; ring[(seq-1)%bound]
	added chan struct{}    // closed and replaced when a flow is added
	// dropped: the sandbox is gone (Drop); its followers stop.
	dropped bool
	waiting int // followers in Wait
	// refused is when each name the DNS refused was last logged
	// (repeated).
	refused map[string]time.Time
}

// RepeatEvery is how often one name the boundary's DNS refused is
// logged: a resolver asks for A and AAAA, retries, and tries each search
// domain, so one lookup is several refusals, and one entry says it.
const RepeatEvery = 10 * time.Second

// repeated reports whether f is a DNS refusal of a name logged less than
// RepeatEvery before it, and notes f's otherwise. The names it remembers
// are bounded; forgetting one only logs it again.
func (g *log) repeated(f api.EgressFlow) bool {
	if f.Route != api.EgressRouteDNS {
		return false
	}
	if last, ok := g.refused[f.Name]; ok && f.Time.Sub(last) >= 0 && f.Time.Sub(last) < RepeatEvery {
		return true
	}
	if g.refused == nil || len(g.refused) >= 1024 {
		g.refused = map[string]time.Time{}
	}
	g.refused[f.Name] = f.Time
	return false
}

// ErrDropped is Wait's answer once the sandbox's log is dropped.
var ErrDropped = errors.New("egress log dropped: its sandbox is deleted")

// New is an empty set of logs, each keeping the newest bound flows.
func New(bound int) *Logs {
	if bound <= 0 {
		bound = DefaultBound
	}
	return &Logs{bound: bound, m: map[string]*log{}}
}

func (l *Logs) get(id string) *log {
	g := l.m[id]
	if g == nil {
		g = &log{added: make(chan struct{})}
		l.m[id] = g
	}
	return g
}

// Recorder is what sandbox id's boundary hands each flow to
// (boundary.Config.Flows); nil for a nil Logs.
func (l *Logs) Recorder(id string) func(api.EgressFlow) {
	if l == nil {
		return nil
	}
	return func(f api.EgressFlow) { l.Add(id, f) }
}

// Add appends f to sandbox id's log, numbering it, and wakes followers;
// a DNS refusal repeated within RepeatEvery is not added.
func (l *Logs) Add(id string, f api.EgressFlow) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.get(id)
	if g.repeated(f) {
		return
	}
	g.last++
	f.Seq = g.last
	if len(g.ring) < l.bound {
		g.ring = append(g.ring, f)
	} else {
		g.ring[(f.Seq-1)%int64(l.bound)] = f
	}
	close(g.added)
	g.added = make(chan struct{})
}

// Page is up to limit flows (a nil Logs has none) of sandbox id after seq after, oldest first
// (limit <= 0: all it keeps).
func (l *Logs) Page(id string, after int64, limit int) api.EgressPage {
	if l == nil {
		return api.EgressPage{Items: []api.EgressFlow{}, Next: after}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p := api.EgressPage{Items: []api.EgressFlow{}, Next: after}
	g := l.m[id]
	if g == nil || after >= g.last {
		return p
	}
	first := g.last - int64(len(g.ring)) + 1 // the oldest kept
	if after+1 < first {
		p.Missed, after = first-after-1, first-1
	}
	for s := after + 1; s <= g.last && (limit <= 0 || len(p.Items) < limit); s++ {
		p.Items = append(p.Items, g.ring[(s-1)%int64(l.bound)])
	}
	p.Next = p.Items[len(p.Items)-1].Seq
	return p
}

// Wait returns when sandbox id's log has a flow after seq after, or ctx
// ends (its error), or the log is dropped (ErrDropped). On a nil Logs it
// waits for ctx.
func (l *Logs) Wait(ctx context.Context, id string, after int64) error {
	if l == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	l.mu.Lock()
	g := l.get(id)
	g.waiting++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		g.waiting--
		l.mu.Unlock()
	}()
	for {
		l.mu.Lock()
		last, added, dropped := g.last, g.added, g.dropped
		l.mu.Unlock()
		switch {
		case dropped:
			return ErrDropped
		case last > after:
			return nil
		}
		select {
		case <-added:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Drop forgets sandbox id's log (it is deleted). A nil Logs has none.
func (l *Logs) Drop(id string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.m[id]; g != nil {
		g.dropped = true
		close(g.added) // its followers stop
		delete(l.m, id)
	}
}
