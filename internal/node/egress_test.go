package node

import (
	"context"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/tier"
)

// TestEgressKeepsASandboxAtWork: what a sandbox's boundary tells the node
// (egress) moves the tiering as the gateway's traffic does. A mesh
// request in flight is busy — the idle timers do not freeze the sandbox
// under it however long it takes — a flow's bytes refresh its idle
// timer, and an answer on its way thaws it if it was frozen meanwhile;
// a sandbox on disk is not restored for it (its flows were reset).
func TestEgressKeepsASandboxAtWork(t *testing.T) {
	be := newFakeBackend()
	n := newFakeNode(t, be)
	addFakeSandbox(t, n, be, "a1", 0, api.TierHot)
	a := n.tiers.Egress("a1")
	view := func() tier.View {
		for _, v := range n.tiers.Views() {
			if v.ID == "a1" {
				return v
			}
		}
		t.Fatal("no view of a1")
		return tier.View{}
	}
	timers := tier.Timers{Freeze: time.Second}
	later := time.Now().Add(time.Hour)

	a.Busy(1)
	if v := view(); !v.Busy {
		t.Fatal("a sandbox with a mesh request in flight is not busy")
	} else if to, ok := tier.Next(v, timers, later, true); ok {
		t.Fatalf("the idle timers would move a sandbox waiting on its request to %s", to)
	}
	a.Busy(-1)
	if v := view(); v.Busy {
		t.Fatal("busy after the request was answered")
	} else if _, ok := tier.Next(v, timers, later, true); !ok {
		t.Fatal("an idle sandbox is not moved by the idle timers (the test proves nothing)")
	}

	e, _ := n.tiers.Lookup("a1")
	e.SetLastActive(0)
	a.Touch()
	if got := time.UnixMilli(e.LastActive()); time.Since(got) > time.Minute {
		t.Errorf("a touch left its last activity at %v", got)
	}

	// Thaw: a frozen sandbox is resumed; one on disk is left there.
	if _, err := n.Freeze(context.Background(), "a1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Thaw(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.Tier() != api.TierHot {
		t.Errorf("after a thaw of a frozen sandbox it is %s", e.Tier())
	}
	addFakeSandbox(t, n, be, "s1", 1, api.TierSnapshot)
	if err := n.tiers.Egress("s1").Thaw(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s, _ := n.tiers.Lookup("s1"); s.Tier() != api.TierSnapshot {
		t.Errorf("a thaw moved a snapshotted sandbox to %s", s.Tier())
	}
}
