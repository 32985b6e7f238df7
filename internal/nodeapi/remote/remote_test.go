package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/nodeapi"

	"sandstorm/api"
	"sandstorm/internal/pki"

	"sandstorm/internal/testenv"
)

// fake is a Node in memory: what the master's end must see through the
// network exactly as the node's end answered it.
type fake struct {
	mu        sync.Mutex
	boxes     map[string]api.Sandbox
	templates map[string]api.Template
	logs      chan string            // what Logs writes, until closed
	rootfs    map[string]int64       // digest → bytes received
	layers    map[string]int64       // layer digest → bytes received
	reports   chan nodeapi.Report    // what Watch sends after its full report
	fences    []nodeapi.FenceRequest // what Fence was asked
}

func newFake() *fake {
	return &fake{boxes: map[string]api.Sandbox{}, templates: map[string]api.Template{}, logs: make(chan string, 8), rootfs: map[string]int64{}, layers: map[string]int64{}, reports: make(chan nodeapi.Report, 8)}
}

func (f *fake) Name() string { return "fake" }
func (f *fake) Create(_ context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.templates[req.Template.Name]; !ok {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("template %q: not found", req.Template.Name))
	}
	if _, ok := f.boxes[req.Name]; ok {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrExists, fmt.Errorf("sandbox %q: already exists", req.Name))
	}
	if req.MemoryMiB > 1000 {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrNoRoom, errors.New("node short on memory: not enough memory for it"))
	}
	sb := api.Sandbox{ID: "id-" + req.Name, Name: req.Name, Template: req.Template.Name, Tier: api.TierHot, Node: "fake", Principal: req.Principal}
	f.boxes[req.Name] = sb
	return sb, nil
}
func (f *fake) Get(_ context.Context, ref string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sb := range f.boxes {
		if sb.ID == ref || sb.Name == ref {
			return sb, nil
		}
	}
	return api.Sandbox{}, errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("sandbox %q: not found", ref))
}
func (f *fake) SetEgress(_ context.Context, id string, e api.Egress) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, sb := range f.boxes {
		if sb.ID == id {
			sb.Egress = &e
			f.boxes[name] = sb
			return sb, nil
		}
	}
	return api.Sandbox{}, errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("sandbox %q: not found", id))
}
func (f *fake) EgressLog(ctx context.Context, id string, opt nodeapi.EgressLogOptions, w io.Writer) error {
	if _, err := f.Get(ctx, id); err != nil {
		return err
	}
	_, err := io.WriteString(w, `{"items":[{"seq":1,"name":"x.test","outcome":"allowed"}],"next":1}`+"\n")
	return err
}
func (f *fake) Usage(ctx context.Context, id string) (api.Usage, error) {
	sb, err := f.Get(ctx, id)
	return api.Usage{At: time.Unix(1_800_000_000, 0).UTC(), Tier: sb.Tier, CPUCount: 2, CPUPct: 12.5, MemBytes: 3 << 20, MemLimitBytes: 64 << 20}, err
}
func (f *fake) Layer(ctx context.Context, id string, w io.Writer) error {
	sb, err := f.Get(ctx, id)
	if err == nil {
		_, err = io.WriteString(w, "layer of "+sb.ID)
	}
	return err
}
func (f *fake) List(context.Context) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Sandbox
	for _, sb := range f.boxes {
		out = append(out, sb)
	}
	return out, nil
}
func (f *fake) Delete(ctx context.Context, id string) error {
	sb, err := f.Get(ctx, id)
	if err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.boxes, sb.Name)
	f.mu.Unlock()
	return nil
}
func (f *fake) Transition(ctx context.Context, id string, op nodeapi.Op) (api.Sandbox, error) {
	sb, err := f.Get(ctx, id)
	if err != nil {
		return sb, err
	}
	if op == nodeapi.Freeze && sb.Tier != api.TierHot {
		return sb, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("conflict: sandbox %s is %s", sb.Name, sb.Tier))
	}
	sb.Tier = map[nodeapi.Op]api.Tier{nodeapi.Freeze: api.TierFrozen, nodeapi.Snapshot: api.TierSnapshot, nodeapi.Detach: api.TierDetached, nodeapi.Wake: api.TierHot}[op]
	f.mu.Lock()
	f.boxes[sb.Name] = sb
	f.mu.Unlock()
	return sb, nil
}
func (f *fake) Clone(ctx context.Context, id string, req nodeapi.CloneRequest) (api.CloneResult, error) {
	p, err := f.Get(ctx, id)
	if err != nil {
		return api.CloneResult{}, err
	}
	res := api.CloneResult{Parent: p, ParentPauseMs: 50}
	for i := 0; i < req.Count && i < 2; i++ {
		res.Children = append(res.Children, api.Sandbox{ID: fmt.Sprint(p.ID, "-", i), Name: fmt.Sprint(p.Name, "-", i+1)})
		res.ChildMs = append(res.ChildMs, 120)
	}
	if req.Count > 2 {
		return res, errdefs.Mark(errdefs.ErrNoRoom, errors.New("node short on memory for child 3"))
	}
	return res, nil
}
func (f *fake) Logs(ctx context.Context, id string, opt nodeapi.LogOptions, w io.Writer) error {
	if _, err := f.Get(ctx, id); err != nil {
		return err
	}
	fl := w.(interface{ Flush() })
	for {
		select {
		case <-ctx.Done():
			return nil
		case s, ok := <-f.logs:
			if !ok {
				return nil
			}
			io.WriteString(w, s)
			fl.Flush()
			if !opt.Follow {
				return nil
			}
		}
	}
}

