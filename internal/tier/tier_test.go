package tier

import (
	"testing"
	"time"

	"sandstorm/api"
)

func TestNextWalksDownOneTierAtATime(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	timers := Timers{Freeze: 10 * time.Second, Snapshot: 20 * time.Second, Detach: 30 * time.Second}
	cases := []struct {
		name    string
		v       View
		now     time.Time
		checkpt bool
		want    api.Tier
		move    bool
	}{
		{"hot, not idle long enough", View{Tier: api.TierHot, LastActive: t0}, t0.Add(9 * time.Second), true, "", false},
		{"hot, idle past freeze", View{Tier: api.TierHot, LastActive: t0}, t0.Add(10 * time.Second), true, api.TierFrozen, true},
		{"frozen counts from arrival in tier", View{Tier: api.TierFrozen, LastActive: t0, TierSince: t0.Add(10 * time.Second)}, t0.Add(29 * time.Second), true, "", false},
		{"frozen, idle past snapshot", View{Tier: api.TierFrozen, LastActive: t0, TierSince: t0.Add(10 * time.Second)}, t0.Add(30 * time.Second), true, api.TierSnapshot, true},
		{"snapshot, idle past detach", View{Tier: api.TierSnapshot, TierSince: t0}, t0.Add(30 * time.Second), true, api.TierDetached, true},
		{"detached stays", View{Tier: api.TierDetached, TierSince: t0}, t0.Add(time.Hour), true, "", false},
		{"busy never moves", View{Tier: api.TierHot, LastActive: t0, Busy: true}, t0.Add(time.Hour), true, "", false},
		{"activity after arrival resets the timer", View{Tier: api.TierHot, TierSince: t0, LastActive: t0.Add(5 * time.Second)}, t0.Add(12 * time.Second), true, "", false},
		{"no checkpoint: frozen skips snapshot", View{Tier: api.TierFrozen, TierSince: t0}, t0.Add(49 * time.Second), false, "", false},
		{"no checkpoint: frozen to detached after both timers", View{Tier: api.TierFrozen, TierSince: t0}, t0.Add(50 * time.Second), false, api.TierDetached, true},
	}
	for _, c := range cases {
		got, move := Next(c.v, timers, c.now, c.checkpt)
		if got != c.want || move != c.move {
			t.Errorf("%s: Next = %q, %v; want %q, %v", c.name, got, move, c.want, c.move)
		}
	}
}

func TestZeroTimerDisablesStep(t *testing.T) {
	t0 := time.Now()
	for _, tr := range []api.Tier{api.TierHot, api.TierFrozen, api.TierSnapshot} {
		if to, ok := Next(View{Tier: tr, TierSince: t0, LastActive: t0}, Timers{}, t0.Add(24*time.Hour), true); ok {
			t.Errorf("tier %s moved to %s with all timers off", tr, to)
		}
	}
}

func TestVictimsLeastInDemandFirst(t *testing.T) {
	t0 := time.Now()
	vs := []View{
		{ID: "hot-recent", Tier: api.TierHot, LastActive: t0.Add(3 * time.Second)},
		{ID: "hot-old", Tier: api.TierHot, LastActive: t0},
		{ID: "frozen-recent", Tier: api.TierFrozen, LastActive: t0.Add(2 * time.Second)},
		{ID: "frozen-old", Tier: api.TierFrozen, LastActive: t0.Add(-time.Second)},
		{ID: "snap", Tier: api.TierSnapshot, LastActive: t0.Add(-time.Hour)},
		{ID: "detached", Tier: api.TierDetached},
		{ID: "busy", Tier: api.TierHot, Busy: true},
		{ID: "waking", Tier: api.TierHot, LastActive: t0.Add(-time.Hour)},
	}
	got := Victims(vs, "waking")
	want := []string{"frozen-old", "frozen-recent", "hot-old", "hot-recent"}
	if len(got) != len(want) {
		t.Fatalf("Victims = %v; want %v", ids(got), want)
	}
	for i := range want {
		if got[i].ID != want[i] {
			t.Fatalf("Victims = %v; want %v", ids(got), want)
		}
	}
}

func ids(vs []View) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.ID
	}
	return out
}

// TestOwnTimers: a sandbox's own timers replace the node's, field by
// field; a bad one is an error naming its field.
func TestOwnTimers(t *testing.T) {
	node := Timers{Freeze: time.Minute, Snapshot: time.Hour}
	own, err := node.With(&api.IdleTimers{FreezeAfter: "5s", DetachAfter: "0"})
	if err != nil || own != (Timers{Freeze: 5 * time.Second, Snapshot: time.Hour}) {
		t.Fatalf("With: %+v %v", own, err)
	}
	now := time.Now()
	v := View{Tier: api.TierHot, LastActive: now.Add(-10 * time.Second), TierSince: now.Add(-10 * time.Second)}
	if _, ok := Next(v, node, now, true); ok {
		t.Error("10 s idle moved under the node's 1 min")
	}
	v.Timers = &own
	if to, ok := Next(v, node, now, true); !ok || to != api.TierFrozen {
		t.Errorf("10 s idle with its own 5 s: %v %v, want frozen", to, ok)
	}
	for _, bad := range []*api.IdleTimers{{FreezeAfter: "soon"}, {SnapshotAfter: "-1s"}} {
		if _, err := node.With(bad); err == nil {
			t.Errorf("With(%+v) accepted", bad)
		}
	}
}
