// Package fleettest is what the tests of the master's HTTP surfaces
// (internal/master, internal/e2b) share: a node in memory and a fleet over
// it, with a store and a CA of the test's own.
package fleettest

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet"
	"sandstorm/internal/ingress"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/pki"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/store"
)

// Node is the master's own node, in memory: it makes what it is asked to
// (sandbox "id-<name>", a name "sb-<n>" when none is given), moves
// sandboxes between tiers, answers an envd call with what it was sent
// ("envd <id> <path>"), records every call in Calls, and fails every call
// with Err when set. What a test must not reach panics (the embedded nil
// interface).
type Node struct {
	nodeapi.Node
	mu    sync.Mutex
	Boxes map[string]api.Sandbox
	Err   error
	Calls []string
	// Envd holds the envd calls it was sent, as they arrived.
	Envd []*http.Request
	n    int
	// trees are the rootfs digests it was sent (PutRootfs).
	trees map[string]bool
	// layers are the image layers it was sent (PutLayer), with their size.
	layers map[string]int64
	// fence is the last fence's generation and in-flight set.
	fence    int64
	inFlight map[int64]bool
	// Used is what Usage answers of every sandbox (its time, tier and
	// limit aside).
	Used api.Usage
	// watchers are the Watch calls running.
	watchers map[chan nodeapi.Report]bool
	// Secrets are the secrets each create was sent, by sandbox ID.
	Secrets map[string][]inject.Binding
	// Routes is its ingress's table, which PutRoutes fills.
	Routes *ingress.Table
	// IngressAt is what Ingress answers (zero: it serves no ingress).
	IngressAt nodeapi.IngressInfo
}

// NewNode is an empty Node.
func NewNode() *Node {
	return &Node{Routes: ingress.NewTable(), Boxes: map[string]api.Sandbox{}, trees: map[string]bool{}, layers: map[string]int64{}, watchers: map[chan nodeapi.Report]bool{}}
}

// report sends r to every Watch (f.mu held).
func (f *Node) report(r nodeapi.Report) {
	for ch := range f.watchers {
		select {
		case ch <- r:
		default: // a watcher that cannot keep up gets all again on its next Watch
		}
	}
}

// changed reports sandbox id as it is now, or gone (f.mu held).
func (f *Node) changed(id string) {
	if sb, ok := f.Boxes[id]; ok {
		f.report(nodeapi.Report{Sandbox: &sb})
		return
	}
	f.report(nodeapi.Report{Gone: id})
}

func (f *Node) call(what string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls = append(f.Calls, what)
	return f.Err
}

// Name implements nodeapi.Node.
func (f *Node) Name() string { return "local" }

