package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/nodeapi"
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
}

func (n *node) Name() string { return n.name }
func (n *node) Status(context.Context) (api.NodeStatus, error) {
	return api.NodeStatus{Name: n.name, MemAvailableMiB: n.availMiB, State: "ready"}, nil
}
func (n *node) Create(_ context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	if n.refuse {
		return api.Sandbox{}, nodeapi.Mark(nodeapi.ErrUnavailable, fmt.Errorf("node short on memory on %s", n.name))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.made = append(n.made, req.Name)
	return api.Sandbox{ID: n.name + "-" + req.Name, Name: req.Name, Node: n.name, Tier: api.TierHot}, nil
}
func (n *node) PrepareTemplate(context.Context, api.Template) error { return nil }
func (n *node) Get(_ context.Context, ref string) (api.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range n.made {
		if ref == name || ref == n.name+"-"+name {
			return api.Sandbox{ID: n.name + "-" + name, Name: name, Node: n.name}, nil
		}
	}
	return api.Sandbox{}, nodeapi.Mark(nodeapi.ErrNotFound, fmt.Errorf("sandbox %q: not found", ref))
}

// fleetOf is a fleet whose local node is local and whose one paired node
// is remote, served over the seam's mutual TLS on loopback.
func fleetOf(t *testing.T, local, remote *node) *Fleet {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, _ := pki.EnsureCA(t.TempDir())
	scfg, _ := ca.PeerServerConfig("node "+remote.name, []string{"127.0.0.1"}, pki.MasterName)
	srv := httptest.NewUnstartedServer(nodeapi.Server(remote))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Listener = tls.NewListener(srv.Listener, scfg)
	srv.Start()
	t.Cleanup(srv.Close)
	if err := st.PutNode(context.Background(), store.Node{Name: remote.name, Address: srv.Listener.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	f, err := New(context.Background(), Config{Store: st, CA: ca, Local: local, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return f
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
	if _, _, err := f.Find(ctx, "nowhere"); !errors.Is(err, nodeapi.ErrNotFound) {
		t.Errorf("an unknown sandbox: %v", err)
	}
	if !f.NameTaken(ctx, "b") {
		t.Error("a paired node's sandbox name is not taken")
	}

	remote.availMiB = 90000 // now the roomiest
	local.refuse = false
	if sb, _ := f.Create(ctx, nodeapi.CreateRequest{Name: "c"}); sb.Node != "far" {
		t.Errorf("with the paired node roomiest, c went to %s", sb.Node)
	}

	local.refuse, remote.refuse = true, true
	_, err = f.Create(ctx, nodeapi.CreateRequest{Name: "d"})
	if !errors.Is(err, nodeapi.ErrUnavailable) || !strings.Contains(err.Error(), "on local") || !strings.Contains(err.Error(), "on far") {
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
	// The node goes away: its address now answers nothing.
	f.mu.Lock()
	f.remote["far"].Base = "https://127.0.0.1:1"
	f.mu.Unlock()
	var lost bool
	for _, st := range f.Statuses(ctx) {
		if st.Name == "far" {
			lost = st.State == "lost" && st.Error != ""
		}
	}
	if !lost {
		t.Errorf("a node that does not answer is not lost: %+v", f.Statuses(ctx))
	}
	if sb, err := f.Create(ctx, nodeapi.CreateRequest{Name: "y"}); err != nil || sb.Node != "local" {
		t.Errorf("with the roomy node lost: %+v %v", sb, err)
	}
}
