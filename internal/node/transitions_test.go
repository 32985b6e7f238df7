package node

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// What these tests cannot reach without root: a wake from snapshot or
// detached, and a re-creation after a failed checkpoint, start with an
// overlay mount and a network namespace. Here the template has no rootfs,
// so those paths end at the mount, in the failure branch the code
// documents; their success is the end-to-end tests' (test/e2e, real
// runsc).

// TestDrainBeforeCheckpoint: before the backend saves or stops a sandbox
// (Checkpoint for a snapshot, and Resume first when it was frozen; Remove
// for a detach), the gateway has drained it — a request still in flight
// was waited for and then cut (here it is never answered, so it is cut
// after the drain's wait) and no connection into the sandbox is left —
// and its boundary is down. gVisor cannot save an established TCP
// endpoint the node does not reset. (A freeze does not drain: open
// connections survive a pause, and their next byte thaws the sandbox.)
//
// That the drain waits for an answer, when one comes, before it cuts
// anything is the gateway's own test (TestDrainWaitsForTheAnswer).
func TestDrainBeforeCheckpoint(t *testing.T) {
	for _, c := range []struct {
		name string
		from api.Tier
		op   func(*Node, context.Context, string) (store.Sandbox, error)
		to   api.Tier
		// calls are the backend calls that must find the sandbox
		// drained, in the order they must come.
		calls []string
	}{
		{"snapshot of a hot sandbox", api.TierHot, (*Node).Snapshot, api.TierSnapshot, []string{"checkpoint"}},
		{"snapshot of a frozen sandbox", api.TierFrozen, (*Node).Snapshot, api.TierSnapshot, []string{"resume", "checkpoint"}},
		{"detach of a hot sandbox", api.TierHot, (*Node).Detach, api.TierDetached, []string{"remove"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			be, n := checkpointingNode(t, api.TierHot)
			ctx := context.Background()
			inFlight := make(chan struct{})
			url, client := serveSandbox(t, n, "s1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				be.record("sandbox: %s in flight", r.URL.Path)
				close(inFlight)
				<-r.Context().Done() // never answered: the drain must cut it
			}))
			slow := make(chan string, 1)
			go func() { slow <- get(client, url+"/slow") }()
			<-inFlight
			if a := n.gw.Active("s1"); a != 1 {
				t.Fatalf("%d connections into the sandbox with a request in flight, want 1", a)
			}
			if c.from == api.TierFrozen {
				// Frozen with the request in flight (frozen by its
				// idle timer in the middle of a long request).
				be.set("s1", sandbox.StatePaused)
				n.tiers.Entry("s1").SetTier(api.TierFrozen)
				n.st.UpdateSandbox(ctx, "s1", func(s *store.Sandbox) error { s.Tier = api.TierFrozen; return nil })
			}
			for _, m := range c.calls {
				be.on(m, func(s sandbox.Spec) error {
					if a := n.gw.Active(s.ID); a != 0 {
						t.Errorf("%s with %d connections into the sandbox open: the gateway was not drained first", m, a)
					}
					if hasBoundary(n, s.ID) {
						t.Errorf("%s with the sandbox's boundary still up", m)
					}
					return nil
				})
			}
			got, err := c.op(n, ctx, "s1")
			if err != nil {
				t.Fatal(err)
			}
			if got.Tier != c.to || got.Transition != "" {
				t.Errorf("after it: tier %s transition %q, want %s", got.Tier, got.Transition, c.to)
			}
			// The drain closed the client's connection too; the client
			// sees it at once (the bound is only for a drain that did
			// not happen).
			select {
			case r := <-slow:
				if strings.HasPrefix(r, "200") {
					t.Errorf("the request in flight got %q; it was never answered and should have been cut", r)
				}
			case <-time.After(5 * time.Second):
				t.Error("the request in flight is still open after the transition")
			}
			// The calls happened, after the request was in flight, in
			// their order.
			last := be.logIndex("sandbox: /slow in flight")
			for _, m := range c.calls {
				i := be.logIndex(m + " s1")
				if i < 0 || i < last {
					t.Errorf("backend call %q missing or out of order: %q", m, be.log())
				}
				last = i
			}
		})
	}
}

