package meshconsole

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"sandstorm/api"
	"sandstorm/internal/sam/refusals"
)

// Agents keeps what members report their agents were refused
// (controlplane.Config.Reported), as rows of (member, principal, by,
// what, target, reason, from) with their counts summed across reports,
// for the console. It is bounded twice: at most perMember rows of one
// member, so that one member's flood cannot push the others' refusals
// out, and at most size rows in all; past either, the rows last seen
// longest ago go first, and their counts are added to their member's
// Dropped, as are the refusals a member reports it could not itemise.
type Agents struct {
	size, perMember int

	mu      sync.Mutex
	rows    map[agentKey]*api.MeshAgentRefusal
	of      map[string]int    // member → its rows
	dropped map[string]uint64 // member → refusals not itemised
}

type agentKey struct{ member, principal, by, what, target, reason, from string }

// Defaults of sam-one's table: a page that polls every 2 s reads at most
// a few hundred KiB.
const (
	DefaultAgentRows      = 1000
	DefaultAgentPerMember = 250
)

// NewAgents keeps at most size rows, perMember of one member.
func NewAgents(size, perMember int) *Agents {
	size, perMember = max(size, 1), max(perMember, 1)
	return &Agents{size: size, perMember: min(perMember, size), rows: map[agentKey]*api.MeshAgentRefusal{},
		of: map[string]int{}, dropped: map[string]uint64{}}
}

// Add merges member's report (checked: refusals.Check).
func (a *Agents) Add(member string, rep api.RefusalReport) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropped[member] = refusals.AddSat(a.dropped[member], rep.Dropped)
	for _, r := range rep.Rows {
		k := agentKey{member, r.Principal, r.By, r.What, r.Target, r.Reason, r.From}
		if row := a.rows[k]; row != nil {
			refusals.Fold(&row.RefusalRow, r)
			continue
		}
		a.rows[k] = &api.MeshAgentRefusal{Member: member, RefusalRow: r}
		a.of[member]++
	}
	if a.of[member] > a.perMember {
		a.evict(member, a.of[member]-a.perMember)
	}
	if len(a.rows) > a.size {
		a.evict("", len(a.rows)-a.size)
	}
}

// evict drops the n rows of member ("": of anyone) last seen longest
// ago. a.mu is held.
func (a *Agents) evict(member string, n int) {
	var ks []agentKey
	for k := range a.rows {
		if member == "" || k.member == member {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, func(x, y agentKey) int { return a.rows[x].Last.Compare(a.rows[y].Last) })
	for _, k := range ks[:min(n, len(ks))] {
		a.dropped[k.member] = refusals.AddSat(a.dropped[k.member], a.rows[k].Count)
		a.of[k.member]--
		delete(a.rows, k)
	}
}

// List is every row, newest first (then by member, principal, what,
// target: a stable order).
func (a *Agents) List() []api.MeshAgentRefusal {
	a.mu.Lock()
	out := make([]api.MeshAgentRefusal, 0, len(a.rows))
	for _, r := range a.rows {
		out = append(out, *r)
	}
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y api.MeshAgentRefusal) int {
		if c := y.Last.Compare(x.Last); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(x.Member, y.Member), strings.Compare(x.Principal, y.Principal),
			strings.Compare(x.What, y.What), strings.Compare(x.Target, y.Target), strings.Compare(x.Reason, y.Reason),
			strings.Compare(x.By, y.By), strings.Compare(x.From, y.From))
	})
	return out
}

// Dropped is how many of member's agents' refusals are counted but not
// itemised.
func (a *Agents) Dropped(member string) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dropped[member]
}
