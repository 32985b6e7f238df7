// Package nodeapitest is the contract of the master↔node seam
// (internal/nodeapi), as one suite every implementation runs (issue 30):
// the node's side (nodeside.Side over a real node, in the master's
// process or behind remote.Server), remote.Client over the network, and
// the master's tests' node in memory (fleettest.Node). What the master
// relies on is said here once, so that a fake cannot drift from the real
// node, nor the wire from either.
package nodeapitest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/layercache"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/testenv"
)

// Subject is one implementation under test.
type Subject struct {
	Node nodeapi.Node
	// Template is one the node can run. Its Digest names its rootfs; a
	// node that lacks it answers PrepareTemplate with
	// errdefs.ErrPrecondition until it is sent (PutRootfs).
	Template api.Template
	// Rootfs gives the template's tree as rootfs.Pack's tarball.
	Rootfs func() io.Reader
	// Snapshots: the node's runtime checkpoints (else a snapshot answers
	// errdefs.ErrNotSupported).
	Snapshots bool
	// Measures: the node reads what its sandboxes use (a real runtime):
	// a hot sandbox uses memory, one in the snapshot tier none.
	Measures bool
	// Ingress: the node keeps the routes it is pushed (every node its
	// master dials does; the master's own node takes and ignores them).
	Ingress bool
	// IngressAt is where the node's own ingress listens (Node.Ingress;
	// zero: it serves none).
	IngressAt nodeapi.IngressInfo
}

// Run runs the contract against the subjects newSubject makes (one per
// part, each with a node of its own or one whose sandboxes the parts
// clean up).
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	t.Run("unknown sandbox", func(t *testing.T) { unknown(t, newSubject(t)) })
	t.Run("template by digest", func(t *testing.T) { template(t, newSubject(t)) })
	t.Run("layers by digest", func(t *testing.T) { layers(t, newSubject(t)) })
	t.Run("lifecycle", func(t *testing.T) { lifecycle(t, newSubject(t)) })
	t.Run("reports", func(t *testing.T) { reports(t, newSubject(t)) })
	t.Run("fence", func(t *testing.T) { fence(t, newSubject(t)) })
	t.Run("routes", func(t *testing.T) { routes(t, newSubject(t)) })
	t.Run("ingress", func(t *testing.T) { ingressAt(t, newSubject(t)) })
}

// ingressAt: a node says where its ingress listens, for its peers to pass
// connections to, and a node with none says "not found".
func ingressAt(t *testing.T, s Subject) {
	in, err := s.Node.Ingress(ctxT(t))
	switch {
	case s.IngressAt.Address == "":
		wantKind(t, "the ingress of a node that serves none", err, errdefs.ErrNotFound)
	case err != nil:
		t.Fatal(err)
	case in != s.IngressAt:
		t.Errorf("ingress %+v, want %+v", in, s.IngressAt)
	}
}

// routes: a node takes the master's routes whole, then changes to the
// version it has; a malformed push is refused, and with an ingress a
// change to a version it does not have (errdefs.ErrPrecondition: the
// master sends it whole). A request forwarded by a route of another
// generation than the sandbox's is "not found" (the fence a move relies
// on).
func routes(t *testing.T, s Subject) {
	ctx := ctxT(t)
	ready(t, s)
	r := nodeapi.Route{ID: "sb-1", Node: "n", Address: "10.0.0.1:7443", Generation: 7, AccessToken: "t"}
	if err := s.Node.PutRoutes(ctx, nodeapi.Routes{Full: true, Version: 3, Set: []nodeapi.Route{r}}); err != nil {
		t.Fatalf("a full push: %v", err)
	}
	if err := s.Node.PutRoutes(ctx, nodeapi.Routes{Base: 3, Version: 4, Drop: []string{"sb-1"}}); err != nil {
		t.Fatalf("a change at its version: %v", err)
	}
	bad := r
	bad.AccessToken = ""
	if err := s.Node.PutRoutes(ctx, nodeapi.Routes{Full: true, Version: 5, Set: []nodeapi.Route{bad}}); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a route with no token: %v, want ErrBadInput", err)
	}
	err := s.Node.PutRoutes(ctx, nodeapi.Routes{Base: 99, Version: 100, Set: []nodeapi.Route{r}})
	if s.Ingress && !errors.Is(err, errdefs.ErrPrecondition) || !s.Ingress && err != nil {
		t.Errorf("a change at a version it does not have (ingress %v): %v", s.Ingress, err)
	}
	sb, err := s.Node.Create(ctx, nodeapi.CreateRequest{Template: s.Template, Name: "contract-routed", Generation: 301})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Node.Delete(context.Background(), sb.ID) })
	req := httptest.NewRequest(http.MethodGet, "/health", nil)
	req.Header.Set(nodeapi.RouteGenerationHeader, "300")
	if err := s.Node.ServeEnvd(httptest.NewRecorder(), req, sb.ID, "/health"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("envd by a route of another generation: %v, want ErrNotFound", err)
	}
	if s.Snapshots {
		leaving(t, s, sb.ID)
	}
}

