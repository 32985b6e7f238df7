// Package master serves the sandstormd HTTP API (docs/API.md): templates and
// sandboxes, desired state kept in the store, work done by a node. It is flow
// 1 of the architecture map: client → master API → store → node → backend.
package master

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/console"
	"sandstorm/internal/enrol"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/metrics"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/pki"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
	"sandstorm/internal/templates"
)

// Config configures the API.
type Config struct {
	Store *store.Store
	// Fleet is the master's nodes: the one in this process, if any, and
	// those it paired with (nodeapi over mutual TLS).
	Fleet *fleet.Fleet
	// Sandboxes is the sandbox service /e2b shares (nil: one of its own).
	Sandboxes *sandboxes.Service
	// CA is the master's certificate authority (GET /v1/ca).
	CA *pki.CA
	// Token is the API token every request must carry as
	// "Authorization: Bearer <token>".
	Token string
	// DataDir holds extracted template rootfs under templates/<name>.
	DataDir string
	// Templates registers templates (nil: one of its own, which makes
	// none from images or builds).
	Templates *templates.Service
	// MaxUpload bounds a rootfs tarball upload, in bytes (413 beyond).
	MaxUpload int64
	Log       *slog.Logger
	// Console serves the web console at / and its event stream; nil: no
	// console (and no session logins).
	Console *console.Console
	// E2B is the E2B REST API, served under /e2b/ to the operator and to
	// teams' API keys (internal/e2b); nil: none.
	E2B http.Handler
	// E2BUploads serves PUT /e2b/uploads/…: the uploads of E2B's template
	// builds, whose URLs carry their own signature (the SDK sends no API
	// key there); nil: none.
	E2BUploads http.Handler
	// SandboxTraffic serves what the E2B SDK sends to a sandbox (envd)
	// when it is addressed to this listener: a request with an
	// E2b-Sandbox-Id header or a Host of <port>-<id>.<domain>. It checks
	// the sandbox's own access token, not the API's; nil: none.
	SandboxTraffic http.Handler
	// SandboxDomain is the domain of sandbox hosts (<port>-<id>.<domain>).
	SandboxDomain string
	// Metrics counts the API's requests by route and status (nil: none).
	Metrics *metrics.Master
}

// maxJSON bounds every JSON request body (1 MiB; 413 beyond).
const maxJSON = 1 << 20

type server struct {
	cfg Config
	// sbx is the sandbox service /v1 shares with /e2b: creates, owners,
	// who sees what.
	sbx *sandboxes.Service
	tpl *templates.Service
}