// TestWakeDuringSnapshotWaitsForIt: while a checkpoint runs the stored
// tier still says hot, but the sandbox is not hot to the gateway (IsHot),
// and a wake waits for the snapshot rather than report it hot: with no
// time left to wait it is refused, and with time it goes on once the
// snapshot is recorded, as a wake from snapshot. A request let through to
// a sandbox whose checkpoint is done would be dialled to an address whose
// veth is gone.
func TestWakeDuringSnapshotWaitsForIt(t *testing.T) {
	be := newFakeBackend()
	be.canCheckpoint = true
	n := fakeNode(t, be, api.TierHot)
	ctx := context.Background()
	entered, proceed := hold(be, "checkpoint", nil)
	snapped := inBackground(func() error { _, err := n.Snapshot(ctx, "s1"); return err })
	<-entered
	if sb, _ := n.st.GetSandbox(ctx, "s1"); sb.Tier != api.TierHot || sb.Transition != api.TierSnapshot {
		t.Fatalf("during the checkpoint the row says tier %s transition %q, want hot towards snapshot", sb.Tier, sb.Transition)
	}
	if n.tiers.IsHot("s1") {
		t.Error("IsHot during its checkpoint: the gateway would dial it")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := n.Wake(cancelled, "s1"); !errors.Is(err, ErrRefused) {
		t.Errorf("a wake with no time to wait for the checkpoint: %v, want it refused", err)
	}
	woke := make(chan error, 1)
	go func() {
		err := n.Wake(ctx, "s1")
		be.record("wake returned")
		woke <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the wake to wait for the snapshot", func() bool { return wakePending(n, "s1") })
	close(proceed)
	if err := <-snapped; err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	<-woke
	if i, j := be.logIndex("checkpoint s1"), be.logIndex("wake returned"); i < 0 || j < i {
		t.Errorf("the wake did not wait for the checkpoint: %q", be.log())
	}
	// Only a wake from snapshot writes this note: it began after the
	// snapshot was recorded (and here its restore cannot mount the
	// template's rootfs, so it ends detached, saying so).
	if sb, _ := n.st.GetSandbox(ctx, "s1"); !strings.HasPrefix(sb.Note, "restore failed: ") || sb.Transition != "" {
		t.Errorf("after the wake: tier %s transition %q note %q, want a wake from snapshot", sb.Tier, sb.Transition, sb.Note)
	}
}

// TestRequestDuringFreezeIsServedAfterIt: a request that arrives through
// the gateway while a freeze is pausing the sandbox waits for it (it
// never reaches the sandbox then), and is then served: its wake resumes
// the sandbox, and only then does the sandbox see it.
func TestRequestDuringFreezeIsServedAfterIt(t *testing.T) {
	be := newFakeBackend()
	n := fakeNode(t, be, api.TierHot)
	ctx := context.Background()
	url, client := serveSandbox(t, n, "s1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		be.record("sandbox: %s (it is %s)", r.URL.Path, be.stateOf("s1"))
		io.WriteString(w, "ok")
	}))
	pausing, proceed := hold(be, "pause", nil)
	frozen := inBackground(func() error { _, err := n.Freeze(ctx, "s1"); return err })
	<-pausing
	got := make(chan string, 1)
	go func() { got <- get(client, url+"/during") }()
	testenv.WaitFor(t, 5*time.Second, "the request's wake to wait for the freeze", func() bool { return wakePending(n, "s1") })
	if i := be.logIndex("sandbox:"); i >= 0 {
		t.Errorf("the request reached the sandbox while it was being frozen: %q", be.log())
	}
	close(proceed)
	if err := <-frozen; err != nil {
		t.Fatalf("freeze: %v", err)
	}
	if r := <-got; r != "200 ok" {
		t.Errorf("the request that waited got %q, want 200 ok", r)
	}
	p, r, s := be.logIndex("pause s1"), be.logIndex("resume s1"), be.logIndex("sandbox: /during")
	if p < 0 || r < p || s < r || !strings.HasSuffix(be.log()[s], "(it is running)") {
		t.Errorf("want pause, resume, then the request in a running sandbox: %q", be.log())
	}
	if sb, _ := n.st.GetSandbox(ctx, "s1"); sb.Tier != api.TierHot || sb.LastWakeFrom != api.TierFrozen || sb.Transition != "" {
		t.Errorf("after it: tier %s woken from %s transition %q", sb.Tier, sb.LastWakeFrom, sb.Transition)
	}
}