// ServeEnvd answers as envd would: an unknown sandbox before anything is
// written, else the call it got (method, path, a header, the body) as a
// stream of two flushed lines.
func (f *fake) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	if _, err := f.Get(r.Context(), id); err != nil {
		return err
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/connect+json")
	fmt.Fprintf(w, "%s %s %s\n", r.Method, path, r.Header.Get("Connect-Protocol-Version"))
	w.(http.Flusher).Flush()
	fmt.Fprintf(w, "%s\n", body)
	return nil
}

// ServePort answers with what the sandbox's port would see: the method,
// path with query, and the Host it was asked by.
func (f *fake) ServePort(w http.ResponseWriter, r *http.Request, id string, port int) error {
	if _, err := f.Get(r.Context(), id); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d %s %s %s", port, r.Method, r.URL.RequestURI(), r.Host)
	return nil
}
func (f *fake) Status(context.Context) (api.NodeStatus, error) {
	return api.NodeStatus{Name: "fake", Backend: "gvisor", MemAvailableMiB: 1234, MemReserveMiB: 256, Sandboxes: map[api.Tier]int{api.TierHot: len(f.boxes)}}, nil
}
func (f *fake) PrepareTemplate(_ context.Context, t api.Template) error {
	if t.Warm != nil && t.Warm.Probe.Port == 9 {
		return errdefs.Mark(errdefs.ErrBadInput, errors.New("bad input: its probe did not succeed"))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.rootfs[t.Digest]; t.Digest != "" && !ok {
		return errdefs.Mark(errdefs.ErrPrecondition, fmt.Errorf("template %s: no rootfs %s yet", t.Name, t.Digest))
	}
	f.templates[t.Name] = t
	return nil
}
func (f *fake) PutRootfs(_ context.Context, digest string, r io.Reader) error {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("rootfs digest mismatch: sent as %s, received %s", digest, got))
	}
	f.mu.Lock()
	f.rootfs[digest] = n
	f.mu.Unlock()
	return nil
}
func (f *fake) Layers(_ context.Context, digests []string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var missing []string
	for _, d := range digests {
		if _, ok := f.layers[d]; !ok {
			missing = append(missing, d)
		}
	}
	return missing, nil
}
func (f *fake) PutLayer(_ context.Context, digest string, r io.Reader) error {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("layer digest mismatch: sent as %s, received %s", digest, got))
	}
	f.mu.Lock()
	f.layers[digest] = n
	f.mu.Unlock()
	return nil
}
func (f *fake) Watch(ctx context.Context, send func(nodeapi.Report) error) error {
	all, _ := f.List(ctx)
	if err := send(nodeapi.Report{Full: true, Sandboxes: all}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-f.reports:
			if err := send(r); err != nil {
				return err
			}
		}
	}
}
func (f *fake) PutRoutes(context.Context, nodeapi.Routes) error { return nil }
func (f *fake) Ingress(context.Context) (nodeapi.IngressInfo, error) {
	return nodeapi.IngressInfo{}, errdefs.New(errdefs.ErrNotFound, "no ingress")
}
func (f *fake) Fence(_ context.Context, req nodeapi.FenceRequest) (nodeapi.FenceResult, error) {
	f.mu.Lock()
	f.fences = append(f.fences, req)
	f.mu.Unlock()
	return nodeapi.FenceResult{Retired: []string{}}, nil
}
func (f *fake) MoveOut(_ context.Context, id string, gen int64, w io.Writer) error {
	if id == "busy" {
		return errdefs.New(errdefs.ErrConflict, "busy")
	}
	_, err := io.Copy(w, strings.NewReader(strings.Repeat(fmt.Sprintf("%s@%d;", id, gen), 100000)))
	return err
}
func (f *fake) MoveIn(_ context.Context, gen int64, r io.Reader) (api.Sandbox, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return api.Sandbox{}, err
	}
	id, _, _ := strings.Cut(string(b), "@")
	return api.Sandbox{ID: id, Generation: gen, Note: fmt.Sprint(len(b)), Moving: api.MovingIn}, nil
}
func (f *fake) MoveCommit(_ context.Context, id string, gen int64) (api.Sandbox, error) {
	if id == "gone" {
		return api.Sandbox{}, errdefs.New(errdefs.ErrNotFound, "no copy of move %d", gen)
	}
	return api.Sandbox{ID: id, Generation: gen}, nil
}
func (f *fake) MoveAbort(_ context.Context, id string, gen int64) error {
	f.mu.Lock()
	f.boxes["aborted-"+id] = api.Sandbox{ID: id, Generation: gen}
	f.mu.Unlock()
	return nil
}
func (f *fake) DropTemplate(_ context.Context, name string) error {
	f.mu.Lock()
	delete(f.templates, name)
	f.mu.Unlock()
	return nil
}

