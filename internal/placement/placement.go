// Package placement decides which node a new sandbox goes to: the one
// with the most headroom in what runs out first, memory (issue 9, item 4).
// It is a pure decision, free of I/O, so it is tested exhaustively beside
// the code; internal/fleet gathers the figures and carries it out.
package placement

import (
	"cmp"
	"slices"
)

// Candidate is a node as placement sees it, from its last status.
type Candidate struct {
	Name string
	// AvailableMiB is the node's MemAvailable, ReserveMiB what it keeps
	// free, PromisedMiB what sandboxes admitted but still starting have
	// yet to take (a 1 GiB heap not yet touched counts in full).
	AvailableMiB, ReserveMiB, PromisedMiB int64
	// Lost: the node did not answer; nothing goes there.
	Lost bool
	// Draining: the node is being emptied (node drain); nothing new goes
	// there.
	Draining bool
}

// Headroom is what the node can still give a new sandbox.
func (c Candidate) Headroom() int64 { return c.AvailableMiB - c.ReserveMiB - c.PromisedMiB }

// Order is the nodes to try, most headroom first (by name when equal, so
// the order is stable). Nodes without headroom stay in, last: each node
// decides for itself whether it can take work (it may push idle
// sandboxes to disk to make room), and a refusal moves on to the next.
// Lost and draining nodes are left out.
func Order(cs []Candidate) []Candidate {
	out := make([]Candidate, 0, len(cs))
	for _, c := range cs {
		if !c.Lost && !c.Draining {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b Candidate) int {
		if c := cmp.Compare(b.Headroom(), a.Headroom()); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}

// ForMove is the nodes to try for a sandbox leaving node from (a live
// move, or a drain of from): Order of the others. Most headroom first
// puts the nodes where a running sandbox fits before those where its
// restore would first push others off memory; a node without room
// refuses, and the move tries the next.
func ForMove(cs []Candidate, from string) []Candidate {
	others := make([]Candidate, 0, len(cs))
	for _, c := range cs {
		if c.Name != from {
			others = append(others, c)
		}
	}
	return Order(others)
}