// leaving: a copy leaving by a move serves no request of its route (the
// ingress then waits for the master's push, not the caller: a 503 "being
// moved" reached E2B's SDK in CI once); the move undone, it serves again.
func leaving(t *testing.T, s Subject, id string) {
	ctx := ctxT(t)
	byRoute := func() error {
		req := httptest.NewRequest(http.MethodGet, "/health", nil)
		req.Header.Set(nodeapi.RouteGenerationHeader, "301")
		return s.Node.ServeEnvd(httptest.NewRecorder(), req, id, "/health")
	}
	if err := s.Node.MoveOut(ctx, id, 302, io.Discard); err != nil {
		t.Fatalf("move out: %v", err)
	}
	if err := byRoute(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("envd by its route while it leaves: %v, want ErrNotFound", err)
	}
	if err := s.Node.MoveAbort(ctx, id, 302); err != nil {
		t.Fatalf("move abort: %v", err)
	}
	if err := byRoute(); err != nil {
		t.Errorf("envd by its route once the move was undone: %v", err)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Errorf("%s: %v, want an error of kind %q", what, err, kind)
	}
}

// unknown: every call naming a sandbox the node does not have says so.
func unknown(t *testing.T, s Subject) {
	ctx := ctxT(t)
	if s.Node.Name() == "" {
		t.Error("the node has no name")
	}
	_, err := s.Node.Get(ctx, "no-such-sandbox")
	wantKind(t, "Get", err, errdefs.ErrNotFound)
	wantKind(t, "Delete", s.Node.Delete(ctx, "no-such-sandbox"), errdefs.ErrNotFound)
	_, err = s.Node.Transition(ctx, "no-such-sandbox", nodeapi.Wake)
	wantKind(t, "Transition", err, errdefs.ErrNotFound)
	_, err = s.Node.Usage(ctx, "no-such-sandbox")
	wantKind(t, "Usage", err, errdefs.ErrNotFound)
	wantKind(t, "Layer", s.Node.Layer(ctx, "no-such-sandbox", io.Discard), errdefs.ErrNotFound)
	_, err = s.Node.SetEgress(ctx, "no-such-sandbox", api.Egress{DenyOut: []string{"0.0.0.0/0"}})
	wantKind(t, "SetEgress", err, errdefs.ErrNotFound)
	if st, err := s.Node.Status(ctx); err != nil || st.Name != s.Node.Name() {
		t.Errorf("Status: %+v, %v; want the node's own name", st, err)
	}
}

// ready makes the subject's template ready, sending its rootfs if asked.
func ready(t *testing.T, s Subject) {
	t.Helper()
	ctx := ctxT(t)
	err := s.Node.PrepareTemplate(ctx, s.Template)
	if errors.Is(err, errdefs.ErrPrecondition) {
		if err := s.Node.PutRootfs(ctx, s.Template.Digest, s.Rootfs()); err != nil {
			t.Fatalf("PutRootfs: %v", err)
		}
		err = s.Node.PrepareTemplate(ctx, s.Template)
	}
	if err != nil {
		t.Fatalf("PrepareTemplate: %v", err)
	}
}