// TestFailedCheckpointKeepsARunningSandboxHot: a checkpoint that fails
// while the sandbox still runs (the documented case: it "stays hot")
// leaves it hot with its boundary back and a note saying why, no image
// and no transition in its row, and the snapshot's error; a request that
// arrived during the checkpoint waits for it and is then served.
func TestFailedCheckpointKeepsARunningSandboxHot(t *testing.T) {
	be, n := checkpointingNode(t, api.TierHot)
	ctx := context.Background()
	url, client := serveSandbox(t, n, "s1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		be.record("sandbox: %s (it is %s)", r.URL.Path, be.stateOf("s1"))
		io.WriteString(w, "ok")
	}))
	boom := errors.New("checkpoint: cannot save a socket")
	entered, proceed := hold(be, "checkpoint", boom) // and the container keeps running
	type result struct {
		sb  store.Sandbox
		err error
	}
	snapped := make(chan result, 1)
	go func() {
		sb, err := n.Snapshot(ctx, "s1")
		snapped <- result{sb, err}
	}()
	<-entered
	got := make(chan string, 1)
	go func() { got <- get(client, url+"/during") }()
	testenv.WaitFor(t, 5*time.Second, "the request's wake to wait for the checkpoint", func() bool { return wakePending(n, "s1") })
	close(proceed)
	res := <-snapped
	if !errors.Is(res.err, boom) {
		t.Errorf("snapshot: %v, want the checkpoint's error", res.err)
	}
	if res.sb.Tier != api.TierHot {
		t.Errorf("snapshot returned tier %s, want hot", res.sb.Tier)
	}
	row, _ := n.st.GetSandbox(ctx, "s1")
	if want := "checkpoint failed: " + boom.Error() + "; sandbox kept running"; row.Tier != api.TierHot || row.Transition != "" || row.Note != want {
		t.Errorf("row: tier %s transition %q note %q, want hot, none, %q", row.Tier, row.Transition, row.Note, want)
	}
	d := n.h.Dir("s1")
	for _, p := range []string{d.Snapshot(), d.SnapTmp()} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left behind", p)
		}
	}
	if !hasBoundary(n, "s1") {
		t.Error("its boundary was not started again: it would run with no way out")
	}
	if r := <-got; r != "200 ok" {
		t.Errorf("the request that waited got %q, want 200 ok", r)
	}
	// (Asked only now: the waiting wake holds the lock for a moment
	// after the snapshot returns.)
	if !n.tiers.IsHot("s1") {
		t.Error("not hot to the gateway")
	}
	if c, s := be.logIndex("checkpoint s1"), be.logIndex("sandbox: /during"); s < c || !strings.HasSuffix(be.log()[s], "(it is running)") {
		t.Errorf("want the checkpoint, then the request: %q", be.log())
	}
}

