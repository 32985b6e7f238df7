package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/netns"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// fakeBackend is a sandbox.Backend in memory, for the node's state
// machines: it counts calls, and a call can be held until released or
// made to fail.
type fakeBackend struct {
	mu      sync.Mutex
	state   map[string]sandbox.State
	resumes atomic.Int32
	pauses  atomic.Int32
	hold    chan struct{} // if set, Resume waits for it to close
	failErr error         // if set, Resume fails with it
}

func newFakeBackend() *fakeBackend { return &fakeBackend{state: map[string]sandbox.State{}} }

func (f *fakeBackend) Name() string { return "fake" }
func (f *fakeBackend) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Pause: true, Checkpoint: false}
}
func (f *fakeBackend) Start(_ context.Context, s sandbox.Spec) error {
	f.set(s.ID, sandbox.StateRunning)
	return nil
}
func (f *fakeBackend) Pause(_ context.Context, s sandbox.Spec) error {
	f.pauses.Add(1)
	f.set(s.ID, sandbox.StatePaused)
	return nil
}
func (f *fakeBackend) Resume(_ context.Context, s sandbox.Spec) error {
	f.resumes.Add(1)
	if f.hold != nil {
		<-f.hold
	}
	if f.failErr != nil {
		return f.failErr
	}
	f.set(s.ID, sandbox.StateRunning)
	return nil
}
func (f *fakeBackend) Checkpoint(context.Context, sandbox.Spec, string) error {
	return sandbox.ErrNotSupported
}
func (f *fakeBackend) Restore(context.Context, sandbox.Spec, string) error {
	return sandbox.ErrNotSupported
}
func (f *fakeBackend) Remove(_ context.Context, s sandbox.Spec) error {
	f.mu.Lock()
	delete(f.state, s.ID)
	f.mu.Unlock()
	return nil
}
func (f *fakeBackend) State(_ context.Context, s sandbox.Spec) (sandbox.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.state[s.ID]; ok {
		return st, nil
	}
	return sandbox.StateStopped, nil
}
func (f *fakeBackend) List(context.Context) ([]string, error) { return nil, nil }
func (f *fakeBackend) set(id string, st sandbox.State) {
	f.mu.Lock()
	f.state[id] = st
	f.mu.Unlock()
}

// fakeNode is a node over be with a store of its own and one sandbox, id
// "s1", recorded in tier.
func fakeNode(t *testing.T, be *fakeBackend, tier api.Tier) *Node {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pool, err := netns.ParsePool("10.199.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(Config{Name: "n", DataDir: t.TempDir(), Backend: be, Store: st, Pool: pool,
		GatewayBind: netip.MustParseAddr("127.0.0.1"), PortMin: 31000, PortMax: 31010,
		MemAvailable: func() (int64, error) { return 100000, nil }, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	ctx := context.Background()
	if err := st.PutTemplate(ctx, store.Template{Name: "t", Rootfs: "/", Process: api.Process{Args: []string{"/x"}}}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "s1", Name: "one", Template: "t", Node: "n", Tier: tier, HostPorts: map[int]int{}}); err != nil {
		t.Fatal(err)
	}
	n.entry("s1").setTier(tier)
	if tier == api.TierFrozen {
		be.set("s1", sandbox.StatePaused)
	}
	return n
}

// TestWakeCoalesces: many requests for one frozen sandbox at once share
// one wake — one resume — and all of them get its result; the tier and
// the wake's origin are recorded once.
func TestWakeCoalesces(t *testing.T) {
	be := newFakeBackend()
	be.hold = make(chan struct{})
	n := fakeNode(t, be, api.TierFrozen)
	const callers = 10
	errs := make(chan error, callers)
	for i := 0; i < callers; i++ {
		go func() { errs <- n.Wake(context.Background(), "s1") }()
	}
	// Every caller is in: one holds the wake, the others wait on it.
	deadline := time.Now().Add(5 * time.Second)
	for be.resumes.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(be.hold)
	for i := 0; i < callers; i++ {
		if err := <-errs; err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if k := be.resumes.Load(); k != 1 {
		t.Errorf("%d resumes for %d concurrent wakes, want 1", k, callers)
	}
	sb, _ := n.st.GetSandbox(context.Background(), "s1")
	if sb.Tier != api.TierHot || sb.LastWakeFrom != api.TierFrozen || sb.Transition != "" {
		t.Errorf("after the wake: tier %s from %s transition %q", sb.Tier, sb.LastWakeFrom, sb.Transition)
	}
	if !n.IsHot("s1") {
		t.Error("the gateway does not see it hot")
	}
}

// TestWakeFailureReachesEveryCaller: a wake that fails fails for every
// caller that shared it, with the backend's error, and leaves a note.
func TestWakeFailureReachesEveryCaller(t *testing.T) {
	be := newFakeBackend()
	be.hold = make(chan struct{})
	be.failErr = errors.New("resume: sandbox gone")
	n := fakeNode(t, be, api.TierFrozen)
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() { errs <- n.Wake(context.Background(), "s1") }()
	}
	for be.resumes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(be.hold)
	for i := 0; i < 3; i++ {
		if err := <-errs; err == nil || !errors.Is(err, be.failErr) {
			t.Errorf("caller %d: %v, want the backend's error", i, err)
		}
	}
	if k := be.resumes.Load(); k != 1 {
		t.Errorf("%d resumes, want 1", k)
	}
	if sb, _ := n.st.GetSandbox(context.Background(), "s1"); sb.Note == "" || sb.Transition != "" {
		t.Errorf("after a failed wake: note %q transition %q", sb.Note, sb.Transition)
	}
}

// TestTransitionErrors: the error map at the seam's inside — a freeze of
// a frozen sandbox is a no-op, a freeze of a detached one a conflict, a
// snapshot on a backend that cannot checkpoint not supported, an unknown
// sandbox not found.
func TestTransitionErrors(t *testing.T) {
	be := newFakeBackend()
	n := fakeNode(t, be, api.TierFrozen)
	ctx := context.Background()
	if sb, err := n.Freeze(ctx, "s1"); err != nil || sb.Tier != api.TierFrozen || be.pauses.Load() != 0 {
		t.Errorf("freeze of a frozen one: %+v %v (pauses %d)", sb.Tier, err, be.pauses.Load())
	}
	if _, err := n.Snapshot(ctx, "s1"); !errors.Is(err, ErrNotSupported) {
		t.Errorf("snapshot without checkpoint: %v", err)
	}
	if _, err := n.Get(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	n2 := fakeNode(t, newFakeBackend(), api.TierDetached)
	if _, err := n2.Freeze(ctx, "s1"); !errors.Is(err, ErrConflict) {
		t.Errorf("freeze of a detached one: %v", err)
	}
}
