package master

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/store"
)

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
	t, err := s.tpl.Build(r.Context(), req, ctxDir, ev)
	if err != nil {
		s.cfg.Log.Info("template build failed", "name", req.Template.Name, "err", err)
		_, body := errdefs.ToWire(err)
		ev.send(api.BuildEvent{Error: &body})
		return
	}
	at := toAPITemplate(t)
	ev.send(api.BuildEvent{Template: &at})
}

// wantsEvents: the client asked for the answer as api.BuildEvent lines
// (Accept: application/x-ndjson), progress first.
func wantsEvents(r *http.Request) bool {
	for _, a := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, _ := mime.ParseMediaType(strings.TrimSpace(a)); mt == "application/x-ndjson" {
			return true
		}
	}
	return false
}

// templateFromImageEvents is POST /v1/templates with an image, answered
// as a build is: the pull's progress (each layer, pulled or already here;
// the unpack; the nodes readied) as api.BuildEvent lines, then the
// template or the error.
func (s *server) templateFromImageEvents(w http.ResponseWriter, r *http.Request, req api.TemplateRequest) {
	if _, err := s.cfg.Store.GetTemplate(r.Context(), req.Name); err == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrExists, "template %q: already exists", req.Name))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	ev := &eventWriter{w: w}
	t, err := s.tpl.FromImage(r.Context(), req, ev)
	if err == nil {
		fmt.Fprintf(ev, "readying template %s on every node…\n", req.Name)
		t, err = s.tpl.Register(r.Context(), t)
	}
	if err != nil {
		s.cfg.Log.Info("template from image failed", "name", req.Name, "err", err)
		_, body := errdefs.ToWire(err)
		ev.send(api.BuildEvent{Error: &body})
		return
	}
	at := toAPITemplate(t)
	ev.send(api.BuildEvent{Template: &at})
}

// readBuild reads the request: the "build" part, then the context
// tarball extracted (untrusted: rootfs.Extract) into a directory of its
// own under the data dir.
func (s *server) readBuild(w http.ResponseWriter, r *http.Request) (api.BuildRequest, string, error) {
	var req api.BuildRequest
	if s.tpl.Images == nil {
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
	work, err := os.MkdirTemp(s.tpl.BuildDir(), "context-")
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