// TestFailedCheckpointThatKilledTheSandbox: a checkpoint that fails and
// takes the sandbox with it (gVisor kills a sandbox whose save fails)
// has its container removed and a cold start tried; when that fails too
// (here: no rootfs to mount) the sandbox is detached — volume kept, no
// image, no boundary, not hot — and its note says both. The cold start
// that succeeds ("re-created cold from its template") needs root.
func TestFailedCheckpointThatKilledTheSandbox(t *testing.T) {
	be, n := checkpointingNode(t, api.TierHot)
	ctx := context.Background()
	d := n.h.Dir("s1")
	kept := filepath.Join(d.Upper(), "kept.txt")
	if err := os.MkdirAll(d.Upper(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kept, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("checkpoint: save failed, sandbox killed")
	be.on("checkpoint", func(s sandbox.Spec) error {
		be.set(s.ID, sandbox.StateStopped)
		return boom
	})
	_, err := n.Snapshot(ctx, "s1")
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "cold start failed too") {
		t.Errorf("snapshot: %v, want the checkpoint's error and the cold start's", err)
	}
	row, _ := n.st.GetSandbox(ctx, "s1")
	if prefix := "checkpoint failed: " + boom.Error() + "; cold start failed too: "; row.Tier != api.TierDetached || row.Transition != "" || !strings.HasPrefix(row.Note, prefix) {
		t.Errorf("row: tier %s transition %q note %q, want detached, none, %q…", row.Tier, row.Transition, row.Note, prefix)
	}
	if e, _ := n.tiers.Lookup("s1"); e.Tier() != api.TierDetached || n.tiers.IsHot("s1") {
		t.Errorf("the node sees it %s (hot to the gateway: %v), want detached", e.Tier(), n.tiers.IsHot("s1"))
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("its volume was not kept: %v", err)
	}
	for _, p := range []string{d.Snapshot(), d.SnapTmp()} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left behind", p)
		}
	}
	if hasBoundary(n, "s1") {
		t.Error("a detached sandbox's boundary is up")
	}
	if c, r := be.logIndex("checkpoint s1"), be.logIndex("remove s1"); c < 0 || r < c || be.logIndex("start s1") >= 0 {
		t.Errorf("want the checkpoint, then the dead container removed, and no start: %q", be.log())
	}
	if st := be.stateOf("s1"); st != sandbox.StateAbsent {
		t.Errorf("its container is %s, want removed", st)
	}
}

// TestFailedResumeBeforeCheckpoint: snapshotting a frozen sandbox resumes
// it first; when that resume fails nothing was saved and its network is
// untouched, so it stays frozen — with its boundary, which a frozen
// sandbox keeps and which no later wake from frozen (a resume) starts
// again: without it the sandbox, once woken, could resolve and reach
// nothing.
func TestFailedResumeBeforeCheckpoint(t *testing.T) {
	be, n := checkpointingNode(t, api.TierFrozen)
	ctx := context.Background()
	boom := errors.New("resume: runsc timed out")
	be.on("resume", func(sandbox.Spec) error { return boom })
	if _, err := n.Snapshot(ctx, "s1"); !errors.Is(err, boom) {
		t.Errorf("snapshot: %v, want the resume's error", err)
	}
	if row, _ := n.st.GetSandbox(ctx, "s1"); row.Tier != api.TierFrozen || row.Transition != "" {
		t.Errorf("row: tier %s transition %q, want frozen, none", row.Tier, row.Transition)
	}
	if be.logIndex("checkpoint") >= 0 {
		t.Errorf("checkpointed after a failed resume: %q", be.log())
	}
	if !hasBoundary(n, "s1") {
		t.Error("its boundary is down after the failed snapshot")
	}
	be.on("resume", nil)
	if err := n.Wake(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if !hasBoundary(n, "s1") {
		t.Error("woken hot without its boundary")
	}
}

// hold makes be's method wait: entered closes when it is called, and it
// returns err once proceed is closed.
func hold(be *fakeBackend, method string, err error) (entered, proceed chan struct{}) {
	entered, proceed = make(chan struct{}), make(chan struct{})
	be.on(method, func(sandbox.Spec) error {
		close(entered)
		<-proceed
		return err
	})
	return entered, proceed
}

// inBackground runs f on a goroutine of its own; its error comes on the
// channel.
func inBackground(f func() error) chan error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	return c
}

