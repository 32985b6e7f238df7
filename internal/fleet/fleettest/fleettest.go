// Package fleettest is what the tests of the master's HTTP surfaces
// (internal/master, internal/e2b) share: a node in memory and a fleet over
// it, with a store and a CA of the test's own.
package fleettest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/pki"
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
}

// NewNode is an empty Node.
func NewNode() *Node { return &Node{Boxes: map[string]api.Sandbox{}} }

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
	sb := api.Sandbox{ID: "id-" + name, Name: name, Template: req.Template.Name, Node: "local", Tier: api.TierHot, MemoryMiB: req.MemoryMiB, Principal: req.Principal, CreatedAt: time.Now()}
	f.Boxes[sb.ID] = sb
	return sb, nil
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
	delete(f.Boxes, id)
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
	sb.Tier = map[nodeapi.Op]api.Tier{nodeapi.Freeze: api.TierFrozen, nodeapi.Snapshot: api.TierSnapshot, nodeapi.Detach: api.TierDetached, nodeapi.Wake: api.TierHot}[op]
	f.Boxes[id] = sb
	return sb, nil
}

// Status implements nodeapi.Node.
func (f *Node) Status(context.Context) (api.NodeStatus, error) {
	return api.NodeStatus{Name: "local", State: "ready", MemAvailableMiB: 1000}, f.call("status")
}

// PrepareTemplate implements nodeapi.Node.
func (f *Node) PrepareTemplate(_ context.Context, t api.Template) error {
	return f.call("prepare " + t.Name)
}

// DropTemplate implements nodeapi.Node.
func (f *Node) DropTemplate(_ context.Context, name string) error {
	f.call("drop " + name)
	return nil
}

// ServeEnvd implements nodeapi.Node.
func (f *Node) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	if err := f.call("envd " + id + " " + path); err != nil {
		return err
	}
	f.mu.Lock()
	f.Envd = append(f.Envd, r.Clone(context.Background()))
	f.mu.Unlock()
	fmt.Fprintf(w, "envd %s %s", id, path)
	return nil
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