// template: a node without the template's tree asks for it, refuses a
// tree that does not hash to its digest, and takes the right one.
func template(t *testing.T, s Subject) {
	ctx := ctxT(t)
	err := s.Node.PrepareTemplate(ctx, s.Template)
	if err == nil {
		return // the node had the tree already (a node in memory keeps none)
	}
	wantKind(t, "PrepareTemplate without the tree", err, errdefs.ErrPrecondition)
	if err := s.Node.PutRootfs(ctx, s.Template.Digest, strings.NewReader("not the tree")); err == nil {
		t.Error("PutRootfs of bytes that do not hash to the digest was taken")
	}
	wantKind(t, "PrepareTemplate after a bad tree", s.Node.PrepareTemplate(ctx, s.Template), errdefs.ErrPrecondition)
	ready(t, s)
}

// layers: a node says which image layers it lacks, refuses a layer that
// does not hash to its digest, takes the right one and then has it; a
// node that keeps trees makes a template's from the layer it has (no
// tree sent), and not one whose digest the layer does not make.
func layers(t *testing.T, s Subject) {
	ctx := ctxT(t)
	dir := t.TempDir()
	// Its own content each run: a node kept from an earlier one lacks it.
	os.Mkdir(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc", "layer"), fmt.Appendf(nil, "a layer of %d\n", time.Now().UnixNano()), 0o644)
	var b bytes.Buffer
	if err := layercache.Pack(dir, &b); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b.Bytes())
	d := rootfs.DigestPrefix + hex.EncodeToString(sum[:])
	if m, err := s.Node.Layers(ctx, []string{d}); err != nil || !slices.Equal(m, []string{d}) {
		t.Fatalf("Layers of a layer never sent: %v, %v; want it missing", m, err)
	}
	_, err := s.Node.Layers(ctx, []string{"sha256:../../etc"})
	wantKind(t, "Layers of a digest that is not one", err, errdefs.ErrBadInput)
	wantKind(t, "PutLayer of bytes that do not hash to the digest", s.Node.PutLayer(ctx, d, bytes.NewReader(b.Bytes()[1:])), errdefs.ErrBadInput)
	if m, err := s.Node.Layers(ctx, []string{d}); err != nil || !slices.Equal(m, []string{d}) {
		t.Errorf("Layers after a bad layer: %v, %v; want it still missing", m, err)
	}
	if err := s.Node.PutLayer(ctx, d, bytes.NewReader(b.Bytes())); err != nil {
		t.Fatalf("PutLayer: %v", err)
	}
	if m, err := s.Node.Layers(ctx, []string{d}); err != nil || len(m) != 0 {
		t.Errorf("Layers after the layer was put: %v, %v; want none missing", m, err)
	}
	tree, err := rootfs.Digest(dir)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("layered-%d", time.Now().UnixNano()%1e9)
	tpl := api.Template{Name: name, Digest: tree, Layers: []string{d}, Process: s.Template.Process}
	t.Cleanup(func() { s.Node.DropTemplate(context.Background(), name) })
	if err := s.Node.PrepareTemplate(ctx, tpl); err != nil {
		t.Errorf("PrepareTemplate of a template whose layer the node has: %v", err)
	}
	other := api.Template{Name: name + "-x", Digest: rootfs.DigestPrefix + strings.Repeat("0", 64), Process: s.Template.Process}
	if s.Node.PrepareTemplate(ctx, other) == nil {
		return // a node in memory keeps no trees
	}
	other.Layers = []string{d}
	wantKind(t, "PrepareTemplate of a tree its layers do not make", s.Node.PrepareTemplate(ctx, other), errdefs.ErrPrecondition)
}