// Handler returns the API's HTTP handler.
func Handler(cfg Config) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxUpload <= 0 {
		cfg.MaxUpload = 4 << 30
	}
	s := &server{cfg: cfg, sbx: cfg.Sandboxes}
	if s.sbx == nil {
		s.sbx = &sandboxes.Service{Store: cfg.Store, Fleet: cfg.Fleet}
	}
	s.tpl = cfg.Templates
	if s.tpl == nil {
		s.tpl = &templates.Service{Store: cfg.Store, Fleet: cfg.Fleet, Sandboxes: s.sbx, DataDir: cfg.DataDir, Log: cfg.Log}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/templates", s.listTemplates)
	mux.HandleFunc("POST /v1/templates", s.createTemplate)
	mux.HandleFunc("GET /v1/templates/{name}", s.getTemplate)
	mux.HandleFunc("DELETE /v1/templates/{name}", s.deleteTemplate)
	mux.HandleFunc("POST /v1/templates/{name}/build", s.buildTemplate)
	mux.HandleFunc("GET /v1/templates/{name}/export", s.exportTemplate)
	mux.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	mux.HandleFunc("POST /v1/sandboxes", s.createSandbox)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.getSandbox)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/{op}", s.transition)
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", s.resume)
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.takeSnapshot)
	mux.HandleFunc("GET /v1/snapshots", s.listSnapshots)
	mux.HandleFunc("DELETE /v1/snapshots/{id}", s.deleteSnapshot)
	mux.HandleFunc("POST /v1/snapshots/{id}/sandboxes", s.fromSnapshot)
	mux.HandleFunc("POST /v1/sandboxes/{id}/clone", s.clone)
	mux.HandleFunc("POST /v1/sandboxes/{id}/move", s.move)
	mux.HandleFunc("GET /v1/sandboxes/{id}/logs", s.logs)
	mux.HandleFunc("GET /v1/sandboxes/{id}/usage", s.usage)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", s.setNetwork)
	mux.HandleFunc("GET /v1/sandboxes/{id}/egress", s.egressLog)
	mux.HandleFunc("/v1/sandboxes/{id}/envd/{path...}", s.envd)
	mux.HandleFunc("GET /v1/node", s.nodeStatus)
	mux.HandleFunc("GET /v1/nodes", s.listNodes)
	mux.HandleFunc("POST /v1/nodes", s.pairNode)
	mux.HandleFunc("DELETE /v1/nodes/{name}", s.forgetNode)
	mux.HandleFunc("POST /v1/nodes/{name}/drain", s.drainNode)
	mux.HandleFunc("POST /v1/nodes/{name}/undrain", s.undrainNode)
	mux.HandleFunc("POST /v1/nodes/join-tokens", s.joinToken)
	mux.HandleFunc("GET /v1/secrets", s.listSecrets)
	mux.HandleFunc("POST /v1/secrets", s.putSecret)
	mux.HandleFunc("DELETE /v1/secrets/{name}", s.deleteSecret)
	mux.HandleFunc("GET /v1/api-keys", s.listKeys)
	mux.HandleFunc("POST /v1/api-keys", s.createKey)
	mux.HandleFunc("DELETE /v1/api-keys/{id}", s.deleteKey)
	if cfg.E2B != nil {
		mux.Handle("/e2b/", http.StripPrefix("/e2b", cfg.E2B))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	var open *http.ServeMux // what needs no token: the console's page and login
	if c := cfg.Console; c != nil {
		mux.HandleFunc("GET /v1/events", c.Stream)
		open = http.NewServeMux()
		open.Handle("GET /{$}", c.Page())
		open.Handle("GET /console/", c.Page())
		open.HandleFunc("POST /v1/session", c.Sessions.ServeLogin(c.TokenAt()))
		open.HandleFunc("DELETE /v1/session", c.Sessions.ServeLogout)
	}
	if open == nil {
		open = http.NewServeMux()
	}
	// A node that dials in: the CA (public; the node checks it against the
	// fingerprint it was given), the join (authorised by its join token)
	// and the tunnel (by its certificate).
	open.HandleFunc("GET /v1/ca", s.caCert)
	open.HandleFunc("POST /v1/nodes/join", s.joinNode)
	open.HandleFunc("GET /v1/nodes/tunnel", s.cfg.Fleet.Tunnel())
	if cfg.E2BUploads != nil {
		open.Handle("PUT /e2b/uploads/", http.StripPrefix("/e2b", cfg.E2BUploads))
	}
	return s.e2bByHost(cfg.Metrics.Instrument(s.auth(mux, open), s.route(mux, open)))
}