// Create implements nodeapi.Node.
func (f *Node) Create(_ context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	if err := f.call("create " + req.Name); err != nil {
		return api.Sandbox{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	name := req.Name
	if name == "" {
		name = fmt.Sprintf("sb-%d", f.n)
	}
	for _, b := range f.Boxes {
		if b.Name == name {
			return api.Sandbox{}, errdefs.New(errdefs.ErrExists, "sandbox %q: already exists", name)
		}
	}
	if g := req.Generation; g > 0 && g <= f.fence && !f.inFlight[g] {
		return api.Sandbox{}, errdefs.New(errdefs.ErrConflict, "this create (generation %d) was given up by the master (fenced at %d)", g, f.fence)
	}
	sb := api.Sandbox{ID: "id-" + name, Name: name, Template: req.Template.Name, Node: "local", Tier: api.TierHot, MemoryMiB: req.MemoryMiB,
		Principal: req.Principal, CreatedAt: time.Now(), Generation: req.Generation, Egress: req.Egress}
	f.Boxes[sb.ID] = sb
	if len(req.Secrets) > 0 {
		if f.Secrets == nil {
			f.Secrets = map[string][]inject.Binding{}
		}
		f.Secrets[sb.ID] = req.Secrets
	}
	f.changed(sb.ID)
	return sb, nil
}

// Clone implements nodeapi.Node: Count children of a hot sandbox it has,
// hot, named <parent>-c<n>, the parent's principal with .<n>.
func (f *Node) Clone(_ context.Context, id string, req nodeapi.CloneRequest) (api.CloneResult, error) {
	if err := f.call("clone " + id); err != nil {
		return api.CloneResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.Boxes[id]
	if !ok {
		return api.CloneResult{}, errdefs.New(errdefs.ErrNotFound, "sandbox %q: not found", id)
	}
	out := api.CloneResult{Parent: p}
	for i := 1; i <= req.Count; i++ {
		f.n++
		c := p
		c.Name = fmt.Sprintf("%s-c%d", p.Name, f.n)
		c.ID, c.Principal, c.CreatedAt, c.Tier, c.Idle = "id-"+c.Name, fmt.Sprintf("%s.%d", p.Principal, i), time.Now(), api.TierHot, req.Idle
		f.Boxes[c.ID] = c
		f.changed(c.ID)
		out.Children = append(out.Children, c)
	}
	return out, nil
}

// Get implements nodeapi.Node.
func (f *Node) Get(_ context.Context, ref string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.Boxes {
		if b.ID == ref || b.Name == ref {
			return b, nil
		}
	}
	return api.Sandbox{}, errdefs.New(errdefs.ErrNotFound, "sandbox %q: not found", ref)
}

// SetEgress implements nodeapi.Node: rules that parse are kept on the
// sandbox (no boundary here to apply them, and no policy to check them
// against).
func (f *Node) SetEgress(ctx context.Context, id string, e api.Egress) (api.Sandbox, error) {
	if _, err := egress.Parse(e.AllowOut, e.DenyOut); err != nil {
		return api.Sandbox{}, errdefs.New(errdefs.ErrBadInput, "egress: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, b := range f.Boxes {
		if b.ID == id {
			b.Egress = nil
			if len(e.AllowOut)+len(e.DenyOut) > 0 {
				b.Egress = &e
			}
			f.Boxes[k] = b
			return b, nil
		}
	}
	return api.Sandbox{}, errdefs.New(errdefs.ErrNotFound, "sandbox %q: not found", id)
}

// Usage implements nodeapi.Node: its limit and tier, and what a test
// set in Used (nothing runs here to measure).
func (f *Node) Usage(ctx context.Context, id string) (api.Usage, error) {
	sb, err := f.Get(ctx, id)
	if err != nil {
		return api.Usage{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	u := f.Used
	u.At, u.Tier, u.MemLimitBytes = time.Now(), sb.Tier, int64(sb.MemoryMiB)<<20
	return u, nil
}

// Layer implements nodeapi.Node: one file, /layer-of-<id>, as a tar.
func (f *Node) Layer(ctx context.Context, id string, w io.Writer) error {
	sb, err := f.Get(ctx, id)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	body := []byte(sb.ID)
	if err := tw.WriteHeader(&tar.Header{Name: "layer-of-" + sb.ID, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(body); err != nil {
		return err
	}
	return tw.Close()
}

// List implements nodeapi.Node.
func (f *Node) List(context.Context) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Sandbox
	for _, b := range f.Boxes {
		out = append(out, b)
	}
	return out, nil
}

// Delete implements nodeapi.Node.
func (f *Node) Delete(_ context.Context, id string) error {
	if err := f.call("delete " + id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Boxes[id]; !ok {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found", id)
	}
	delete(f.Boxes, id)
	f.changed(id)
	return nil
}

// Transition implements nodeapi.Node.
func (f *Node) Transition(_ context.Context, id string, op nodeapi.Op) (api.Sandbox, error) {
	if err := f.call(string(op) + " " + id); err != nil {
		return api.Sandbox{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.Boxes[id]
	if !ok {
		return sb, errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found", id)
	}
	if sb.LeftBehind {
		return sb, errdefs.New(errdefs.ErrConflict, "sandbox %s was left behind on this node and does not run again", id)
	}
	sb.Tier = map[nodeapi.Op]api.Tier{nodeapi.Freeze: api.TierFrozen, nodeapi.Snapshot: api.TierSnapshot, nodeapi.Detach: api.TierDetached, nodeapi.Wake: api.TierHot}[op]
	f.Boxes[id] = sb
	f.changed(id)
	return sb, nil
}

// Status implements nodeapi.Node.
func (f *Node) Status(context.Context) (api.NodeStatus, error) {
	return api.NodeStatus{Name: f.Name(), State: "ready", MemAvailableMiB: 1000}, f.call("status")
}

// PrepareTemplate implements nodeapi.Node.
func (f *Node) PrepareTemplate(_ context.Context, t api.Template) error {
	return f.call("prepare " + t.Name)
}

// PutRootfs implements nodeapi.Node: a tree is kept (by its digest) only
// if what arrived hashes to it.
func (f *Node) PutRootfs(_ context.Context, digest string, tar io.Reader) error {
	if err := f.call("rootfs " + digest); err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.Copy(h, tar); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return errdefs.New(errdefs.ErrBadInput, "the tree sent hashes to %s, not %s", got, digest)
	}
	f.mu.Lock()
	f.trees[digest] = true
	f.mu.Unlock()
	return nil
}

// Layers implements nodeapi.Node: those of digests it was not sent.
func (f *Node) Layers(_ context.Context, digests []string) ([]string, error) {
	if err := f.call("layers"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	missing := []string{}
	for _, d := range digests {
		if !validDigest(d) {
			return nil, errdefs.New(errdefs.ErrBadInput, "%q is not a layer digest (sha256:<64 hex digits>)", d)
		}
		if _, ok := f.layers[d]; !ok {
			missing = append(missing, d)
		}
	}
	return missing, nil
}

// PutLayer implements nodeapi.Node: a layer is kept (by its digest, with
// its size: LayerBytes) only if what arrived hashes to it.
func (f *Node) PutLayer(_ context.Context, digest string, tar io.Reader) error {
	if err := f.call("layer " + digest); err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(h, tar)
	if err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return errdefs.New(errdefs.ErrBadInput, "the layer sent hashes to %s, not %s", got, digest)
	}
	f.mu.Lock()
	f.layers[digest] = n
	f.mu.Unlock()
	return nil
}

// LayerBytes is the size of each layer it was sent, by digest.
func (f *Node) LayerBytes() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.layers)
}

func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	_, err := hex.DecodeString(h)
	return ok && len(h) == 64 && err == nil && strings.ToLower(h) == h
}

// Watch implements nodeapi.Node: everything, then each change.
func (f *Node) Watch(ctx context.Context, send func(nodeapi.Report) error) error {
	ch := make(chan nodeapi.Report, 256)
	f.mu.Lock()
	f.watchers[ch] = true
	var all []api.Sandbox
	for _, b := range f.Boxes {
		all = append(all, b)
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.watchers, ch)
		f.mu.Unlock()
	}()
	st, _ := f.Status(ctx)
	if err := send(nodeapi.Report{Full: true, Sandboxes: all, Status: &st}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-ch:
			if err := send(r); err != nil {
				return err
			}
		}
	}
}

// Fence implements nodeapi.Node, as the node's fence does (node.Fence):
// what the master did not keep, up to its generation and not in flight,
// is retired (here: deleted), and a create it gave up is refused.
func (f *Node) Fence(_ context.Context, req nodeapi.FenceRequest) (nodeapi.FenceResult, error) {
	if err := f.call("fence"); err != nil {
		return nodeapi.FenceResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fence = max(f.fence, req.Generation)
	f.inFlight = map[int64]bool{}
	for _, g := range req.InFlight {
		f.inFlight[g] = true
	}
	res := nodeapi.FenceResult{Retired: []string{}}
	for id, b := range f.Boxes {
		if b.Generation <= req.Generation && !slices.Contains(req.Keep, id) && !f.inFlight[b.Generation] {
			delete(f.Boxes, id)
			f.changed(id)
			res.Retired = append(res.Retired, id)
		}
	}
	return res, nil
}

// DropTemplate implements nodeapi.Node.
func (f *Node) DropTemplate(_ context.Context, name string) error {
	f.call("drop " + name)
	return nil
}

// ServePort implements nodeapi.Node: it answers "port <port> of <id>
// <path>" for a sandbox it has.
func (f *Node) ServePort(w http.ResponseWriter, r *http.Request, id string, port int) error {
	if err := f.call(fmt.Sprintf("port %s %d", id, port)); err != nil {
		return err
	}
	if err := f.fenced(r, id); err != nil {
		return err
	}
	fmt.Fprintf(w, "port %d of %s %s, host %s", port, id, r.URL.Path, r.Host)
	return nil
}

// ServeEnvd implements nodeapi.Node.
func (f *Node) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	if err := f.call("envd " + id + " " + path); err != nil {
		return err
	}
	if r.Header.Get(nodeapi.RouteGenerationHeader) != "" {
		if err := f.fenced(r, id); err != nil {
			return err
		}
	}
	f.mu.Lock()
	f.Envd = append(f.Envd, r.Clone(context.Background()))
	f.mu.Unlock()
	fmt.Fprintf(w, "envd %s %s", id, path)
	return nil
}

// fenced is a node's check of a request: the sandbox is here, of the
// route's generation if the request names one (nodeside's rule).
func (f *Node) fenced(r *http.Request, id string) error {
	f.mu.Lock()
	sb, ok := f.Boxes[id]
	f.mu.Unlock()
	if g := r.Header.Get(nodeapi.RouteGenerationHeader); ok && g != "" && (g != strconv.FormatInt(sb.Generation, 10) || sb.Moving == api.MovingOut) {
		ok = false
	}
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found", id)
	}
	return nil
}

// MoveOut implements nodeapi.Node: the sandbox is marked leaving, and
// its stream is empty (this node keeps no memory or files to send).
func (f *Node) MoveOut(_ context.Context, id string, gen int64, _ io.Writer) error {
	return f.moving(id, "move out", func(sb *api.Sandbox) { sb.Moving, sb.MoveGeneration = api.MovingOut, gen })
}

// MoveAbort implements nodeapi.Node: a leaving sandbox stays.
func (f *Node) MoveAbort(_ context.Context, id string, gen int64) error {
	return f.moving(id, "move abort", func(sb *api.Sandbox) {
		if sb.MoveGeneration == gen {
			sb.Moving, sb.MoveGeneration = "", 0
		}
	})
}

// moving changes sandbox id's move marks by change.
func (f *Node) moving(id, what string, change func(sb *api.Sandbox)) error {
	if err := f.call(what + " " + id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.Boxes[id]
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found", id)
	}
	change(&sb)
	f.Boxes[id] = sb
	return nil
}

// Ingress implements nodeapi.Node.
func (f *Node) Ingress(context.Context) (nodeapi.IngressInfo, error) {
	if err := f.call("ingress"); err != nil {
		return nodeapi.IngressInfo{}, err
	}
	if f.IngressAt.Address == "" {
		return f.IngressAt, errdefs.New(errdefs.ErrNotFound, "node serves no ingress")
	}
	return f.IngressAt, nil
}

// PutRoutes implements nodeapi.Node.
func (f *Node) PutRoutes(_ context.Context, u nodeapi.Routes) error {
	if err := f.call("routes"); err != nil {
		return err
	}
	return f.Routes.Apply(u)
}

// Tier is sandbox id's tier.
func (f *Node) Tier(id string) api.Tier {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Boxes[id].Tier
}

// CallLog is a copy of Calls.
func (f *Node) CallLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.Calls...)
}

// Env is a master's side over one node: its store (SQLite in the test's
// directory), CA and fleet.
type Env struct {
	Store *store.Store
	CA    *pki.CA
	Fleet *fleet.Fleet
	Log   *slog.Logger
}

// New is the master's side over n, torn down with t.
func New(t testing.TB, n nodeapi.Node) Env {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fl, err := fleet.New(context.Background(), fleet.Config{Store: st, CA: ca, Local: n, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return Env{Store: st, CA: ca, Fleet: fl, Log: log}
}
