package fleet

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/testenv"

	"sandstorm/api"
	"sandstorm/internal/nodeapi"
	noderemote "sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/pki"
	"sandstorm/internal/store"
)

// node is a fake node: it reports the headroom it is given and takes or
// refuses creates as told.
type node struct {
	nodeapi.Node // unused methods panic
	name         string
	availMiB     int64
	refuse       bool
	mu           sync.Mutex
	made         []string
	rootfs       map[string]bool // digests it holds (nil: it needs none)
	sent         int             // rootfs trees it was sent
	hang         chan struct{}   // while open, List, Get, Status and a new Watch hang (a node that does not answer)
	srv          *httptest.Server
	gens         map[string]int64 // name → the generation it was made under
	// onCreate, if set, runs in Create before (made false) or after
	// (made true) the sandbox is made; an error from it is the answer.
	onCreate func(made bool) error
	// onDelete, if set, runs in Delete before the sandbox goes.
	onDelete func()
	deletes  int // Delete calls
	fences   []nodeapi.FenceRequest
	// layers, if set, keeps the image layers it is sent (layers_test.go)
	// and makes trees of them.
	layers *layerNode
}

// box is sandbox name as n shows it.
func (n *node) box(name string) api.Sandbox {
	return api.Sandbox{ID: n.name + "-" + name, Name: name, Node: n.name, Tier: api.TierHot, Generation: n.gens[name]}
}

// Watch reports as a node does: all it has, then a heartbeat with its
// status, every 100 ms.
func (n *node) Watch(ctx context.Context, send func(nodeapi.Report) error) error {
	n.wait(ctx)
	n.mu.Lock()
	var all []api.Sandbox
	for _, name := range n.made {
		all = append(all, n.box(name))
	}
	n.mu.Unlock()
	st := api.NodeStatus{Name: n.name, MemAvailableMiB: n.availMiB, State: "ready"}
	if err := send(nodeapi.Report{Full: true, Sandboxes: all, Status: &st}); err != nil {
		return err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := send(nodeapi.Report{Status: &st}); err != nil {
				return err
			}
		}
	}
}

// wait hangs while n.hang is open.
func (n *node) wait(ctx context.Context) {
	if n.hang != nil {
		select {
		case <-n.hang:
		case <-ctx.Done():
		}
	}
}
func (n *node) List(ctx context.Context) ([]api.Sandbox, error) {
	n.wait(ctx)
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []api.Sandbox
	for _, name := range n.made {
		out = append(out, n.box(name))
	}
	return out, nil
}

func (n *node) Name() string { return n.name }
func (n *node) Fence(_ context.Context, req nodeapi.FenceRequest) (nodeapi.FenceResult, error) {
	n.mu.Lock()
	n.fences = append(n.fences, req)
	n.mu.Unlock()
	return nodeapi.FenceResult{}, nil
}

func (n *node) lastFence() (nodeapi.FenceRequest, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.fences) == 0 {
		return nodeapi.FenceRequest{}, 0
	}
	return n.fences[len(n.fences)-1], len(n.fences)
}
func (n *node) DropTemplate(context.Context, string) error { return nil }
func (n *node) Status(ctx context.Context) (api.NodeStatus, error) {
	n.wait(ctx)
	return api.NodeStatus{Name: n.name, MemAvailableMiB: n.availMiB, State: "ready"}, nil
}
func (n *node) Create(_ context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	if n.refuse {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrNoRoom, fmt.Errorf("node short on memory on %s", n.name))
	}
	if n.onCreate != nil {
		if err := n.onCreate(false); err != nil {
			return api.Sandbox{}, err
		}
	}
	n.mu.Lock()
	n.made = append(n.made, req.Name)
	if n.gens == nil {
		n.gens = map[string]int64{}
	}
	n.gens[req.Name] = req.Generation
	sb := n.box(req.Name)
	n.mu.Unlock()
	if n.onCreate != nil {
		if err := n.onCreate(true); err != nil {
			return api.Sandbox{}, err
		}
	}
	return sb, nil
}

// Delete removes the sandbox of that ID from what n made.
func (n *node) Delete(_ context.Context, id string) error {
	if n.onDelete != nil {
		n.onDelete()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.deletes++
	for i, name := range n.made {
		if n.name+"-"+name == id {
			n.made = slices.Delete(n.made, i, i+1)
			return nil
		}
	}
	return errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found", id)
}

func (n *node) PrepareTemplate(_ context.Context, t api.Template) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rootfs != nil && !n.rootfs[t.Digest] && !n.fromLayers(t) {
		return errdefs.Mark(errdefs.ErrPrecondition, fmt.Errorf("no rootfs %s on %s", t.Digest, n.name))
	}
	if t.Rootfs != "" {
		return fmt.Errorf("a master's path crossed the seam: %s", t.Rootfs)
	}
	return nil
}