// lifecycle: a sandbox created hot, found by ID and name, listed, moved
// through every tier and back, deleted.
func lifecycle(t *testing.T, s Subject) {
	ctx := ctxT(t)
	ready(t, s)
	sb, err := s.Node.Create(ctx, nodeapi.CreateRequest{Template: s.Template, Name: "contract-1", Principal: "contract-1"})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { s.Node.Delete(context.Background(), sb.ID) })
	if sb.ID == "" || sb.Name != "contract-1" || sb.Tier != api.TierHot || sb.Template != s.Template.Name {
		t.Errorf("Create answered %+v", sb)
	}
	for _, ref := range []string{sb.ID, sb.Name} {
		if got, err := s.Node.Get(ctx, ref); err != nil || got.ID != sb.ID {
			t.Errorf("Get(%q): %+v, %v", ref, got, err)
		}
	}
	if all, err := s.Node.List(ctx); err != nil || !slices.ContainsFunc(all, func(b api.Sandbox) bool { return b.ID == sb.ID }) {
		t.Errorf("List: %d sandboxes, %v; want the new one among them", len(all), err)
	}
	_, err = s.Node.Create(ctx, nodeapi.CreateRequest{Template: s.Template, Name: "contract-1"})
	wantKind(t, "a second Create of the same name", err, errdefs.ErrExists)
	usage(t, s, sb.ID, api.TierHot)
	egressRules(t, s, sb.ID)

	steps := []struct {
		op   nodeapi.Op
		want api.Tier
	}{{nodeapi.Freeze, api.TierFrozen}, {nodeapi.Wake, api.TierHot}, {nodeapi.Snapshot, api.TierSnapshot}, {nodeapi.Wake, api.TierHot},
		{nodeapi.Detach, api.TierDetached}, {nodeapi.Wake, api.TierHot}}
	for _, st := range steps {
		got, err := s.Node.Transition(ctx, sb.ID, st.op)
		if st.op == nodeapi.Snapshot && !s.Snapshots {
			wantKind(t, "a snapshot on a node that cannot checkpoint", err, errdefs.ErrNotSupported)
			continue
		}
		if err != nil || got.Tier != st.want {
			t.Fatalf("%s: %+v, %v; want %s", st.op, got.Tier, err, st.want)
		}
		if st.want == api.TierSnapshot {
			usage(t, s, sb.ID, st.want)
		}
	}
	if err := s.Node.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	_, err = s.Node.Get(ctx, sb.ID)
	wantKind(t, "Get after Delete", err, errdefs.ErrNotFound)
	if all, _ := s.Node.List(ctx); slices.ContainsFunc(all, func(b api.Sandbox) bool { return b.ID == sb.ID }) {
		t.Error("a deleted sandbox is still listed")
	}
}

// egressRules: a sandbox's rules are replaced whole, shown by Get, kept
// when the new ones are malformed, and cleared by empty ones.
func egressRules(t *testing.T, s Subject, id string) {
	t.Helper()
	ctx := ctxT(t)
	deny := []string{"0.0.0.0/0"}
	got, err := s.Node.SetEgress(ctx, id, api.Egress{DenyOut: deny})
	if err != nil || got.Egress == nil || !slices.Equal(got.Egress.DenyOut, deny) || len(got.Egress.AllowOut) != 0 {
		t.Fatalf("SetEgress deny all: %+v, %v", got.Egress, err)
	}
	_, err = s.Node.SetEgress(ctx, id, api.Egress{DenyOut: []string{"not.a.cidr"}})
	wantKind(t, "SetEgress with a name in deny_out", err, errdefs.ErrBadInput)
	if sb, err := s.Node.Get(ctx, id); err != nil || sb.Egress == nil || !slices.Equal(sb.Egress.DenyOut, deny) {
		t.Errorf("after a malformed SetEgress, Get shows %+v, %v; want the rules before it", sb.Egress, err)
	}
	if got, err = s.Node.SetEgress(ctx, id, api.Egress{}); err != nil || got.Egress != nil {
		t.Errorf("SetEgress with no rules: %+v, %v; want none", got.Egress, err)
	}
}

// usage: what sandbox id uses is read in its tier, without moving it;
// a node that measures sees the memory of a hot one and none of one in
// the snapshot tier.
func usage(t *testing.T, s Subject, id string, tier api.Tier) {
	t.Helper()
	u, err := s.Node.Usage(ctxT(t), id)
	if err != nil || u.Tier != tier || u.At.IsZero() {
		t.Errorf("Usage in %s: %+v, %v", tier, u, err)
		return
	}
	if !s.Measures {
		return
	}
	hot := tier == api.TierHot
	if hot != (u.MemBytes > 0) || u.CPUCount <= 0 || u.DiskLimitBytes <= 0 || u.CPUPct < 0 || u.CPUPct > 100 {
		t.Errorf("Usage in %s: %+v; want memory exactly when hot, cores, a disk limit and a share in [0, 100]", tier, u)
	}
	if sb, _ := s.Node.Get(ctxT(t), id); sb.Tier != tier {
		t.Errorf("Usage moved the sandbox from %s to %s", tier, sb.Tier)
	}
}

