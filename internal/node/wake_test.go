package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/gateway"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// fakeBackend is a sandbox.Backend in memory, for the node's state
// machines. It keeps one state per container (what runsc would report),
// writes every call it gets to an ordered log (the tests add their own
// lines to the same log, so orders across the backend, the gateway and a
// sandbox's server can be asserted), and any call can be made to block or
// fail on demand by a hook (on), so that tests order events by conditions
// and channels, never by sleeping.
type fakeBackend struct {
	mu       sync.Mutex
	state    map[string]sandbox.State
	stateErr map[string]error // State fails for these IDs
	calls    []string         // "checkpoint s1", … in the order they came
	hooks    map[string]func(sandbox.Spec) error

	resumes atomic.Int32
	pauses  atomic.Int32
	// canCheckpoint is the Checkpoint capability it reports (off: the
	// node must refuse snapshots, TestTransitionErrors).
	canCheckpoint bool
}

func newFakeBackend() *fakeBackend {
	return &fakeBackend{state: map[string]sandbox.State{}, stateErr: map[string]error{}, hooks: map[string]func(sandbox.Spec) error{}}
}

// on makes every later call of method ("start", "pause", "resume",
// "checkpoint", "restore", "remove") run fn after it is logged and before
// it takes effect: fn may block (on a channel of the test's), look at the
// node, or fail the call by returning an error.
func (f *fakeBackend) on(method string, fn func(sandbox.Spec) error) {
	f.mu.Lock()
	f.hooks[method] = fn
	f.mu.Unlock()
}

// call logs method for spec and runs its hook, without f.mu held (a hook
// may block while other calls go on).
func (f *fakeBackend) call(method string, s sandbox.Spec) error {
	f.mu.Lock()
	f.calls = append(f.calls, method+" "+s.ID)
	fn := f.hooks[method]
	f.mu.Unlock()
	if fn != nil {
		return fn(s)
	}
	return nil
}

// record adds a line of the test's own to the call log.
func (f *fakeBackend) record(format string, args ...any) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

// log returns the call log so far.
func (f *fakeBackend) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// logIndex is the position of the first line of the call log starting
// with prefix, -1 if none.
func (f *fakeBackend) logIndex(prefix string) int {
	for i, l := range f.log() {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

func (f *fakeBackend) Name() string { return "fake" }
func (f *fakeBackend) Capabilities() sandbox.Capabilities {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sandbox.Capabilities{Pause: true, Checkpoint: f.canCheckpoint, Why: "the fake was told it cannot"}
}
func (f *fakeBackend) Start(_ context.Context, s sandbox.Spec) error {
	if err := f.call("start", s); err != nil {
		return err
	}
	f.set(s.ID, sandbox.StateRunning)
	return nil
}
func (f *fakeBackend) Pause(_ context.Context, s sandbox.Spec) error {
	f.pauses.Add(1)
	if err := f.call("pause", s); err != nil {
		return err
	}
	f.set(s.ID, sandbox.StatePaused)
	return nil
}
func (f *fakeBackend) Resume(_ context.Context, s sandbox.Spec) error {
	f.resumes.Add(1)
	if err := f.call("resume", s); err != nil {
		return err
	}
	f.set(s.ID, sandbox.StateRunning)
	return nil
}

// Checkpoint, like runsc checkpoint, writes an image into imageDir and
// stops the container.
func (f *fakeBackend) Checkpoint(_ context.Context, s sandbox.Spec, imageDir string) error {
	if err := f.call("checkpoint", s); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, "pages.img"), []byte("fake"), 0o600); err != nil {
		return err
	}
	f.set(s.ID, sandbox.StateStopped)
	return nil
}

// CheckpointLeaving, like runsc checkpoint without the delete, writes an
// image and stops the container, whose process lingers and says "running"
// until it is removed (sandbox.CheckpointLeaver). It is logged and hooked
// as "checkpoint".
func (f *fakeBackend) CheckpointLeaving(_ context.Context, s sandbox.Spec, imageDir string) error {
	if err := f.call("checkpoint", s); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, "pages.img"), []byte("fake"), 0o600); err != nil {
		return err
	}
	f.set(s.ID, sandbox.StateRunning)
	return nil
}

func (f *fakeBackend) Restore(_ context.Context, s sandbox.Spec, _ string) error {
	if err := f.call("restore", s); err != nil {
		return err
	}
	f.set(s.ID, sandbox.StateRunning)
	return nil
}
func (f *fakeBackend) Remove(_ context.Context, s sandbox.Spec) error {
	if err := f.call("remove", s); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.state, s.ID)
	f.mu.Unlock()
	return nil
}

