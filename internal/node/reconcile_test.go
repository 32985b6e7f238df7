package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// TestReconcile: after a restart every stored sandbox is settled by what
// the backend reports and what is on disk, by the rules Reconcile
// documents, its transition cleared; a delete in progress is finished;
// containers and sandbox directories of no sandbox are removed, those of
// pooled sandboxes (no row yet) kept. Until its repair every sandbox is
// held: not hot to the gateway, a wake waits.
//
// On disk, a complete image is snapshot/ (renamed from snapshot.tmp/ only
// once runsc checkpoint succeeded); snapshot.tmp/ alone is an image cut
// short, never restored — unless the row's transition says a checkpoint
// was running, when a non-empty one is a checkpoint that finished after
// the node died. Orphaned namespaces and veths (removeOrphans deletes them
// by name for each orphan it finds) need real ones, made as root: that
// part is test/e2e's (TestCrashRestart/orphans).
func TestReconcile(t *testing.T) {
	be := newFakeBackend()
	be.canCheckpoint = true
	n := newFakeNode(t, be)
	ctx := context.Background()
	const (
		image   = "snapshot/pages.img"
		partial = "snapshot.tmp/pages.img"
		volume  = "upper/data.txt"
	)
	stateUnknown := errors.New("runsc state: timed out")
	goneNote := func(was api.Tier) string {
		return "its processes were gone when the node restarted (was " + string(was) + "); the next request cold-starts it"
	}
	cases := []struct {
		id         string
		tier       api.Tier // stored
		transition api.Tier // stored
		note       string   // stored
		state      sandbox.State
		stateErr   error
		files      []string // under its directory, before

		want     api.Tier
		wantNote string
		present  []string // after
		absent   []string // after
	}{
		// A restore that finished after the node died: running, and its
		// image (and any partial one) dropped.
		{id: "running", tier: api.TierSnapshot, transition: api.TierHot, state: sandbox.StateRunning, files: []string{image, partial},
			want: api.TierHot, absent: []string{"snapshot", "snapshot.tmp"}},
		{id: "paused", tier: api.TierHot, state: sandbox.StatePaused,
			want: api.TierFrozen},
		// A complete image: snapshot, its stopped container removed, a
		// partial image beside it dropped, its note kept.
		{id: "imaged", tier: api.TierSnapshot, note: "earlier note", state: sandbox.StateStopped, files: []string{image, partial},
			want: api.TierSnapshot, wantNote: "earlier note", present: []string{image}, absent: []string{"snapshot.tmp"}},
		// A checkpoint that ran to its end while the node was down: its
		// image is finished and wins over the lingering "running".
		{id: "finished", tier: api.TierHot, transition: api.TierSnapshot, state: sandbox.StateRunning, files: []string{partial},
			want: api.TierSnapshot, wantNote: "its checkpoint finished while the node was down", present: []string{image}, absent: []string{"snapshot.tmp"}},
		// A snapshot recorded, or its image renamed into place, before the
		// daemon died and before the stopped container was removed
		// (checkpoint's finish): a snapshot, though the stopped sandbox
		// process still says "running".
		{id: "recorded", tier: api.TierSnapshot, note: "earlier note", state: sandbox.StateRunning, files: []string{image},
			want: api.TierSnapshot, wantNote: "earlier note", present: []string{image}},
		{id: "renamed", tier: api.TierHot, transition: api.TierSnapshot, state: sandbox.StateRunning, files: []string{image},
			want: api.TierSnapshot, wantNote: "its checkpoint finished while the node was down", present: []string{image}},
		// A checkpoint that never wrote anything: the sandbox still runs.
		{id: "halfway", tier: api.TierHot, transition: api.TierSnapshot, state: sandbox.StateRunning, files: []string{"snapshot.tmp/"},
			want: api.TierHot, absent: []string{"snapshot.tmp"}},
		// Processes gone, no image: detached, volume kept, with a note.
		{id: "gone", tier: api.TierHot, state: sandbox.StateStopped, files: []string{volume},
			want: api.TierDetached, wantNote: goneNote(api.TierHot), present: []string{volume}},
		// An image cut short (no checkpoint was running) is no image.
		{id: "partial", tier: api.TierHot, state: sandbox.StateAbsent, files: []string{partial},
			want: api.TierDetached, wantNote: goneNote(api.TierHot), absent: []string{"snapshot.tmp", "snapshot"}},
		// A state the backend cannot tell is taken as stopped.
		{id: "unknown", tier: api.TierFrozen, stateErr: stateUnknown,
			want: api.TierDetached, wantNote: goneNote(api.TierFrozen)},
		// Detached already: nothing was lost, its note stays.
		{id: "detached", tier: api.TierDetached, note: "earlier note", state: sandbox.StateAbsent, files: []string{volume},
			want: api.TierDetached, wantNote: "earlier note", present: []string{volume}},
		// A delete in progress is finished: no row, no directory, no
		// container.
		{id: "deleting", tier: api.TierHot, transition: transitionDelete, state: sandbox.StateRunning, files: []string{volume},
			want: ""},
	}
	for i, c := range cases {
		sb := store.Sandbox{ID: c.id, Name: "name-" + c.id, Template: "t", Node: "n", Tier: c.tier, Transition: c.transition,
			Note: c.note, Slot: i, HostPorts: map[int]int{}}
		if err := n.st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if c.state != sandbox.StateAbsent && c.state != "" {
			be.set(c.id, c.state)
		}
		if c.stateErr != nil {
			be.stateErr[c.id] = c.stateErr
		}
		mkFiles(t, string(n.h.Dir(c.id)), c.files)
	}
	// Of no sandbox: a container, and a directory with a volume.
	be.set("orphan-ctr", sandbox.StateRunning)
	mkFiles(t, string(n.h.Dir("orphan-dir")), []string{volume})
	// A pooled sandbox has a container and a directory, its slot
	// reserved, and no row.
	be.set("pooled", sandbox.StatePaused)
	mkFiles(t, string(n.h.Dir("pooled")), []string{volume})
	n.allocMu.Lock()
	n.reserved[40] = "pooled"
	n.allocMu.Unlock()

	plan, err := n.planReconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Held until repaired: the rows plus the orphan sweep are counted,
	// no sandbox is hot to the gateway, a wake has to wait.
	if k, want := int(n.reconciling.Load()), len(plan.sandboxes)+1; k != want || want != 13 {
		t.Errorf("Reconciling %d before the repair, want %d (12 rows + the sweep)", k, want)
	}
	// ("paused" is stored hot: only being held keeps it from being hot.)
	if n.tiers.IsHot("paused") {
		t.Error("a sandbox is hot to the gateway before its repair")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := n.Wake(cancelled, "paused"); !errors.Is(err, ErrRefused) {
		t.Errorf("a wake with no time to wait for the repair: %v, want it refused", err)
	}
	if err := n.FinishReconcile(ctx, plan); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if k := int(n.reconciling.Load()); k != 0 {
		t.Errorf("Reconciling %d after it", k)
	}
	// The containers left: the running, paused and pooled ones, and the
	// checkpoint that never wrote; stopped and orphaned ones removed, and
	// those whose checkpoint finished.
	if ids, _ := be.List(ctx); !slices.Equal(ids, []string{"halfway", "paused", "pooled", "running"}) {
		t.Errorf("containers after reconcile: %q", ids)
	}
	for _, c := range cases {
		row, err := n.st.GetSandbox(ctx, c.id)
		if c.want == "" {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%s: row %+v (%v), want it deleted", c.id, row, err)
			}
			if _, err := os.Stat(string(n.h.Dir(c.id))); err == nil {
				t.Errorf("%s: its directory is left", c.id)
			}
			if _, ok := n.tiers.Lookup(c.id); ok {
				t.Errorf("%s: the node still has it", c.id)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if row.Tier != c.want || row.Transition != "" || row.Note != c.wantNote {
			t.Errorf("%s: tier %s transition %q note %q; want %s, none, %q", c.id, row.Tier, row.Transition, row.Note, c.want, c.wantNote)
		}
		if e, ok := n.tiers.Lookup(c.id); !ok || e.Tier() != c.want {
			t.Errorf("%s: the node's own view is not %s", c.id, c.want)
		}
		if hot := n.tiers.IsHot(c.id); hot != (c.want == api.TierHot) {
			t.Errorf("%s: hot to the gateway: %v", c.id, hot)
		}
		if up, want := hasBoundary(n, c.id), c.want == api.TierHot || c.want == api.TierFrozen; up != want {
			t.Errorf("%s: boundary up %v, want %v", c.id, up, want)
		}
		for _, p := range c.present {
			if _, err := os.Stat(filepath.Join(string(n.h.Dir(c.id)), p)); err != nil {
				t.Errorf("%s: %s is gone", c.id, p)
			}
		}
		for _, p := range c.absent {
			if _, err := os.Stat(filepath.Join(string(n.h.Dir(c.id)), p)); err == nil {
				t.Errorf("%s: %s is left", c.id, p)
			}
		}
	}
	if _, err := os.Stat(string(n.h.Dir("orphan-dir"))); err == nil {
		t.Error("the orphaned sandbox directory is left")
	}
	if _, err := os.Stat(filepath.Join(string(n.h.Dir("pooled")), volume)); err != nil {
		t.Error("the pooled sandbox's directory was removed as an orphan")
	}
}

// mkFiles makes each of files under dir: a directory when it ends in
// "/", else a small file (and its parents).
func mkFiles(t *testing.T, dir string, files []string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		p := filepath.Join(dir, f)
		if f[len(f)-1] == '/' {
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
