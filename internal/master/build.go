package master

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/imagetemplate"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
)

// DefaultBuildPrincipal is the principal of a build's RUN sandboxes
// unless the master is told another: the operator's policy grants it
// what a build may reach (a package mirror), and nothing else is.
const DefaultBuildPrincipal = "sandstorm-build"

// buildTemplate builds template {name} from a Dockerfile and its
// context (api.BuildRequest) and registers it. Its answer streams: each
// step's progress and output as api.BuildEvent lines, then the template
// or the error that ended the build. Nothing of a failed build is
// registered.
func (s *server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	req, ctxDir, err := s.readBuild(w, r)
	if ctxDir != "" {
		defer os.RemoveAll(filepath.Dir(ctxDir))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	ev := &eventWriter{w: w}
	t, err := s.build(r.Context(), req, ctxDir, ev)
	if err != nil {
		s.cfg.Log.Info("template build failed", "name", req.Template.Name, "err", err)
		_, body := errdefs.ToWire(err)
		ev.send(api.BuildEvent{Error: &body})
		return
	}
	at := toAPITemplate(t)
	ev.send(api.BuildEvent{Template: &at})
}

// build runs the build and registers its result.
func (s *server) build(ctx context.Context, req api.BuildRequest, ctxDir string, out io.Writer) (store.Template, error) {
	b := s.builder()
	pulled, err := b.Build(ctx, []byte(req.Dockerfile), ctxDir, req.BuildArgs, req.Target, out)
	if err != nil {
		return store.Template{}, err
	}
	base := filepath.Join(s.cfg.DataDir, "templates", req.Template.Name)
	dir := filepath.Join(base, "rootfs")
	if err := s.cfg.Images.Unpack(pulled.Layers, dir); err != nil {
		return store.Template{}, err
	}
	t, err := imageTemplate(req.Template, pulled, dir)
	if err != nil {
		os.RemoveAll(base)
		return store.Template{}, err
	}
	fmt.Fprintf(out, "registering template %s…\n", t.Name)
	return s.register(ctx, t)
}

// readBuild reads the request: the "build" part, then the context
// tarball extracted (untrusted: rootfs.Extract) into a directory of its
// own under the data dir.
func (s *server) readBuild(w http.ResponseWriter, r *http.Request) (api.BuildRequest, string, error) {
	var req api.BuildRequest
	if s.cfg.Images == nil {
		return req, "", errdefs.New(errdefs.ErrNotSupported, "this master builds no templates (it has no layer store)")
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "multipart/form-data" {
		return req, "", badRequest("a build is multipart: part \"build\" (JSON), then part \"context\" (a tarball)")
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxUpload)
	mr, err := r.MultipartReader()
	if err != nil {
		return req, "", badRequest("multipart body: %v", err)
	}
	part, err := mr.NextPart()
	if err != nil || part.FormName() != "build" {
		return req, "", badRequest("multipart body: the first part must be \"build\" (JSON)")
	}
	dec := json.NewDecoder(io.LimitReader(part, maxJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, "", badRequest("build part: malformed JSON: %v", err)
	}
	req.Template.Name = r.PathValue("name")
	if err := checkBuild(r.Context(), s.cfg.Store, req); err != nil {
		return req, "", err
	}
	work, err := os.MkdirTemp(s.buildDir(), "context-")
	if err != nil {
		return req, "", err
	}
	ctxDir := filepath.Join(work, "context")
	if err := os.Mkdir(ctxDir, 0o755); err != nil {
		return req, ctxDir, err
	}
	part, err = mr.NextPart()
	switch {
	case err == io.EOF:
		return req, ctxDir, nil
	case err != nil:
		return req, ctxDir, badRequest("multipart body: %v", err)
	case part.FormName() != "context":
		return req, ctxDir, badRequest("multipart body: the second part must be \"context\" (a tarball), got %q", part.FormName())
	}
	if _, err := rootfs.Extract(part, ctxDir, rootfs.Limits{MaxBytes: s.cfg.MaxUpload}); err != nil {
		return req, ctxDir, fmt.Errorf("build context: %w", err)
	}
	return req, ctxDir, nil
}

// checkBuild refuses a build that cannot end in a template.
func checkBuild(ctx context.Context, st *store.Store, req api.BuildRequest) error {
	t := req.Template
	switch {
	case !api.ValidName(t.Name):
		return badRequest("template name %q: use 1-63 of a-z, 0-9 and '-'", t.Name)
	case t.RootfsDir != "" || t.Image != nil:
		return badRequest("template %q: a build makes its rootfs: rootfs_dir and image must be empty", t.Name)
	case req.Dockerfile == "":
		return badRequest("template %q: the Dockerfile is empty", t.Name)
	}
	if _, err := st.GetTemplate(ctx, t.Name); err == nil {
		return errdefs.New(errdefs.ErrExists, "template %q: already exists (remove it first: sandstormd template rm %s)", t.Name, t.Name)
	}
	return nil
}

func (s *server) buildDir() string {
	d := filepath.Join(s.cfg.DataDir, "builds")
	os.MkdirAll(d, 0o700)
	return d
}

// builder is the master's Builder: layers in its store, RUN steps in
// sandboxes of its fleet.
func (s *server) builder() *imagetemplate.Builder {
	principal := s.cfg.BuildPrincipal
	if principal == "" {
		principal = DefaultBuildPrincipal
	}
	return &imagetemplate.Builder{
		Puller:    s.cfg.Images,
		Sandboxes: buildSandboxes{s},
		Templates: func(ctx context.Context, name string) (api.Template, error) {
			t, err := s.cfg.Store.GetTemplate(ctx, name)
			return toAPITemplate(t), err
		},
		WorkDir:   s.buildDir(),
		Principal: principal,
		CacheDir:  filepath.Join(s.cfg.DataDir, "build-cache"),
	}
}

// eventWriter sends what is written as log events, one per write,
// flushed: a step's output reaches the CLI as it comes.
type eventWriter struct {
	mu sync.Mutex
	w  http.ResponseWriter
}

func (e *eventWriter) Write(p []byte) (int, error) {
	e.send(api.BuildEvent{Log: string(p)})
	return len(p), nil
}

func (e *eventWriter) send(ev api.BuildEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, _ := json.Marshal(ev)
	e.w.Write(append(b, '\n'))
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
}

// buildSandboxes are a build's RUN sandboxes: each over a template of its
// own (named build-<random>, removed with the sandbox), envd its init,
// placed by the fleet like any other.
type buildSandboxes struct{ s *server }

func (b buildSandboxes) StartBuild(ctx context.Context, dir, principal string) (string, error) {
	var rnd [6]byte
	rand.Read(rnd[:])
	name := "build-" + hex.EncodeToString(rnd[:])
	t, err := b.s.register(ctx, store.Template{Name: name, Rootfs: dir, Principal: principal, Process: api.Process{Envd: &api.Envd{}}})
	if err != nil {
		return "", err
	}
	sb, _, err := b.s.sbx.Create(ctx, sandboxes.CreateRequest{Template: t.Name, Principal: principal})
	if err != nil {
		b.dropTemplate(name)
		return "", err
	}
	return sb.ID, nil
}

func (b buildSandboxes) Envd(id, user string) *client.Envd {
	return client.InProcess(b.s.self, b.s.cfg.Token).Envd(id, user)
}

func (b buildSandboxes) Layer(ctx context.Context, id string, w io.Writer) error {
	n, sb, _, err := b.s.sbx.Find(ctx, id)
	if err != nil {
		return err
	}
	return n.Layer(ctx, sb.ID, w)
}

// Remove deletes the sandbox and its step's template.
func (b buildSandboxes) Remove(ctx context.Context, id string) error {
	n, sb, _, err := b.s.sbx.Find(ctx, id)
	if err != nil {
		return err
	}
	if err := b.s.cfg.Fleet.Delete(ctx, n, sb); err != nil {
		return err
	}
	b.dropTemplate(sb.Template)
	return nil
}

func (b buildSandboxes) dropTemplate(name string) {
	ctx := context.Background()
	if err := b.s.cfg.Store.DeleteTemplate(ctx, name); err == nil {
		b.s.cfg.Fleet.DropTemplate(ctx, name)
	}
}