// pair serves n over mutual TLS from a fresh CA and returns a Client of it
// with the master's certificate, the CA and the server's address.
func pair(t *testing.T, n nodeapi.Node) (*Client, *pki.CA, string) {
	t.Helper()
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := ca.PeerServerConfig("node fake", []string{"127.0.0.1"}, pki.MasterName)
	if err != nil {
		t.Fatal(err)
	}
	// Our own TLS listener: httptest's StartTLS would add its own
	// certificate, which crypto/tls prefers for a client without SNI.
	srv := httptest.NewUnstartedServer(Server(n))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	srv.Listener = tls.NewListener(srv.Listener, scfg)
	srv.Start()
	t.Cleanup(srv.Close)
	base := "https://" + srv.Listener.Addr().String()
	return clientWith(t, ca, pki.MasterName, base), ca, base
}

func clientWith(t *testing.T, ca *pki.CA, cn, base string) *Client {
	t.Helper()
	ccfg, err := ca.PeerClientConfig(cn)
	if err != nil {
		t.Fatal(err)
	}
	return &Client{NodeName: "fake", Base: base, HTTP: &http.Client{Transport: &http.Transport{TLSClientConfig: ccfg}, Timeout: 10 * time.Second}}
}

// TestRemoteRoundTrip: every call reaches the node's end and comes back
// the same as the node answered it, errors included: each sentinel
// survives the network with the node's own words.
func TestRemoteRoundTrip(t *testing.T) {
	f := newFake()
	c, _, _ := pair(t, f)
	ctx := context.Background()
	tmpl := api.Template{Name: "web", Process: api.Process{Args: []string{"/app"}}, Ports: []int{8000}}
	if err := c.PrepareTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, nodeapi.CreateRequest{Template: tmpl, Name: "one", Principal: "agent.one"})
	if err != nil || sb.ID != "id-one" || sb.Principal != "agent.one" || sb.Tier != api.TierHot {
		t.Fatalf("create: %+v %v", sb, err)
	}
	for _, tc := range []struct {
		what string
		err  error
		kind error
		msg  string
	}{
		{"unknown template", func() error {
			_, err := c.Create(ctx, nodeapi.CreateRequest{Template: api.Template{Name: "nope"}, Name: "x"})
			return err
		}(), errdefs.ErrNotFound, `template "nope": not found`},
		{"name taken", func() error { _, err := c.Create(ctx, nodeapi.CreateRequest{Template: tmpl, Name: "one"}); return err }(), errdefs.ErrExists, `sandbox "one": already exists`},
		{"no memory", func() error {
			_, err := c.Create(ctx, nodeapi.CreateRequest{Template: tmpl, Name: "big", MemoryMiB: 4096})
			return err
		}(), errdefs.ErrNoRoom, "node short on memory"},
		{"unknown sandbox", func() error { _, err := c.Get(ctx, "ghost"); return err }(), errdefs.ErrNotFound, `sandbox "ghost": not found`},
		{"bad probe", c.PrepareTemplate(ctx, api.Template{Name: "w", Warm: &api.Warm{Probe: api.Probe{Port: 9}}}), errdefs.ErrBadInput, "probe did not succeed"},
	} {
		if !errors.Is(tc.err, tc.kind) || !strings.Contains(fmt.Sprint(tc.err), tc.msg) {
			t.Errorf("%s: err = %v, want %v saying %q", tc.what, tc.err, tc.kind, tc.msg)
		}
	}
	if sb, err := c.Transition(ctx, "one", nodeapi.Freeze); err != nil || sb.Tier != api.TierFrozen {
		t.Errorf("freeze: %+v %v", sb, err)
	}
	if _, err := c.Transition(ctx, "one", nodeapi.Freeze); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "is frozen") {
		t.Errorf("freeze of a frozen one: %v", err)
	}
	if sb, err := c.Transition(ctx, "id-one", nodeapi.Wake); err != nil || sb.Tier != api.TierHot {
		t.Errorf("wake: %+v %v", sb, err)
	}
	if l, err := c.List(ctx); err != nil || len(l) != 1 || l[0].Name != "one" {
		t.Errorf("list: %+v %v", l, err)
	}
	if st, err := c.Status(ctx); err != nil || st.MemAvailableMiB != 1234 || st.Sandboxes[api.TierHot] != 1 {
		t.Errorf("status: %+v %v", st, err)
	}
	if err := c.Delete(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if err := c.DropTemplate(ctx, "web"); err != nil || len(f.templates) != 0 {
		t.Errorf("drop template: %v (%d left)", err, len(f.templates))
	}

	// A rootfs by digest: the node says it has not got it, is sent it as
	// a stream (larger than any JSON body may be), and then takes it.
	tree := bytes.Repeat([]byte("rootfs "), 3<<20)
	sum := sha256.Sum256(tree)
	d := "sha256:" + hex.EncodeToString(sum[:])
	withRootfs := api.Template{Name: "big", Digest: d, Process: tmpl.Process}
	if err := c.PrepareTemplate(ctx, withRootfs); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("a template whose rootfs the node lacks: %v", err)
	}
	if err := c.PutRootfs(ctx, d, bytes.NewReader(tree[1:])); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "mismatch") {
		t.Errorf("a rootfs that is not its digest: %v", err)
	}
	if err := c.PutRootfs(ctx, d, bytes.NewReader(tree)); err != nil || f.rootfs[d] != int64(len(tree)) {
		t.Fatalf("put rootfs: %v (%d bytes arrived of %d)", err, f.rootfs[d], len(tree))
	}
	if err := c.PrepareTemplate(ctx, withRootfs); err != nil {
		t.Errorf("prepare once the rootfs is there: %v", err)
	}

	// Layers by digest: the node says which it lacks, takes one as a
	// stream only if it hashes right, and the template names its layers
	// across the wire.
	small, big := []byte("a layer"), bytes.Repeat([]byte("layer "), 3<<20)
	ds, db := sha256.Sum256(small), sha256.Sum256(big)
	layers := []string{"sha256:" + hex.EncodeToString(ds[:]), "sha256:" + hex.EncodeToString(db[:])}
	if m, err := c.Layers(ctx, layers); err != nil || !slices.Equal(m, layers) {
		t.Errorf("layers missing: %v %v", m, err)
	}
	if err := c.PutLayer(ctx, layers[1], bytes.NewReader(big[1:])); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "mismatch") {
		t.Errorf("a layer that is not its digest: %v", err)
	}
	if err := c.PutLayer(ctx, layers[1], bytes.NewReader(big)); err != nil || f.layers[layers[1]] != int64(len(big)) {
		t.Fatalf("put layer: %v (%d bytes arrived of %d)", err, f.layers[layers[1]], len(big))
	}
	if m, err := c.Layers(ctx, layers); err != nil || !slices.Equal(m, layers[:1]) {
		t.Errorf("layers missing after one put: %v %v", m, err)
	}
	withLayers := api.Template{Name: "layered", Digest: d, Layers: layers, Process: tmpl.Process}
	if err := c.PrepareTemplate(ctx, withLayers); err != nil || !slices.Equal(f.templates["layered"].Layers, layers) {
		t.Errorf("a template's layers across the wire: %v, %v", f.templates["layered"].Layers, err)
	}
}