// layer: a sandbox's layer is a whole tar stream with something in it
// (a real node wrote at least the sandbox's resolver file over its
// template).
func layer(t *testing.T, s Subject, id string) {
	t.Helper()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(s.Node.Layer(ctxT(t), id, pw)) }()
	tr := tar.NewReader(pr)
	n := 0
	for {
		_, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Errorf("Layer: entry %d: %v", n, err)
			pr.CloseWithError(err)
			return
		}
		n++
	}
	if n == 0 {
		t.Error("Layer: an empty tar; want what the sandbox wrote over its template")
	}
}

// recorder keeps what Watch sent.
type recorder struct {
	mu   sync.Mutex
	reps []nodeapi.Report
}

func (r *recorder) send(rep nodeapi.Report) error {
	r.mu.Lock()
	r.reps = append(r.reps, rep)
	r.mu.Unlock()
	return nil
}

func (r *recorder) has(f func(nodeapi.Report) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.reps, f)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, what, ok)
}

// reports: Watch sends everything first (Full, with the node's status),
// then each change as the node commits it — a sandbox as it is after,
// or its ID once it is gone — until its context ends.
func reports(t *testing.T, s Subject) {
	ready(t, s)
	ctx, cancel := context.WithCancel(ctxT(t))
	rec := &recorder{}
	done := make(chan error, 1)
	go func() { done <- s.Node.Watch(ctx, rec.send) }()
	waitFor(t, "a full report", func() bool {
		return rec.has(func(r nodeapi.Report) bool { return r.Full && r.Status != nil })
	})
	sb, err := s.Node.Create(ctx, nodeapi.CreateRequest{Template: s.Template, Name: "contract-2"})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	waitFor(t, "a report of the new sandbox", func() bool {
		return rec.has(func(r nodeapi.Report) bool {
			return r.Sandbox != nil && r.Sandbox.ID == sb.ID && r.Sandbox.Tier == api.TierHot
		})
	})
	if err := s.Node.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	waitFor(t, "a report of the sandbox gone", func() bool {
		return rec.has(func(r nodeapi.Report) bool { return r.Gone == sb.ID })
	})
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Watch did not return when its context ended")
	}
}

// fence: a fence retires what its master did not keep, up to its
// generation, and refuses a create the master gave up (generation ≤ the
// fence's, not in flight); it keeps what was kept and what is in flight.
func fence(t *testing.T, s Subject) {
	ctx := ctxT(t)
	ready(t, s)
	create := func(name string, gen int64) (api.Sandbox, error) {
		sb, err := s.Node.Create(ctx, nodeapi.CreateRequest{Template: s.Template, Name: name, Generation: gen})
		if err == nil {
			t.Cleanup(func() { s.Node.Delete(context.Background(), sb.ID) })
		}
		return sb, err
	}
	kept, err := create("contract-kept", 101)
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := create("contract-dropped", 102)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Node.Fence(ctx, nodeapi.FenceRequest{Generation: 103, Keep: []string{kept.ID}, InFlight: []int64{104}})
	if err != nil || !slices.Contains(res.Retired, dropped.ID) || slices.Contains(res.Retired, kept.ID) {
		t.Fatalf("Fence: %+v, %v; want %s retired and %s kept", res, err, dropped.ID, kept.ID)
	}
	if got, err := s.Node.Get(ctx, kept.ID); err != nil || got.Tier != api.TierHot {
		t.Errorf("the kept sandbox after the fence: %+v, %v", got, err)
	}
	// Retired: deleted, or — if its volume holds files the sandbox wrote —
	// kept detached under a principal no policy binds, never to run again.
	waitFor(t, "the retired sandbox stopped", func() bool {
		got, err := s.Node.Get(ctx, dropped.ID)
		return errors.Is(err, errdefs.ErrNotFound) || err == nil && got.Tier == api.TierDetached && strings.HasPrefix(got.Principal, "left-behind.")
	})
	if _, err := s.Node.Get(ctx, dropped.ID); err == nil {
		_, err := s.Node.Transition(ctx, dropped.ID, nodeapi.Wake)
		wantKind(t, "waking a retired sandbox", err, errdefs.ErrConflict)
	}
	_, err = create("contract-late", 103)
	wantKind(t, "a create the fence gave up", err, errdefs.ErrConflict)
	if _, err := create("contract-in-flight", 104); err != nil {
		t.Errorf("a create in flight at the fence: %v", err)
	}
}