// State is what was set; a container it has no record of is absent.
func (f *fakeBackend) State(_ context.Context, s sandbox.Spec) (sandbox.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.stateErr[s.ID]; err != nil {
		return "", err
	}
	if st, ok := f.state[s.ID]; ok {
		return st, nil
	}
	return sandbox.StateAbsent, nil
}

// List is every container it has a record of (running, paused or stopped).
func (f *fakeBackend) List(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.state))
	for id := range f.state {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}
func (f *fakeBackend) set(id string, st sandbox.State) {
	f.mu.Lock()
	f.state[id] = st
	f.mu.Unlock()
}
func (f *fakeBackend) stateOf(id string) sandbox.State {
	st, _ := f.State(context.Background(), sandbox.Spec{ID: id})
	return st
}

// The fake node's network needs no root. Its pool is a loopback subnet,
// so a sandbox's two addresses are on this machine without a namespace
// or veth: the host end (slot·4+1) is where the node starts the sandbox's
// boundary, and the sandbox end (slot·4+2) is where a test runs the
// sandbox's server (serveSandbox), reached through the node's real
// gateway. The boundary's ports are unprivileged, and the gateway's
// connections carry no mark (SO_MARK needs CAP_NET_ADMIN). Nothing here
// creates a namespace or veth; deleting ones that do not exist (every
// checkpoint and teardown does) is a no-op for any user.
const fakeSubnet = "127.78.0.0/16"

var fakeFirewall = netns.Firewall{IfPrefix: VethPrefix, Synthetic: netip.MustParsePrefix("169.254.64.0/18"),
	ProxyPort: 21080, DNSPort: 21053, TransparentPort: 21001}

// fakeDrainWait is how long the fake node's gateway waits for a request
// in flight before a checkpoint cuts it (5 s in production).
const fakeDrainWait = 50 * time.Millisecond

// newFakeNode is a node over be with a store of its own, template "t"
// and no sandbox.
func newFakeNode(t *testing.T, be *fakeBackend) *Node {
	t.Helper()
	return newFakeNodeWith(t, be, nil)
}