// TestRemoteClonePartial: a clone that stopped part way brings back the
// children it made and the error that stopped it.
func TestRemoteClonePartial(t *testing.T) {
	f := newFake()
	c, _, _ := pair(t, f)
	ctx := context.Background()
	f.templates["web"] = api.Template{Name: "web"}
	c.Create(ctx, nodeapi.CreateRequest{Template: api.Template{Name: "web"}, Name: "p"})
	res, err := c.Clone(ctx, "p", nodeapi.CloneRequest{CloneRequest: api.CloneRequest{Count: 2}})
	if err != nil || len(res.Children) != 2 || res.ParentPauseMs != 50 || res.Parent.Name != "p" {
		t.Fatalf("clone of 2: %+v %v", res, err)
	}
	res, err = c.Clone(ctx, "p", nodeapi.CloneRequest{CloneRequest: api.CloneRequest{Count: 5}})
	if !errors.Is(err, errdefs.ErrNoRoom) || len(res.Children) != 2 || res.Children[1].Name != "p-2" {
		t.Fatalf("clone stopped at 3: %+v %v", res, err)
	}
	if _, err := c.Clone(ctx, "ghost", nodeapi.CloneRequest{CloneRequest: api.CloneRequest{Count: 1}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("clone of an unknown sandbox: %v", err)
	}
}

// flushRecorder collects what Logs writes and signals each write.
type flushRecorder struct {
	mu  sync.Mutex
	b   strings.Builder
	got chan struct{}
}

func (r *flushRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b.Write(p)
	select {
	case r.got <- struct{}{}:
	default:
	}
	return len(p), nil
}
func (r *flushRecorder) Flush() {}
func (r *flushRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b.String()
}

// TestRemoteLogsFollow: a followed log arrives as the node writes it, not
// when the stream ends, and ends when the master's caller goes away; an
// unknown sandbox's log is an error, not an empty stream.
func TestRemoteLogsFollow(t *testing.T) {
	f := newFake()
	c, _, _ := pair(t, f)
	f.templates["web"] = api.Template{Name: "web"}
	c.Create(context.Background(), nodeapi.CreateRequest{Template: api.Template{Name: "web"}, Name: "l"})
	ctx, cancel := context.WithCancel(context.Background())
	rec := &flushRecorder{got: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- c.Logs(ctx, "l", nodeapi.LogOptions{Follow: true}, rec) }()
	f.logs <- "first line\n"
	testenv.Within(t, rec.got, 10*time.Second, "a followed line did not arrive while the stream was open")
	if rec.String() != "first line\n" {
		t.Errorf("got %q", rec.String())
	}
	cancel()
	if err := testenv.Within(t, done, 10*time.Second, "a followed log did not end when its caller went away"); err != nil {
		t.Errorf("logs after the caller left: %v", err)
	}
	if err := c.Logs(context.Background(), "ghost", nodeapi.LogOptions{}, io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("logs of an unknown sandbox: %v", err)
	}
}

// TestRemoteLayer: a sandbox's layer comes through as the node wrote it;
// an unknown sandbox's is an error, not an empty stream.
func TestRemoteLayer(t *testing.T) {
	f := newFake()
	c, _, _ := pair(t, f)
	f.templates["web"] = api.Template{Name: "web"}
	sb, err := c.Create(context.Background(), nodeapi.CreateRequest{Template: api.Template{Name: "web"}, Name: "l"})
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	if err := c.Layer(context.Background(), sb.ID, &got); err != nil || got.String() != "layer of "+sb.ID {
		t.Errorf("layer: %q, %v", got.String(), err)
	}
	if err := c.Layer(context.Background(), "ghost", io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("layer of an unknown sandbox: %v", err)
	}
}

// TestRemoteMutualTLS: a node answers its master only. Refused in the
// handshake: a client certificate from another CA, none at all, an
// expired one, and one from the right CA that is not the master's (a node
// posing as the master). A node that does not answer is errdefs.ErrUnavailable.
func TestRemoteMutualTLS(t *testing.T) {
	f := newFake()
	good, ca, base := pair(t, f)
	if _, err := good.Status(context.Background()); err != nil {
		t.Fatalf("the master: %v", err)
	}
	other, _ := pki.EnsureCA(t.TempDir())
	trustingCA := func(cert *tls.Certificate) *Client {
		cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		return &Client{NodeName: "fake", Base: base, HTTP: &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}}
	}
	otherCert, _ := other.Issue(pki.MasterName, nil, time.Hour, false, true)
	expired, _ := ca.Issue(pki.MasterName, nil, -time.Minute, false, true)
	asNode, _ := ca.Issue("node other", nil, time.Hour, false, true)
	for what, c := range map[string]*Client{
		"another CA's certificate": trustingCA(&otherCert),
		"no certificate":           trustingCA(nil),
		"an expired certificate":   trustingCA(&expired),
		"a node's certificate":     trustingCA(&asNode),
		"the master, another CA":   clientWith(t, other, pki.MasterName, base),
	} {
		if _, err := c.Status(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("%s: err = %v, want refused (errdefs.ErrUnavailable)", what, err)
		}
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	gone := clientWith(t, ca, pki.MasterName, "https://"+addr)
	if _, err := gone.Status(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "node fake") {
		t.Errorf("a node not listening: %v", err)
	}
}

// TestRemoteWatch: a node's reports arrive as it sends them — the full
// one first, then each change — and a node that goes silent (a partition
// leaves the connection open with nothing on it) ends the watch as
// errdefs.ErrUnavailable within the client's silence limit.
func TestRemoteWatch(t *testing.T) {
	f := newFake()
	f.boxes["a"] = api.Sandbox{ID: "id-a", Name: "a", Tier: api.TierHot}
	c, _, _ := pair(t, f)
	c.Silence = 300 * time.Millisecond
	got := make(chan nodeapi.Report, 8)
	done := make(chan error, 1)
	go func() {
		done <- c.Watch(context.Background(), func(r nodeapi.Report) error { got <- r; return nil })
	}()
	if r := <-got; !r.Full || len(r.Sandboxes) != 1 || r.Sandboxes[0].ID != "id-a" {
		t.Fatalf("first report: %+v", r)
	}
	frozen := api.Sandbox{ID: "id-a", Name: "a", Tier: api.TierFrozen}
	f.reports <- nodeapi.Report{Event: &events.Event{Kind: events.Transition, ID: "id-a", To: "frozen"}, Sandbox: &frozen}
	if r := <-got; r.Event == nil || r.Event.Kind != events.Transition || r.Sandbox == nil || r.Sandbox.Tier != api.TierFrozen {
		t.Fatalf("a change: %+v", r)
	}
	if err := <-done; !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "no report for") {
		t.Fatalf("a silent node: %v", err)
	}
}