// PutRootfs keeps a digest only if what arrived hashes to it, as a
// node's rootfs.Cache does.
func (n *node) PutRootfs(_ context.Context, d string, r io.Reader) error {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d {
		return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("rootfs digest mismatch: sent as %s, received %s", d, got))
	}
	n.mu.Lock()
	n.rootfs[d] = true
	n.sent++
	n.mu.Unlock()
	return nil
}
func (n *node) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	n.wait(ctx)
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range n.made {
		if ref == name || ref == n.name+"-"+name {
			return n.box(name), nil
		}
	}
	return api.Sandbox{}, errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("sandbox %q: not found", ref))
}

// fleetOf is a fleet whose local node is local and whose one paired node
// is remote, served over the seam's mutual TLS on loopback.
func fleetOf(t *testing.T, local, remote *node) *Fleet {
	t.Helper()
	f, _ := runningFleet(t, local, remote)
	return f
}

// runningFleet is fleetOf with the function that stops the fleet: a
// test that starts a server of its own after the fleet must stop the
// fleet before it closes that server, because httptest.Server.Close
// waits for every request in flight, and a watcher's report stream is
// one until the fleet stops (CI at 1b8c387 hung 25 minutes there).
func runningFleet(t *testing.T, local, remote *node) (*Fleet, context.CancelFunc) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, _ := pki.EnsureCA(t.TempDir())
	scfg, _ := ca.PeerServerConfig("node "+remote.name, []string{"127.0.0.1"}, pki.MasterName)
	srv := httptest.NewUnstartedServer(noderemote.Server(remote))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Listener = tls.NewListener(srv.Listener, scfg)
	srv.Start()
	remote.srv = srv
	t.Cleanup(srv.Close)
	if err := st.PutNode(context.Background(), store.Node{Name: remote.name, Address: srv.Listener.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	f, err := New(context.Background(), Config{Store: st, CA: ca, Local: local, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go f.Run(ctx)
	for _, n := range []*node{local, remote} {
		testenv.WaitFor(t, 10*time.Second, n.name+" reports", func() bool { l, ok := f.linkOf(n.name); return ok && l.full })
		testenv.WaitFor(t, 10*time.Second, n.name+" is fenced", func() bool { _, k := n.lastFence(); return k > 0 })
	}
	return f, cancel
}

// TestCreatePlacesByHeadroomAndRetries: a sandbox goes to the node with
// the most headroom; when that node refuses, to the next, which the
// master then remembers as its node; when every node refuses, the answer
// is ErrUnavailable (503) naming each refusal.
func TestCreatePlacesByHeadroomAndRetries(t *testing.T) {
	ctx := context.Background()
	local := &node{name: "local", availMiB: 8000}
	remote := &node{name: "far", availMiB: 2000}
	f := fleetOf(t, local, remote)

	sb, err := f.Create(ctx, nodeapi.CreateRequest{Name: "a"})
	if err != nil || sb.Node != "local" {
		t.Fatalf("with local roomiest: %+v %v", sb, err)
	}
	if n, sb, err := f.Find(ctx, "a"); err != nil || n.Name() != "local" || sb.Name != "a" {
		t.Errorf("a is found on %v: %+v (%v)", n, sb, err)
	}

	local.refuse = true // the roomiest refuses: the next takes it
	sb, err = f.Create(ctx, nodeapi.CreateRequest{Name: "b"})
	if err != nil || sb.Node != "far" {
		t.Fatalf("local refusing: %+v %v", sb, err)
	}
	if n, sb, err := f.Find(ctx, "b"); err != nil || n.Name() != "far" || sb.Node != "far" {
		t.Errorf("b's node: %v %+v %v", n, sb, err)
	}
	if _, _, err := f.Find(ctx, "nowhere"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an unknown sandbox: %v", err)
	}
	if _, err := f.Create(ctx, nodeapi.CreateRequest{Name: "b"}); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a paired node's sandbox name is not taken: %v", err)
	}

	remote.availMiB = 90000 // now the roomiest
	local.refuse = false
	if sb, _ := f.Create(ctx, nodeapi.CreateRequest{Name: "c"}); sb.Node != "far" {
		t.Errorf("with the paired node roomiest, c went to %s", sb.Node)
	}

	local.refuse, remote.refuse = true, true
	_, err = f.Create(ctx, nodeapi.CreateRequest{Name: "d"})
	if !errors.Is(err, errdefs.ErrNoRoom) || !strings.Contains(err.Error(), "on local") || !strings.Contains(err.Error(), "on far") {
		t.Errorf("every node refusing: %v", err)
	}
}

// TestLostNodeIsSkipped: a paired node that does not answer is "lost" in
// the statuses, with why, and is never placed on (e2e TestFleet lists its
// sandboxes as lost).
func TestLostNodeIsSkipped(t *testing.T) {
	ctx := context.Background()
	local := &node{name: "local", availMiB: 100}
	remote := &node{name: "far", availMiB: 9000}
	f := fleetOf(t, local, remote)
	if sb, _ := f.Create(ctx, nodeapi.CreateRequest{Name: "x"}); sb.Node != "far" {
		t.Fatalf("x went to %s", sb.Node)
	}
	// The node goes away: its connections are cut and its address
	// answers nothing; its report stream ends, so it is lost at once.
	f.mu.Lock()
	f.nodes["far"].(*noderemote.Client).Base = "https://127.0.0.1:1"
	f.mu.Unlock()
	remote.srv.CloseClientConnections()
	testenv.WaitFor(t, 10*time.Second, "far lost", func() bool {
		for _, st := range f.Statuses(ctx) {
			if st.Name == "far" {
				return st.State == "lost" && st.Error != ""
			}
		}
		return false
	})
	all, err := f.List(ctx)
	if err != nil || len(all) != 1 || all[0].Tier != api.TierLost || !strings.Contains(all[0].Note, "does not answer") {
		t.Errorf("x on a lost node: %+v %v", all, err)
	}
	if sb, err := f.Create(ctx, nodeapi.CreateRequest{Name: "y"}); err != nil || sb.Node != "local" {
		t.Errorf("with the roomy node lost: %+v %v", sb, err)
	}
}

// TestPrepareSendsTheRootfsOnce: a paired node that lacks a template's
// rootfs is sent it over the seam, packed from the master's tree, once;
// the seam never carries the master's path; a tree changed since it was
// registered no longer matches its digest and the node refuses it.
func TestPrepareSendsTheRootfsOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "srv"), 0o755)
	os.WriteFile(filepath.Join(dir, "srv", "app.py"), []byte("print('hi')\n"), 0o644)
	d, err := rootfs.Digest(dir)
	if err != nil {
		t.Fatal(err)
	}
	local := &node{name: "local"}
	remote := &node{name: "far", rootfs: map[string]bool{}}
	f := fleetOf(t, local, remote)
	tmpl := store.Template{Name: "web", Rootfs: dir, Digest: d}
	for i := 0; i < 2; i++ {
		if err := f.PrepareTemplate(ctx, tmpl); err != nil {
			t.Fatalf("prepare %d: %v", i, err)
		}
	}
	if remote.sent != 1 || !remote.rootfs[d] {
		t.Errorf("the rootfs was sent %d times (want once): %v", remote.sent, remote.rootfs)
	}
	os.WriteFile(filepath.Join(dir, "srv", "app.py"), []byte("print('changed')\n"), 0o644)
	fresh := &node{name: "other", rootfs: map[string]bool{}}
	g := fleetOf(t, &node{name: "local"}, fresh)
	err = g.PrepareTemplate(ctx, tmpl)
	if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "mismatch") || fresh.sent != 0 {
		t.Errorf("a tree changed since it was registered: %v (sent %d)", err, fresh.sent)
	}
}