// checkpointingNode is a node on a fake backend that can checkpoint,
// holding sandbox s1 in tier with its boundary up, as every transition
// test starts.
func checkpointingNode(t *testing.T, tier api.Tier) (*fakeBackend, *Node) {
	t.Helper()
	be := newFakeBackend()
	be.canCheckpoint = true
	n := fakeNode(t, be, tier)
	sb, _ := n.st.GetSandbox(context.Background(), "s1")
	if err := n.h.BoundaryUp(sb); err != nil {
		t.Fatal(err)
	}
	return be, n
}

// TestSnapshotAnswersBeforeItsCleanup: a snapshot through the API is
// recorded, and answered, as soon as its image is complete; the stopped
// container and the namespace go after the answer, under the sandbox's
// lock, so a wake that comes meanwhile waits for them and restores only
// after the removal. The node's own push off memory (snapshotOrDetach)
// returns only once the container is removed: its memory is freed only
// then. Close waits for a removal in progress.
func TestSnapshotAnswersBeforeItsCleanup(t *testing.T) {
	be, n := checkpointingNode(t, api.TierHot)
	ctx := context.Background()
	removing, proceed := hold(be, "remove", nil)
	answered := make(chan store.Sandbox, 1)
	snapErr := inBackground(func() error {
		sb, err := n.Snapshot(ctx, "s1")
		be.record("snapshot answered")
		answered <- sb
		return err
	})
	var sb store.Sandbox
	select {
	case sb = <-answered:
	case <-time.After(10 * time.Second):
		close(proceed)
		t.Fatalf("no answer while the stopped container's removal is held: the answer waits for it (%q)", be.log())
	}
	if err := <-snapErr; err != nil {
		t.Fatal(err)
	}
	if sb.Tier != api.TierSnapshot || sb.Transition != "" || !n.h.Dir("s1").HasSnapshot() {
		t.Fatalf("answered with tier %s transition %q (image in place: %v), want snapshot", sb.Tier, sb.Transition, n.h.Dir("s1").HasSnapshot())
	}
	<-removing
	be.on("remove", nil) // the wake's own removals (below) go through
	if i, j := be.logIndex("snapshot answered"), be.logIndex("remove s1"); i < 0 || j < i {
		t.Errorf("the answer waited for the removal: %q", be.log())
	}
	woke := inBackground(func() error { err := n.Wake(ctx, "s1"); be.record("wake returned"); return err })
	testenv.WaitFor(t, 5*time.Second, "the wake to wait for the removal", func() bool { return wakePending(n, "s1") })
	closed := make(chan struct{})
	go func() {
		// Close must not return while the removal holds the sandbox.
		n.tiers.Finishing().Wait()
		be.record("finishing done")
		close(closed)
	}()
	if i := be.logIndex("wake returned"); i >= 0 {
		t.Errorf("the wake went on before the removal: %q", be.log())
	}
	close(proceed)
	<-woke
	<-closed
	rm, fin, wk := be.logIndex("remove s1"), be.logIndex("finishing done"), be.logIndex("wake returned")
	if rm < 0 || fin < rm || wk < rm {
		t.Errorf("want the removal, then the wake's end and the finishing count's: %q", be.log())
	}
	// (Its restore cannot mount the template's rootfs here: it ends
	// detached, saying so. That a wake from snapshot restores is e2e's.)

	// The node's own push waits for the removal.
	be2, n2 := checkpointingNode(t, api.TierHot)
	removing2, proceed2 := hold(be2, "remove", nil)
	pushed := inBackground(func() error { _, err := n2.tiers.SnapshotOrDetach(ctx, "s1"); be2.record("push returned"); return err })
	<-removing2
	if i := be2.logIndex("push returned"); i >= 0 {
		t.Errorf("the push returned before the removal: %q", be2.log())
	}
	close(proceed2)
	if err := <-pushed; err != nil {
		t.Fatal(err)
	}
	if sb, _ := n2.st.GetSandbox(ctx, "s1"); sb.Tier != api.TierSnapshot || be2.stateOf("s1") != sandbox.StateAbsent {
		t.Errorf("after the push: tier %s, container %s; want snapshot, removed", sb.Tier, be2.stateOf("s1"))
	}
}