// TestLateCallIsRefused: a call that reaches the node after the deadline
// the master gave it (held up on the way: a partition) is refused as a
// timeout and not done; one within its deadline is done.
func TestLateCallIsRefused(t *testing.T) {
	f := newFake()
	f.templates["t"] = api.Template{Name: "t"}
	c, _, _ := pair(t, f)
	ctx := context.Background()
	late, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	// The client sends what its context says; the request is made by hand
	// so that the past deadline is sent rather than refused locally.
	req, _ := http.NewRequest(http.MethodPost, c.Base+"/node/v1/sandboxes", strings.NewReader(`{"template": {"name": "t"}, "name": "late"}`))
	if dl, ok := late.Deadline(); ok {
		req.Header.Set(DeadlineHeader, strconv.FormatInt(dl.UnixMilli(), 10))
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("a late create: HTTP %d, want 504", resp.StatusCode)
	}
	if _, err := f.Get(ctx, "late"); err == nil {
		t.Error("the late create was done")
	}
	soon, cancel2 := context.WithTimeout(ctx, time.Minute)
	defer cancel2()
	if _, err := c.Create(soon, nodeapi.CreateRequest{Template: api.Template{Name: "t"}, Name: "ontime"}); err != nil {
		t.Errorf("a create within its deadline: %v", err)
	}
}