// TestReadsNeverWaitOnANode: with a paired node that answers no call
// (its List, Get and Status hang) but still reports, a list, a GET and
// the node statuses come from its reports, at once; what it reports
// shows there.
func TestReadsNeverWaitOnANode(t *testing.T) {
	ctx := context.Background()
	local := &node{name: "local", availMiB: 100}
	remote := &node{name: "far", availMiB: 9000}
	f := fleetOf(t, local, remote)
	if sb, err := f.Create(ctx, nodeapi.CreateRequest{Name: "x"}); err != nil || sb.Node != "far" {
		t.Fatalf("x: %+v %v", sb, err)
	}
	remote.hang = make(chan struct{})
	defer close(remote.hang)
	// A master that has just started shows what was last reported, not
	// "lost", while its node has not yet reported to it (the node's
	// stream to it is held back by hang).
	g, err := New(ctx, Config{Store: f.cfg.Store, CA: f.cfg.CA, Log: f.cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go g.Run(gctx)
	testenv.WaitFor(t, 10*time.Second, "the new master hears far", func() bool { _, ok := g.linkOf("far"); return ok })
	if all, err := g.List(ctx); err != nil || len(all) != 1 || all[0].Tier != api.TierHot {
		t.Errorf("list from a master just started: %+v %v", all, err)
	}
	// Bounded, so that a read that asked the node fails here rather than
	// hang until the test binary's timeout.
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	defer rcancel()
	if _, sb, err := f.Find(rctx, "x"); err != nil || sb.ID != "far-x" {
		t.Errorf("GET x with its node not answering calls: %+v %v", sb, err)
	}
	all, err := f.List(rctx)
	if err != nil || len(all) != 1 || all[0].ID != "far-x" || all[0].Tier == api.TierLost {
		t.Errorf("list: %+v %v", all, err)
	}
	for _, st := range f.Statuses(rctx) {
		if st.Name == "far" && (st.State != "ready" || st.MemAvailableMiB != 9000) {
			t.Errorf("far's status from its heartbeat: %+v", st)
		}
	}
	// What the node reports is what the master shows.
	frozen := api.Sandbox{ID: "far-x", Name: "x", Node: "far", Tier: api.TierFrozen}
	l := f.links["far"]
	if err := f.apply(ctx, "far", l, nodeapi.Report{Event: &events.Event{Kind: events.Transition, ID: "far-x"}, Sandbox: &frozen}); err != nil {
		t.Fatal(err)
	}
	if _, sb, _ := f.Find(rctx, "far-x"); sb.Tier != api.TierFrozen {
		t.Errorf("after a report of it frozen: %+v", sb)
	}
	f.apply(ctx, "far", l, nodeapi.Report{Gone: "far-x"})
	if all, _ := f.List(ctx); len(all) != 1 || all[0].Tier != api.TierLost || !strings.Contains(all[0].Note, "reports no such sandbox") {
		t.Errorf("placed but reported gone: %+v", all)
	}
}

// TestForgottenNodeIsRevoked: a node forgotten while it does not answer
// keeps its certificate, which is still valid; the master refuses it from
// then on (it is revoked by time), saying so, even from the same address
// under the same name, while a certificate issued after the forgetting is
// taken. And the master takes only the named node's certificate: another
// node's, from the same CA, is refused.
func TestForgottenNodeIsRevoked(t *testing.T) {
	ctx := context.Background()
	remote := &node{name: "far", availMiB: 9000}
	f, stop := runningFleet(t, &node{name: "local"}, remote)
	addr := remote.srv.Listener.Addr().String()
	issued := time.Now()
	// Revocation is to the second: let the second of the issue pass.
	testenv.WaitFor(t, 10*time.Second, "the next second", func() bool { return time.Now().Truncate(time.Second).After(issued) })
	if err := f.Forget(ctx, "far"); err != nil {
		t.Fatal(err)
	}
	// The same node, its same certificate, paired again (as a relay
	// holding that certificate would be): refused.
	if err := f.cfg.Store.PutNode(ctx, store.Node{Name: "far", Address: addr}); err != nil {
		t.Fatal(err)
	}
	if err := f.add("far", addr); err != nil {
		t.Fatal(err)
	}
	_, err := f.member("far").Status(ctx)
	if err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked certificate: %v", err)
	}
	// The revocation outlives the master.
	g, err := New(ctx, Config{Store: f.cfg.Store, CA: f.cfg.CA, Log: f.cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.member("far").Status(ctx); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("after a restart, a revoked certificate: %v", err)
	}
	// A certificate issued now is taken.
	scfg, _ := f.cfg.CA.PeerServerConfig("node far", []string{"127.0.0.1"}, pki.MasterName)
	fresh := httptest.NewUnstartedServer(noderemote.Server(remote))
	fresh.Config.ErrorLog = log.New(io.Discard, "", 0)
	fresh.Listener = tls.NewListener(fresh.Listener, scfg)
	fresh.Start()
	// The fleet's watcher may open its report stream to fresh: stop the
	// fleet first, or fresh.Close waits on that stream for ever.
	defer fresh.Close()
	defer stop()
	f.cfg.Store.DeleteNode(ctx, "far")
	f.cfg.Store.PutNode(ctx, store.Node{Name: "far", Address: fresh.Listener.Addr().String()})
	f.add("far", fresh.Listener.Addr().String())
	if _, err := f.member("far").Status(ctx); err != nil {
		t.Errorf("a certificate issued after the forgetting: %v", err)
	}
	// And its reports are heard again (which opens the stream that
	// fresh.Close, deferred above, must not wait on).
	f.kickWatch("far")
	testenv.WaitFor(t, 10*time.Second, "far's reports heard again", func() bool { l, ok := f.linkOf("far"); return ok && l.up })
	// Another node's certificate, at the address the master has for
	// "near": refused by name.
	f.cfg.Store.PutNode(ctx, store.Node{Name: "near", Address: fresh.Listener.Addr().String() + "0"})
	f.add("near", fresh.Listener.Addr().String())
	if _, err := f.member("near").Status(ctx); err == nil || !strings.Contains(err.Error(), `not node near`) {
		t.Errorf("node far's certificate taken for node near: %v", err)
	}
}

// TestANodeReportsOnlyItsOwn: a node that reports a sandbox the master
// placed on another node (its ID) is not believed.
func TestANodeReportsOnlyItsOwn(t *testing.T) {
	ctx := context.Background()
	remote := &node{name: "far", availMiB: 9000}
	f := fleetOf(t, &node{name: "local"}, remote)
	if err := f.cfg.Store.PutPlacement(ctx, store.Placement{ID: "other-1", Name: "theirs", Node: "other"}); err != nil {
		t.Fatal(err)
	}
	l := f.links["far"]
	forged := api.Sandbox{ID: "other-1", Name: "theirs", Node: "other", Tier: api.TierHot}
	f.apply(ctx, "far", l, nodeapi.Report{Sandbox: &forged})
	f.apply(ctx, "far", l, nodeapi.Report{Full: true, Sandboxes: []api.Sandbox{forged}})
	if rs, _ := f.cfg.Store.FindReported(ctx, "other-1"); len(rs) != 0 {
		t.Errorf("a node's report of another node's sandbox was kept: %+v", rs)
	}
	mine := api.Sandbox{ID: "far-1", Name: "mine", Node: "elsewhere", Tier: api.TierHot}
	f.apply(ctx, "far", l, nodeapi.Report{Sandbox: &mine})
	if rs, _ := f.cfg.Store.FindReported(ctx, "far-1"); len(rs) != 1 || rs[0].Node != "far" || rs[0].Sandbox.Node != "far" {
		t.Errorf("a node's own sandbox, claiming another node: %+v", rs)
	}
}

// TestFindTakesThePlacedID: a name also finds the copy a move left
// behind on a node that came back (another ID, reported first); a GET by
// name shows the placed sandbox, not that copy.
func TestFindTakesThePlacedID(t *testing.T) {
	ctx := context.Background()
	f := fleetOf(t, &node{name: "local"}, &node{name: "far", availMiB: 9000})
	st := f.cfg.Store
	st.PutReported(ctx, "old", api.Sandbox{ID: "m-0", Name: "moved", Node: "old", Tier: api.TierSnapshot})
	if err := st.PutPlacement(ctx, store.Placement{ID: "m-1", Name: "moved", Node: "far"}); err != nil {
		t.Fatal(err)
	}
	st.PutReported(ctx, "far", api.Sandbox{ID: "m-1", Name: "moved", Node: "far", Tier: api.TierHot})
	for _, ref := range []string{"m-1", "moved"} {
		n, sb, err := f.Find(ctx, ref)
		if err != nil || n.Name() != "far" || sb.ID != "m-1" || sb.Node != "far" || sb.Tier != api.TierHot {
			t.Errorf("Find(%s) = node %s, %+v, %v; want far's m-1", ref, n.Name(), sb, err)
		}
	}
}

// TestLocalSandboxesAdopted: sandboxes the node in the master's process
// has without a placement — made before every node was placed alike
// (issue 30) — get one when the fleet starts, so the node's first fence
// keeps them, and they are found, listed and deleted as any other.
func TestLocalSandboxesAdopted(t *testing.T) {
	ctx := context.Background()
	local := &node{name: "local", availMiB: 8000, made: []string{"old"}}
	remote := &node{name: "far", availMiB: 2000}
	f := fleetOf(t, local, remote)
	p, err := f.cfg.Store.GetPlacement(ctx, "old")
	if err != nil || p.Node != "local" || p.ID != "local-old" {
		t.Fatalf("the old sandbox's placement: %+v %v", p, err)
	}
	fence, _ := local.lastFence()
	if !slices.Contains(fence.Keep, "local-old") {
		t.Errorf("the node's fence does not keep it: %+v", fence)
	}
	n, sb, err := f.Find(ctx, "old")
	if err != nil || n.Name() != "local" || sb.ID != "local-old" {
		t.Errorf("Find: %v %+v %v", n, sb, err)
	}
	if all, err := f.List(ctx); err != nil || !slices.ContainsFunc(all, func(b api.Sandbox) bool { return b.ID == "local-old" && b.Tier == api.TierHot }) {
		t.Errorf("List: %+v %v", all, err)
	}
}
