package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sandstorm/api"
	"sandstorm/internal/metrics"
	"sandstorm/internal/sandbox"
)

// TestMetricsCountWhatHappened: the node moves its counters where each
// thing happens, by exactly what happened — a freeze, a wake, a wake that
// failed, a refused wake and create (and why), a snapshot, a wake from it
// that failed (its restore, then the cold start behind it) — and not for
// requests that did not apply (a freeze of a frozen or detached sandbox,
// a bad name). GET /v1/node's transitions are those counters.
func TestMetricsCountWhatHappened(t *testing.T) {
	be := newFakeBackend()
	be.canCheckpoint = true
	reg := prometheus.NewRegistry()
	n := newFakeNodeWith(t, be, func(c *Config) { c.Metrics = metrics.NewNode(reg) })
	addFakeSandbox(t, n, be, "s1", 0, api.TierHot)
	ctx := context.Background()
	sb, _ := n.st.GetSandbox(ctx, "s1")
	if err := n.h.BoundaryUp(sb); err != nil {
		t.Fatal(err)
	}

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err := n.Freeze(ctx, "s1")
	must("freeze", err)
	_, err = n.Freeze(ctx, "s1") // already frozen: nothing happens
	must("freeze again", err)
	must("wake", n.Wake(ctx, "s1"))
	_, err = n.Freeze(ctx, "s1")
	must("freeze", err)
	boom := errors.New("resume: sandbox gone")
	be.on("resume", func(sandbox.Spec) error { return boom })
	if err := n.Wake(ctx, "s1"); !errors.Is(err, boom) {
		t.Fatalf("wake with resume failing: %v", err)
	}
	be.on("resume", nil)
	// The failed resume left it as the backend says: still paused, frozen.
	if e, _ := n.tiers.Lookup("s1"); e.Tier() != api.TierFrozen {
		t.Fatalf("after the failed wake it is %s", e.Tier())
	}
	// The sandbox held by another transition: a wake is refused (busy).
	held, _ := n.tiers.Lookup("s1")
	held.Hold()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err = n.Wake(wctx, "s1")
	cancel()
	held.Release()
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("wake of a sandbox held by another transition: %v", err)
	}
	_, err = n.Snapshot(ctx, "s1")
	must("snapshot", err)
	// Its template's rootfs does not exist: the restore fails, and so
	// does the cold start tried behind it.
	if err := n.Wake(ctx, "s1"); err == nil {
		t.Fatal("wake from snapshot with no rootfs succeeded")
	}
	if _, err := n.Freeze(ctx, "s1"); err == nil { // detached now: a conflict, not a transition
		t.Fatal("freeze of a detached sandbox")
	}
	// Creates: every start slot taken and the caller gone (refused,
	// busy); a bad name (not counted).
	tpl, err := n.st.GetTemplate(ctx, "t")
	must("template", err)
	for range cap(n.starts) {
		n.starts <- struct{}{}
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = n.Create(cctx, tpl, "queued", "", 0, 0, nil, nil)
	cancel()
	for range cap(n.starts) {
		<-n.starts
	}
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("queued create: %v", err)
	}
	if _, err := n.Create(ctx, tpl, "Not A Name", "", 0, 0, nil, nil); err == nil {
		t.Fatal("a bad name was taken")
	}

	want := map[[3]string]float64{
		{"hot", "frozen", "ok"}:       2,
		{"frozen", "hot", "ok"}:       1,
		{"frozen", "hot", "failed"}:   1,
		{"frozen", "hot", "refused"}:  1,
		{"frozen", "snapshot", "ok"}:  1,
		{"snapshot", "hot", "failed"}: 1,
	}
	for _, mv := range metrics.Moves {
		for _, o := range []string{metrics.OK, metrics.Failed, metrics.Refused} {
			k := [3]string{mv[0], mv[1], o}
			got := counterValue(t, reg, "sandstorm_transitions_total", map[string]string{"from": k[0], "to": k[1], "outcome": k[2]})
			if got != want[k] {
				t.Errorf("transitions %v = %v, want %v", k, got, want[k])
			}
		}
	}
	if n := testutil.CollectAndCount(reg, "sandstorm_transitions_total"); n != len(metrics.Moves)*3 {
		t.Errorf("%d transition series, want %d: one was made for a request that did not apply", n, len(metrics.Moves)*3)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sandstorm_admission_refusals_total", map[string]string{"reason": "busy", "op": "wake"}, 1},
		{"sandstorm_admission_refusals_total", map[string]string{"reason": "busy", "op": "create"}, 1},
		{"sandstorm_creates_total", map[string]string{"start": "cold", "outcome": "refused"}, 1},
		{"sandstorm_creates_total", map[string]string{"start": "cold", "outcome": "failed"}, 0},
		{"sandstorm_creates_total", map[string]string{"start": "cold", "outcome": "ok"}, 0},
	} {
		if got := counterValue(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// One wake was timed: the one that succeeded, from frozen.
	for _, from := range []string{"frozen", "snapshot", "detached"} {
		want := uint64(0)
		if from == "frozen" {
			want = 1
		}
		if got := histogramCount(t, reg, "sandstorm_wake_duration_seconds", from); got != want {
			t.Errorf("wakes from %s timed: %d, want %d", from, got, want)
		}
	}
	st, err := n.Status(ctx)
	must("status", err)
	if w := map[api.Tier]uint64{"hot": 1, "frozen": 2, "snapshot": 1, "detached": 0}; len(st.Transitions) != 4 ||
		st.Transitions["hot"] != w["hot"] || st.Transitions["frozen"] != w["frozen"] || st.Transitions["snapshot"] != w["snapshot"] {
		t.Errorf("status transitions %v, want %v", st.Transitions, w)
	}
}

// counterValue is the value of the counter of family name with labels,
// as a scrape of reg reads it; a series that is not there fails the test
// (every series of the node's closed sets is made up front).
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// histogramCount is the number of observations of family name's series
// from=from in reg.
func histogramCount(t *testing.T, reg *prometheus.Registry, name, from string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == from {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	t.Fatalf("no series %s{from=%q}", name, from)
	return 0
}