// TestEnvdIsForwarded: a call for a sandbox's envd reaches the node's
// end as it was sent (method, path, headers, body) and its streamed
// answer comes back; one for a sandbox the node does not have is a 404
// of the error table.
func TestEnvdIsForwarded(t *testing.T) {
	f := newFake()
	f.templates["web"] = api.Template{Name: "web"}
	if _, err := f.Create(context.Background(), nodeapi.CreateRequest{Name: "a", Template: api.Template{Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	c, _, _ := pair(t, f)
	serve := func(id string) (*httptest.ResponseRecorder, error) {
		req := httptest.NewRequest(http.MethodPost, "/ignored", strings.NewReader(`{"process":{}}`))
		req.Header.Set("Connect-Protocol-Version", "1")
		rec := httptest.NewRecorder()
		return rec, c.ServeEnvd(rec, req, id, "/process.Process/Start")
	}
	rec, err := serve("id-a")
	if want := "POST /process.Process/Start 1\n{\"process\":{}}\n"; err != nil || rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Errorf("forwarded call: %v %d %q, want %q", err, rec.Code, rec.Body.String(), want)
	}
	// The node's own refusal is an error of its kind, with nothing
	// written: the caller answers it (nodeapi.Node's promise).
	rec, err = serve("id-nope")
	if !errors.Is(err, errdefs.ErrNotFound) || rec.Body.Len() != 0 || len(rec.Header()) != 0 {
		t.Errorf("unknown sandbox: %v, wrote %d %q %v; want ErrNotFound and nothing written", err, rec.Code, rec.Body.String(), rec.Header())
	}
}

// TestPortIsForwarded: a call for a sandbox's own port reaches the node
// as the client made it — its path, query and the name it was asked by —
// and a sandbox the node does not have is errdefs.ErrNotFound, nothing
// written.
func TestPortIsForwarded(t *testing.T) {
	f := newFake()
	f.templates["web"] = api.Template{Name: "web"}
	if _, err := f.Create(context.Background(), nodeapi.CreateRequest{Name: "a", Template: api.Template{Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	c, _, _ := pair(t, f)
	req := httptest.NewRequest(http.MethodGet, "https://8000-id-a.sandbox.test/some/page?q=1", nil)
	rec := httptest.NewRecorder()
	if err := c.ServePort(rec, req, "id-a", 8000); err != nil {
		t.Fatal(err)
	}
	if want := "8000 GET /some/page?q=1 8000-id-a.sandbox.test"; rec.Body.String() != want {
		t.Errorf("forwarded: %q, want %q", rec.Body.String(), want)
	}
	rec = httptest.NewRecorder()
	err := c.ServePort(rec, httptest.NewRequest(http.MethodGet, "https://8000-id-nope.sandbox.test/", nil), "id-nope", 8000)
	if !errors.Is(err, errdefs.ErrNotFound) || rec.Body.Len() != 0 {
		t.Errorf("unknown sandbox: %v, wrote %q", err, rec.Body.String())
	}
}

// TestRemoteMove: a move stream goes through the seam whole, both ways
// (2 MB out of one node, into another), its generation with it; a node's
// refusal before its first byte comes back as its error; a commit the
// node has no copy for is not found; an abort is carried with its
// generation, and a move call without one is refused.
func TestRemoteMove(t *testing.T) {
	ctx := context.Background()
	src, dst := newFake(), newFake()
	cs, _, _ := pair(t, src)
	cd, _, _ := pair(t, dst)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(cs.MoveOut(ctx, "x1", 7, pw)) }()
	sb, err := cd.MoveIn(ctx, 7, pr)
	want := len(strings.Repeat("x1@7;", 100000))
	if err != nil || sb.ID != "x1" || sb.Generation != 7 || sb.Note != fmt.Sprint(want) || sb.Moving != api.MovingIn {
		t.Fatalf("move in: %+v %v", sb, err)
	}
	if err := cs.MoveOut(ctx, "busy", 8, io.Discard); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a refused move out: %v", err)
	}
	if _, err := cd.MoveCommit(ctx, "gone", 7); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("commit of no copy: %v", err)
	}
	if sb, err := cd.MoveCommit(ctx, "x1", 7); err != nil || sb.Generation != 7 {
		t.Fatalf("commit: %+v %v", sb, err)
	}
	if err := cs.MoveAbort(ctx, "x1", 7); err != nil {
		t.Fatal(err)
	}
	if got := src.boxes["aborted-x1"]; got.Generation != 7 || got.ID != "x1" {
		t.Fatalf("abort: %+v", got)
	}
	if err := cs.do(ctx, http.MethodPost, "/node/v1/sandboxes/x1/move-abort", nil, nil, http.StatusNoContent); !errors.Is(err, errdefs.ErrBadInput) {
		t.Fatalf("a move call without a generation: %v", err)
	}
}