// e2bByHost serves the E2B API at the root of api.<domain>, where E2B's
// SDK looks for it unless told otherwise (https://api.<E2B_DOMAIN>), as
// it is served under /e2b/ on every other name of the API.
func (s *server) e2bByHost(next http.Handler) http.Handler {
	if s.cfg.E2B == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := api.APIHostDomain(r.Host, s.cfg.SandboxDomain); ok && r.Header.Get("E2b-Sandbox-Id") == "" {
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/e2b" + r.URL.Path
			if r.URL.RawPath != "" {
				r2.URL.RawPath = "/e2b" + r.URL.RawPath
			}
			next.ServeHTTP(w, r2)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// route names the pattern that serves a request, for the API's metrics
// (a path holds IDs; its pattern does not): the E2B SDK's sandbox
// traffic, an open route, or the API's, whether or not the request is
// let through.
func (s *server) route(mux, open *http.ServeMux) func(*http.Request) string {
	return func(r *http.Request) string {
		if s.cfg.SandboxTraffic != nil && s.isSandboxTraffic(r) {
			return "sandbox traffic"
		}
		if _, p := open.Handler(r); p != "" {
			return p
		}
		_, p := mux.Handler(r)
		return p
	}
}

// auth lets through requests with the API token, and GETs with a console
// session (console.Sessions); open serves what needs neither (nil: none).
func (s *server) auth(next http.Handler, open *http.ServeMux) http.Handler {
	want := []byte("Bearer " + s.cfg.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.SandboxTraffic != nil && s.isSandboxTraffic(r) {
			// Checked there by the sandbox's access token: the E2B SDK
			// sends its API key to the API only.
			s.cfg.SandboxTraffic.ServeHTTP(w, r)
			return
		}
		if open != nil {
			if _, pattern := open.Handler(r); pattern != "" {
				open.ServeHTTP(w, r)
				return
			}
		}
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) == 1 {
			next.ServeHTTP(w, r.WithContext(apikey.With(r.Context(), apikey.Caller{Operator: true})))
			return
		}
		if key := keyOf(r); key != "" {
			c, err := s.teamOf(r, key)
			if err != nil {
				s.fail(w, r, err)
				return
			}
			if !teamMay(r) {
				errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrForbidden, "%s %s needs the operator's token: an API key manages its team's sandboxes only", r.Method, r.URL.Path))
				return
			}
			next.ServeHTTP(w, r.WithContext(apikey.With(r.Context(), c)))
			return
		}
		if s.cfg.Console != nil && len(got) == 0 && s.cfg.Console.Sessions.Reads(r) {
			next.ServeHTTP(w, r.WithContext(apikey.With(r.Context(), apikey.Caller{Operator: true, Session: true})))
			return
		}
		if s.cfg.Console != nil && len(got) == 0 && s.cfg.Console.Sessions.Live(r) {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrForbidden, "%s %s: a console session only reads; send the API token (Authorization: Bearer <token>; it is in <data-dir>/pki/api-token) to change anything", r.Method, r.URL.Path))
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandstorm"`)
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "missing or wrong API token: send Authorization: Bearer <token> (the token is in <data-dir>/pki/api-token), or a team's API key (Bearer or X-API-KEY)"))
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v) }

// fail answers err with its status and code from errdefs.Table, the one
// place that decides (a Retry-After with every 503); an error of no kind
// is a 500, and logged.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		err = errdefs.Mark(errdefs.ErrTooLarge, err)
	}
	if _, ok := errdefs.Lookup(err); !ok {
		s.cfg.Log.Error("api", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	errdefs.WriteHTTP(w, err)
}

func badRequest(format string, args ...any) error {
	return errdefs.New(errdefs.ErrBadInput, format, args...)
}

// decode reads a JSON body of at most maxJSON bytes into v (httpjson).
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return httpjson.Decode(w, r, v, maxJSON)
}

// decodeOptional is decode of a body that may be left out: with none
// (Content-Length 0), v stays as it is.
func decodeOptional(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decode(w, r, v)
}

func toAPITemplate(t store.Template) api.Template {
	return api.Template{Name: t.Name, Rootfs: t.Rootfs, Digest: t.Digest, Image: t.Image, Layers: t.Layers, Process: t.Process, Ports: t.Ports, MemoryMiB: t.MemoryMiB, Principal: t.Principal, Warm: t.Warm, Serves: t.Serves, CreatedAt: t.CreatedAt}
}