// newFakeNodeWith is newFakeNode with its Config changed by adjust first.
func newFakeNodeWith(t *testing.T, be *fakeBackend, adjust func(*Config)) *Node {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pool, err := netns.ParsePool(fakeSubnet)
	if err != nil {
		t.Fatal(err)
	}
	// Short: a boundary's socket is <data dir>/sandboxes/<id>/agent.sock,
	// and a Unix socket's path has 108 bytes (t.TempDir's carries the
	// test's name).
	dataDir, err := os.MkdirTemp("", "node")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{Name: "n", DataDir: dataDir, Backend: be, Store: st, Pool: pool,
		GatewayBind: netip.MustParseAddr("127.0.0.1"), PortMin: 31000, PortMax: 31010, SAM: SAM{Firewall: fakeFirewall},
		MemAvailable: func() (int64, error) { return 100000, nil }, Log: log}
	if adjust != nil {
		adjust(&cfg)
		log = cfg.Log
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The same gateway, with timeouts a test can wait out.
	n.gw = gateway.New(gateway.Config{Admission: 2 * time.Second, Ready: time.Second, DrainWait: fakeDrainWait}, n.tiers, log)
	n.tiers.SetGateway(n.gw)
	t.Cleanup(n.Close)
	// The template's rootfs does not exist, so a cold start or a restore
	// fails at its overlay mount, with or without root (with root, a real
	// rootfs would go on to make a real namespace and veth on the host).
	if err := st.PutTemplate(context.Background(), store.Template{Name: "t", Rootfs: filepath.Join(t.TempDir(), "no-rootfs"),
		Process: api.Process{Args: []string{"/x"}}}); err != nil {
		t.Fatal(err)
	}
	return n
}

// addFakeSandbox records sandbox id of template "t" in address slot slot
// and tier, and gives it the container that tier has (running when hot,
// paused when frozen, none otherwise).
func addFakeSandbox(t *testing.T, n *Node, be *fakeBackend, id string, slot int, tier api.Tier) store.Sandbox {
	t.Helper()
	sb := store.Sandbox{ID: id, Name: "name-" + id, Template: "t", Node: "n", Tier: tier, Slot: slot, HostPorts: map[int]int{}}
	if err := n.st.CreateSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(string(n.h.Dir(id)), 0o700); err != nil {
		t.Fatal(err)
	}
	n.tiers.Entry(id).SetTier(tier)
	switch tier {
	case api.TierHot:
		be.set(id, sandbox.StateRunning)
	case api.TierFrozen:
		be.set(id, sandbox.StatePaused)
	}
	return sb
}

// fakeNode is a node over be with one sandbox, id "s1", recorded in tier.
func fakeNode(t *testing.T, be *fakeBackend, tier api.Tier) *Node {
	t.Helper()
	n := newFakeNode(t, be)
	addFakeSandbox(t, n, be, "s1", 0, tier)
	return n
}

// serveSandbox runs h as sandbox id's server, on the sandbox's own address
// (a loopback one here) at a port of its own, records that port in the
// sandbox's row and opens its gateway listener. It returns the gateway's
// URL for it and a client of the test's own (no connection shared with
// another test).
func serveSandbox(t *testing.T, n *Node, id string, h http.Handler) (string, *http.Client) {
	t.Helper()
	ctx := context.Background()
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := n.h.Net(id, sb.Slot)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(nw.Sandbox.Addr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	// A free gateway port: the gateway does not say which port it got
	// for a 0.
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gport := gl.Addr().(*net.TCPAddr).Port
	gl.Close()
	sb, err = n.st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		s.HostPorts = map[int]int{ln.Addr().(*net.TCPAddr).Port: gport}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.listen(sb); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return fmt.Sprintf("http://127.0.0.1:%d", gport), &http.Client{Transport: tr}
}

// get is "<status> <body>" of a GET of url, or the error.
func get(c *http.Client, url string) string {
	resp, err := c.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

// wakePending reports whether a wake of id has begun and not ended: with a
// transition holding the sandbox's lock, one that waits for it.
func wakePending(n *Node, id string) bool {
	e, ok := n.tiers.Lookup(id)
	if !ok {
		return false
	}
	waking, _ := e.Waking()
	return waking
}

// wakeSharers is how many callers wait on the wake of id in progress
// besides the one running it (-1: none in progress).
func wakeSharers(n *Node, id string) int {
	e, ok := n.tiers.Lookup(id)
	if !ok {
		return -1
	}
	waking, shared := e.Waking()
	if !waking {
		return -1
	}
	return shared
}

// hasBoundary reports whether sandbox id's boundary is up.
func hasBoundary(n *Node, id string) bool {
	return n.bounds.Has(id)
}

// TestWakeCoalesces: many requests for one frozen sandbox at once share
// one wake — one resume — and all of them get its result; the tier and
// the wake's origin are recorded once.
func TestWakeCoalesces(t *testing.T) {
	be := newFakeBackend()
	entered, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	be.on("resume", func(sandbox.Spec) error {
		once.Do(func() { close(entered) })
		<-hold
		return nil
	})
	n := fakeNode(t, be, api.TierFrozen)
	const callers = 10
	errs := make(chan error, callers)
	for i := 0; i < callers; i++ {
		go func() { errs <- n.Wake(context.Background(), "s1") }()
	}
	// One caller holds the wake; it ends only once all the others wait
	// on it.
	<-entered
	testenv.WaitFor(t, 5*time.Second, "every caller to share the wake", func() bool { return wakeSharers(n, "s1") == callers-1 })
	close(hold)
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
	if !n.tiers.IsHot("s1") {
		t.Error("the gateway does not see it hot")
	}
}

// TestWakeFailureReachesEveryCaller: a wake that fails fails for every
// caller that shared it, with the backend's error, and leaves a note.
func TestWakeFailureReachesEveryCaller(t *testing.T) {
	be := newFakeBackend()
	fail := errors.New("resume: sandbox gone")
	entered, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	be.on("resume", func(sandbox.Spec) error {
		once.Do(func() { close(entered) })
		<-hold
		return fail
	})
	n := fakeNode(t, be, api.TierFrozen)
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() { errs <- n.Wake(context.Background(), "s1") }()
	}
	// Failed only once every caller shares it: one arriving after it
	// would start a wake of its own.
	<-entered
	testenv.WaitFor(t, 5*time.Second, "every caller to share the wake", func() bool { return wakeSharers(n, "s1") == 2 })
	close(hold)
	for i := 0; i < 3; i++ {
		if err := <-errs; err == nil || !errors.Is(err, fail) {
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
	if _, err := n.Snapshot(ctx, "s1"); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("snapshot without checkpoint: %v", err)
	}
	if _, err := n.Get(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	n2 := fakeNode(t, newFakeBackend(), api.TierDetached)
	if _, err := n2.Freeze(ctx, "s1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("freeze of a detached one: %v", err)
	}
}

// TestCreateRefusalIsLogged: a create the node turns away for want of
// room is refused in the daemon's own log too, with the answer's reason,
// not only in the answer (an operator reading why a fill stopped has the
// log, not the client's 503s).
func TestCreateRefusalIsLogged(t *testing.T) {
	var logBuf testenv.SyncBuffer
	be := newFakeBackend()
	n := newFakeNodeWith(t, be, func(c *Config) {
		// 100,000 MiB available, all of it reserved: no room, and nothing
		// to push to disk.
		c.MemReserveMiB = 100000
		c.Admission = time.Millisecond
		c.Log = slog.New(slog.NewTextHandler(&logBuf, nil))
	})
	tpl, err := n.st.GetTemplate(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.Create(context.Background(), tpl, "refused", "", 0, 0, nil, nil)
	if !errors.Is(err, errdefs.ErrNoRoom) {
		t.Fatalf("create with no memory above the reserve: %v, want no room", err)
	}
	log := logBuf.String()
	if !strings.Contains(log, "create refused") || !strings.Contains(log, "name=refused") || !strings.Contains(log, "not enough memory for sandbox") {
		t.Errorf("the daemon's log does not say the create was refused, and why:\n%s", log)
	}
	// A create that fails for another reason is not a refusal.
	before := len(logBuf.String())
	_, err = n.Create(context.Background(), tpl, "-bad-", "", -1, 0, nil, nil)
	if after := logBuf.String()[before:]; err == nil || errors.Is(err, errdefs.ErrNoRoom) || strings.Contains(after, "create refused") {
		t.Errorf("a bad create (%v) was logged as a refusal: %s", err, after)
	}
}

// TestQueuedCreateGivesUpCleanly: while every start slot is taken
// (MaxStarts), a create waits; a caller that gives up while waiting is
// refused (503, not 500) and leaves no row, promise or slot behind.
func TestQueuedCreateGivesUpCleanly(t *testing.T) {
	be := newFakeBackend()
	n := newFakeNode(t, be)
	for range cap(n.starts) {
		n.starts <- struct{}{}
	}
	tpl, err := n.st.GetTemplate(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = n.Create(ctx, tpl, "queued", "", 0, 0, nil, nil)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("create while every start slot is taken, caller gone: %v, want ErrRefused", err)
	}
	if sbs, _ := n.st.ListSandboxes(context.Background(), ""); len(sbs) != 0 {
		t.Errorf("a create that never started left %d rows", len(sbs))
	}
	if got := n.adm.Promised(); got != 0 {
		t.Errorf("a create that never started still holds %d MiB promised", got)
	}
	if len(be.log()) != 0 {
		t.Errorf("backend was called: %v", be.log())
	}
}

// TestSettledSizesOutliveTheNode: what a template build's sandboxes
// settled at is kept in the data dir (0600) and priced into the next
// node's first create there; a file that cannot be read is said in the
// log and costs only that (starts count at their limit).
func TestSettledSizesOutliveTheNode(t *testing.T) {
	be := newFakeBackend()
	n := newFakeNode(t, be)
	tpl, err := n.st.GetTemplate(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	if e := n.adm.Expected(reserve.SizeKey(tpl), 1024); e != 1024 {
		t.Fatalf("nothing learned yet: a start counts %d MiB, want its limit", e)
	}
	n.settled.Learned(reserve.SizeKey(tpl), 24)
	fi, err := os.Stat(filepath.Join(n.cfg.DataDir, "settled-sizes.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("settled sizes file: %v %v", fi, err)
	}
	m := newFakeNodeWith(t, be, func(c *Config) { c.DataDir = n.cfg.DataDir })
	if e := m.adm.Expected(reserve.SizeKey(tpl), 1024); e != 30 {
		t.Errorf("the next node on this data dir counts a start at %d MiB, want 30 (24 + 25 %%)", e)
	}
	other := tpl
	other.Digest = "another-build"
	if e := m.adm.Expected(reserve.SizeKey(other), 1024); e != 1024 {
		t.Errorf("another build of the template counts %d MiB, want its limit", e)
	}

	var logBuf testenv.SyncBuffer
	os.WriteFile(filepath.Join(n.cfg.DataDir, "settled-sizes.json"), []byte("{not json"), 0o600)
	k := newFakeNodeWith(t, be, func(c *Config) {
		c.DataDir = n.cfg.DataDir
		c.Log = slog.New(slog.NewTextHandler(&logBuf, nil))
	})
	if e := k.adm.Expected(reserve.SizeKey(tpl), 1024); e != 1024 || !strings.Contains(logBuf.String(), "settled sizes are unreadable") {
		t.Errorf("an unreadable file: a start counts %d MiB; log: %s", e, logBuf.String())
	}
}