func (s *server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.cfg.Store.ListTemplates(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.List[api.Template]{Items: []api.Template{}}
	for _, t := range ts {
		out.Items = append(out.Items, toAPITemplate(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.cfg.Store.GetTemplate(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPITemplate(t))
}

func (s *server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	t, err := s.cfg.Store.GetTemplate(r.Context(), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.cfg.Store.DeleteTemplate(r.Context(), name); err != nil {
		s.fail(w, r, err)
		return
	}
	// Every node drops it: a warm image, and a paired node's copy of the
	// rootfs if no other template of its uses it.
	s.cfg.Fleet.DropTemplate(r.Context(), name)
	if t.Owned {
		os.RemoveAll(filepath.Dir(t.Rootfs))
	}
	w.WriteHeader(http.StatusNoContent)
}

// createTemplate registers a template from a directory already on the node
// (JSON body) or from an uploaded rootfs tarball (multipart: a "template"
// part with the JSON, then a "rootfs" part with the tarball, plain or gzip).
func (s *server) createTemplate(w http.ResponseWriter, r *http.Request) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var (
		t   store.Template
		err error
	)
	if ct == "multipart/form-data" {
		t, err = s.templateFromUpload(w, r)
	} else {
		var req api.TemplateRequest
		if err = decode(w, r, &req); err == nil && req.Image != nil && wantsEvents(r) {
			s.templateFromImageEvents(w, r, req)
			return
		} else if err == nil && req.Image != nil {
			t, err = s.tpl.FromImage(r.Context(), req, nil)
		} else if err == nil {
			t, err = s.templateFromDir(req)
		}
		if err == nil {
			// Before its digest, which reads the whole tree.
			if _, gerr := s.cfg.Store.GetTemplate(r.Context(), t.Name); gerr == nil {
				err = errdefs.New(errdefs.ErrExists, "template %q: already exists", t.Name)
			}
		}
	}
	if err == nil {
		t, err = s.tpl.Register(r.Context(), t)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toAPITemplate(t))
}

func (s *server) templateFromDir(req api.TemplateRequest) (store.Template, error) {
	if err := templates.Validate(req); err != nil {
		return store.Template{}, err
	}
	if req.RootfsDir == "" || !filepath.IsAbs(req.RootfsDir) {
		return store.Template{}, badRequest("rootfs_dir %q: give the absolute path of a rootfs directory on the node, or upload a tarball as multipart", req.RootfsDir)
	}
	dir := filepath.Clean(req.RootfsDir)
	if err := templates.CheckRootfs(dir, req.Process.Args); err != nil {
		return store.Template{}, err
	}
	return store.Template{Name: req.Name, Rootfs: dir, Process: req.Process, Ports: req.Ports, MemoryMiB: req.MemoryMiB, Principal: req.Principal, Warm: req.Warm, Serves: req.Serves}, nil
}

// templateFromUpload streams the multipart body: the "template" JSON part
// must come first so the tarball can be extracted straight into place with
// no temporary copy. The tarball is untrusted (rootfs.Extract).
func (s *server) templateFromUpload(w http.ResponseWriter, r *http.Request) (store.Template, error) {
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxUpload)
	mr, err := r.MultipartReader()
	if err != nil {
		return store.Template{}, badRequest("multipart body: %v", err)
	}
	part, err := mr.NextPart()
	if err != nil {
		return store.Template{}, badRequest("multipart body: %v", err)
	}
	if part.FormName() != "template" {
		return store.Template{}, badRequest("multipart body: the first part must be \"template\" (JSON), then \"rootfs\" (tarball); got %q first", part.FormName())
	}
	var req api.TemplateRequest
	dec := json.NewDecoder(io.LimitReader(part, maxJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return store.Template{}, badRequest("template part: malformed JSON: %v", err)
	}
	if err := templates.Validate(req); err != nil {
		return store.Template{}, err
	}
	if req.RootfsDir != "" {
		return store.Template{}, badRequest("template part: rootfs_dir and an uploaded rootfs exclude each other")
	}
	if _, err := s.cfg.Store.GetTemplate(r.Context(), req.Name); err == nil {
		return store.Template{}, fmt.Errorf("template %q: %w", req.Name, errdefs.ErrExists)
	}
	part, err = mr.NextPart()
	if err != nil {
		return store.Template{}, badRequest("multipart body: missing \"rootfs\" part: %v", err)
	}
	if part.FormName() != "rootfs" {
		return store.Template{}, badRequest("multipart body: second part must be \"rootfs\", got %q", part.FormName())
	}
	base := filepath.Join(s.cfg.DataDir, "templates", req.Name)
	dir := filepath.Join(base, "rootfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return store.Template{}, err
	}
	if _, err := rootfs.Extract(part, dir, rootfs.Limits{MaxBytes: s.cfg.MaxUpload}); err != nil {
		os.RemoveAll(base)
		return store.Template{}, err
	}
	if err := templates.CheckRootfs(dir, req.Process.Args); err != nil {
		os.RemoveAll(base)
		return store.Template{}, err
	}
	return store.Template{Name: req.Name, Rootfs: dir, Owned: true, Process: req.Process, Ports: req.Ports, MemoryMiB: req.MemoryMiB, Principal: req.Principal, Warm: req.Warm, Serves: req.Serves}, nil
}

func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	if c := s.cfg.Console; c != nil {
		// Read before the list: every event up to this number is in it,
		// so a watcher applies only later ones on top (console.js).
		w.Header().Set(console.EventSeqHeader, strconv.FormatUint(c.Events.Seq(), 10))
	}
	vis, err := s.sbx.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	all := make([]api.Sandbox, 0, len(vis))
	for _, v := range vis {
		all = append(all, withMeta(v.Sandbox, v.Meta))
	}
	if labels := r.URL.Query()["label"]; len(labels) > 0 {
		if all, err = byLabels(all, labels); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, api.List[api.Sandbox]{Items: append([]api.Sandbox{}, all...)})
}

func (s *server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.SandboxRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Template == "" {
		s.fail(w, r, badRequest("template is required"))
		return
	}
	meta, err := settings(req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sb, _, err := s.sbx.Create(r.Context(), sandboxes.CreateRequest{Template: req.Template, Name: req.Name, Principal: req.Principal, MemoryMiB: req.MemoryMiB, Idle: req.Idle, Egress: req.Egress, Secrets: req.Secrets, Meta: meta})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.decorate(r.Context(), []api.Sandbox{sb})[0])
}

// sandbox finds the sandbox of the request's {id} and its node, if the
// caller may see it (sandboxes.Service.Find).
func (s *server) sandbox(r *http.Request) (nodeapi.Node, api.Sandbox, error) {
	n, sb, _, err := s.sbx.Find(r.Context(), r.PathValue("id"))
	return n, sb, err
}

func (s *server) getSandbox(w http.ResponseWriter, r *http.Request) {
	_, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.decorate(r.Context(), []api.Sandbox{sb})[0])
}

// usage is what the sandbox uses now, as its node measures it from
// outside (it is not woken, and the read is not activity).
func (s *server) usage(w http.ResponseWriter, r *http.Request) {
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	u, err := n.Usage(r.Context(), sb.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, u)
}

// setNetwork serves PUT /v1/sandboxes/{id}/network: the sandbox's egress
// rules (api.Egress), replaced whole; empty clears them. Its boundary
// applies them to new flows at once.
func (s *server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var e api.Egress
	if err := decode(w, r, &e); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := egress.AllowAlone(e.AllowOut, e.DenyOut); err != nil {
		s.fail(w, r, badRequest("%v", err))
		return
	}
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.sbx.Lock(sb.ID)()
	if sb, err = n.SetEgress(r.Context(), sb.ID, e); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.decorate(r.Context(), []api.Sandbox{sb})[0])
}

func (s *server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.cfg.Fleet.Delete(r.Context(), n, sb); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.cfg.Store.Teams().DeleteSandboxMeta(r.Context(), sb.ID); err != nil {
		s.cfg.Log.Warn("forget a deleted sandbox's labels and team", "id", sb.ID, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// transition serves POST /v1/sandboxes/{id}/{freeze|snapshot|detach|wake}.
func (s *server) transition(w http.ResponseWriter, r *http.Request) {
	op, ok := nodeapi.ParseOp(r.PathValue("op"))
	if !ok {
		s.fail(w, r, errdefs.New(errdefs.ErrNotFound, "no transition %q: use freeze, snapshot, detach or wake", r.PathValue("op")))
		return
	}
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if sb, err = n.Transition(r.Context(), sb.ID, op); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

// pause serves POST /v1/sandboxes/{id}/pause [{"memory": false}]: the
// sandbox is paused — E2B's paused: someone's, not idleness's — until a
// resume (sandboxes.Service.Pause: with its memory the snapshot tier,
// without it the detached tier); a paused one is a conflict (409).
func (s *server) pause(w http.ResponseWriter, r *http.Request) {
	req := api.PauseRequest{}
	if err := decodeOptional(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	_, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.sbx.Lock(sb.ID)() // by ID, as /e2b locks it
	if _, err := s.sbx.Pause(r.Context(), sb.ID, req.Memory == nil || *req.Memory); err != nil {
		s.fail(w, r, err)
		return
	}
	s.getSandbox(w, r)
}

// resume serves POST /v1/sandboxes/{id}/resume: it is hot and no longer
// paused (a pause without memory is a cold boot).
func (s *server) resume(w http.ResponseWriter, r *http.Request) {
	_, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.sbx.Lock(sb.ID)()
	if _, _, err := s.sbx.Resume(r.Context(), sb.ID, sandboxes.ResumeOpts{}); err != nil {
		s.fail(w, r, err)
		return
	}
	s.getSandbox(w, r)
}

// move serves POST /v1/sandboxes/{id}/move [{"to": NODE}]: a sandbox
// whose node answers moves to another node with its memory and volume,
// keeping its ID (fleet.LiveMove; 200); one whose node is lost is created
// again, cold, on another node, with a new ID (fleet.Move; 201).
func (s *server) move(w http.ResponseWriter, r *http.Request) {
	var req api.MoveRequest
	if err := decodeOptional(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	_, old, err := s.cfg.Fleet.Find(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.cfg.Fleet.Answers(old.Node) {
		// The moves a drain makes, one by one; its caller going away
		// does not cut it short (it settles either way: fleet/move.go).
		sb, err := s.cfg.Fleet.LiveMove(context.WithoutCancel(r.Context()), old.ID, req.To)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, s.decorate(r.Context(), []api.Sandbox{sb})[0])
		return
	}
	if req.To != "" {
		s.fail(w, r, errdefs.New(errdefs.ErrBadInput, "sandbox %s's node %s is lost: a cold move goes where placement puts it (no \"to\")", old.Name, old.Node))
		return
	}
	sb, err := s.cfg.Fleet.Move(r.Context(), old.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The new sandbox is the old one's for its team, labels, env and
	// lifetime (its ID is new).
	if m, err := s.cfg.Store.Teams().GetSandboxMeta(r.Context(), old.ID); err == nil {
		m.ID = sb.ID
		if err := s.cfg.Store.Teams().PutSandboxMeta(r.Context(), m); err != nil {
			s.fail(w, r, err)
			return
		}
		s.cfg.Store.Teams().DeleteSandboxMeta(r.Context(), old.ID)
	}
	writeJSON(w, http.StatusCreated, s.decorate(r.Context(), []api.Sandbox{sb})[0])
}

// clone makes children of a sandbox from its memory (node.Clone).
func (s *server) clone(w http.ResponseWriter, r *http.Request) {
	var req api.CloneRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	n, parent, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// Each child is its parent's team's, with its labels and env (and no
	// lifetime of its own: none was asked).
	out, err := s.sbx.Clone(r.Context(), n, parent, req, time.Time{})
	if err != nil && len(out.Children) == 0 {
		s.fail(w, r, err)
		return
	}
	if err != nil {
		// Some children were made: they are there; say what stopped it.
		s.cfg.Log.Error("clone stopped part way", "parent", r.PathValue("id"), "made", len(out.Children), "err", err)
		writeJSON(w, http.StatusMultiStatus, struct {
			api.CloneResult
			Error string `json:"error"`
		}{out, err.Error()})
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

// logs serves the sandbox's console output (nodeapi.Node.Logs): the last
// 64 KiB, with ?follow=1 then what is appended until the client goes away
// or the sandbox is deleted, with ?timestamps=1 every line timed.
func (s *server) logs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opt := nodeapi.LogOptions{
		Follow:     q.Get("follow") == "1" || q.Get("follow") == "true",
		Timestamps: q.Get("timestamps") == "1" || q.Get("timestamps") == "true",
	}
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := n.Logs(r.Context(), sb.ID, opt, w); err != nil {
		s.cfg.Log.Warn("logs", "id", sb.ID, "err", err)
	}
}

// egressLog serves the sandbox's egress log (nodeapi.Node.EgressLog): a
// page of the flows after ?after (at most ?limit) as api.EgressPage; with
// ?follow=1, JSON lines of pages, that one and then each new batch, until
// the client goes away or the sandbox is deleted.
func (s *server) egressLog(w http.ResponseWriter, r *http.Request) {
	opt, err := nodeapi.ParseEgressLogOptions(r.URL.Query())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if opt.Follow {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	if err := n.EgressLog(r.Context(), sb.ID, opt, w); err != nil {
		s.cfg.Log.Warn("egress log", "id", sb.ID, "err", err)
	}
}

// envd serves /v1/sandboxes/{id}/envd/{path}: the E2B envd API of the
// sandbox (commands and files; docs/API.md), forwarded to its node, which
// wakes it and starts envd in it. It runs commands in the sandbox, so the
// API token is needed, never a console session (which only reads). That
// token (or API key) is the master's: it is not forwarded into the sandbox. The user
// a call acts as comes in X-Sandstorm-User and goes to envd as the SDK
// sends it (Authorization: Basic "<user>:").
func (s *server) envd(w http.ResponseWriter, r *http.Request) {
	if apikey.From(r.Context()).Session {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "commands and files need the API token (Authorization: Bearer <token>) or an API key, not a console session"))
		return
	}
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	r.Header.Del("Authorization")
	r.Header.Del("X-Api-Key")
	if err := s.withEnv(r, sb.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	if u := r.Header.Get(EnvdUserHeader); u != "" {
		r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u+":")))
		r.Header.Del(EnvdUserHeader)
	}
	if err := n.ServeEnvd(w, r, sb.ID, "/"+r.PathValue("path")); err != nil {
		s.fail(w, r, err)
	}
}

// EnvdUserHeader names the user an envd call through the API acts as.
const EnvdUserHeader = "X-Sandstorm-User"

// listNodes serves GET /v1/nodes: every node of the fleet with its
// headroom, or "lost" (and why) for one that does not answer.
func (s *server) listNodes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.List[api.NodeStatus]{Items: s.cfg.Fleet.Statuses(r.Context())})
}

// pairNode serves POST /v1/nodes {address, pairing_code}: pair the node
// listening there (serve --node --node-listen) with this master.
func (s *server) pairNode(w http.ResponseWriter, r *http.Request) {
	var req api.NodeRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Address == "" || req.PairingCode == "" {
		s.fail(w, r, badRequest("give the node's address (host:port of its --node-listen) and its pairing code (<its data-dir>/pki/node/pairing-code)"))
		return
	}
	name, err := s.cfg.Fleet.Pair(r.Context(), req.Address, req.PairingCode)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for _, st := range s.cfg.Fleet.Statuses(r.Context()) {
		if st.Name == name {
			writeJSON(w, http.StatusCreated, st)
			return
		}
	}
	writeJSON(w, http.StatusCreated, api.NodeStatus{Name: name, Address: req.Address})
}

// caCert serves GET /v1/ca: the master's CA certificate (PEM).
func (s *server) caCert(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Write(s.cfg.CA.PEM)
}

// joinToken serves POST /v1/nodes/join-tokens: a token a node behind NAT
// joins with, once, within the hour, and the CA fingerprint it checks the
// master by.
func (s *server) joinToken(w http.ResponseWriter, r *http.Request) {
	tok, until, err := s.cfg.Fleet.NewJoinToken(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.JoinToken{Token: tok, ExpiresAt: until, CAFingerprint: s.cfg.CA.Fingerprint(),
		Command: fmt.Sprintf("sandstormd serve --node --node-name NAME --join https://%s --ca-fingerprint %s --join-token %s", r.Host, s.cfg.CA.Fingerprint(), tok)})
}

// joinNode serves POST /v1/nodes/join (a node, with its join token).
func (s *server) joinNode(w http.ResponseWriter, r *http.Request) {
	var req enrol.JoinRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	reply, err := s.cfg.Fleet.Join(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, reply)
}

// forgetNode serves DELETE /v1/nodes/{name}: refused while the master has
// sandboxes on it.
func (s *server) forgetNode(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Fleet.Forget(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// drainNode serves POST /v1/nodes/{name}/drain: the node takes no new
// sandboxes, and each of its own moves to another node with its memory
// (fleet.Drain). The answer is JSON lines, one api.DrainEvent per
// sandbox as it is moved, then the sum (done: true). The drain runs to
// its end even if its caller goes away.
func (s *server) drainNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx := context.WithoutCancel(r.Context())
	var mu sync.Mutex
	started := false
	enc := json.NewEncoder(w)
	fl, _ := w.(http.Flusher)
	send := func(ev api.DrainEvent) {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		enc.Encode(ev)
		if fl != nil {
			fl.Flush()
		}
	}
	sum, err := s.cfg.Fleet.Drain(ctx, name, send)
	if err != nil && !started {
		s.fail(w, r, err)
		return
	}
	if err != nil {
		sum.Error = err.Error()
	}
	send(sum)
}

// undrainNode serves POST /v1/nodes/{name}/undrain: the node takes new
// sandboxes again.
func (s *server) undrainNode(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Fleet.Undrain(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// nodeStatus serves GET /v1/node: the node in this master's process.
func (s *server) nodeStatus(w http.ResponseWriter, r *http.Request) {
	n := s.cfg.Fleet.Local()
	if n == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrNotFound, "this master runs no node of its own (serve --master without --node): see GET /v1/nodes"))
		return
	}
	st, err := n.Status(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}
