// Package remote is the master↔node seam (internal/nodeapi) over the
// network: Server is a node's end (an
// http.Handler the node serves to its master only: mutual TLS with
// certificates from the master's CA, internal/pki), Client the master's
// (client.go). Requests and answers are the wire types of nodeapi.Node, as
// JSON; errors are api.Error with the codes of errdefs.Table, which Client
// turns back into their kinds. Both ends of the report stream (Watch) are
// here too.
package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
)

// maxBody bounds a request's JSON body on the node.
const maxBody = 1 << 20

// Server serves n to a master.
func Server(n nodeapi.Node) http.Handler {
	s := server{n: n, mux: http.NewServeMux()}
	s.sandboxes()
	s.egress()
	s.templates()
	s.moves()
	s.handle("GET /node/v1/status", func(w http.ResponseWriter, r *http.Request) error {
		st, err := n.Status(r.Context())
		return reply(w, http.StatusOK, st, err)
	})
	s.handle("GET /node/v1/ingress", func(w http.ResponseWriter, r *http.Request) error {
		in, err := n.Ingress(r.Context())
		return reply(w, http.StatusOK, in, err)
	})
	s.handle("POST /node/v1/fence", withBody(http.StatusOK, n.Fence))
	s.handle("PUT /node/v1/routes", func(w http.ResponseWriter, r *http.Request) error {
		var u nodeapi.Routes
		if err := readJSONUpTo(r, &u, maxRoutes); err != nil {
			return err
		}
		return noContent(w, n.PutRoutes(r.Context(), u))
	})
	s.handle("GET /node/v1/watch", func(w http.ResponseWriter, r *http.Request) error {
		return serveWatch(n, w, r)
	})
	return s.mux
}

// server is Server's routes over one node.
type server struct {
	n   nodeapi.Node
	mux *http.ServeMux
}

// handle serves pattern with f, refusing a call past its deadline and
// answering f's error as the seam's error body.
func (s server) handle(pattern string, f func(w http.ResponseWriter, r *http.Request) error) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if err := pastDeadline(r); err != nil {
			writeError(w, err)
			return
		}
		if err := f(w, r); err != nil {
			writeError(w, err)
		}
	})
}

// withBody serves a call whose request is the JSON body: f's answer, with
// status when it succeeds.
func withBody[Req, Res any](status int, f func(context.Context, Req) (Res, error)) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		var req Req
		if err := readJSON(r, &req); err != nil {
			return err
		}
		res, err := f(r.Context(), req)
		return reply(w, status, res, err)
	}
}

// noContent answers 204 unless err.
func noContent(w http.ResponseWriter, err error) error {
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// egress are the routes of a sandbox's egress: its log, its rules.
func (s server) egress() {
	n := s.n
	s.handle("GET /node/v1/sandboxes/{id}/egress", func(w http.ResponseWriter, r *http.Request) error {
		opt, err := nodeapi.ParseEgressLogOptions(r.URL.Query())
		if err != nil {
			return err
		}
		lw := &lazyWriter{w: w}
		if err := n.EgressLog(r.Context(), r.PathValue("id"), opt, lw); err != nil && !lw.started {
			return err
		}
		return nil
	})
	s.handle("PUT /node/v1/sandboxes/{id}/egress", func(w http.ResponseWriter, r *http.Request) error {
		var e api.Egress
		if err := readJSON(r, &e); err != nil {
			return err
		}
		sb, err := n.SetEgress(r.Context(), r.PathValue("id"), e)
		return reply(w, http.StatusOK, sb, err)
	})
}

// sandboxes are the routes of one sandbox's calls.
func (s server) sandboxes() {
	n := s.n
	s.handle("POST /node/v1/sandboxes", withBody(http.StatusCreated, n.Create))
	s.handle("GET /node/v1/sandboxes", func(w http.ResponseWriter, r *http.Request) error {
		all, err := n.List(r.Context())
		return reply(w, http.StatusOK, api.List[api.Sandbox]{Items: append([]api.Sandbox{}, all...)}, err)
	})
	s.handle("GET /node/v1/sandboxes/{ref}", func(w http.ResponseWriter, r *http.Request) error {
		sb, err := n.Get(r.Context(), r.PathValue("ref"))
		return reply(w, http.StatusOK, sb, err)
	})
	s.handle("GET /node/v1/sandboxes/{id}/usage", func(w http.ResponseWriter, r *http.Request) error {
		u, err := n.Usage(r.Context(), r.PathValue("id"))
		return reply(w, http.StatusOK, u, err)
	})
	s.handle("DELETE /node/v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) error {
		return noContent(w, n.Delete(r.Context(), r.PathValue("id")))
	})
	s.handle("POST /node/v1/sandboxes/{id}/{op}", func(w http.ResponseWriter, r *http.Request) error {
		if r.PathValue("op") == "clone" {
			var req nodeapi.CloneRequest
			if err := readJSON(r, &req); err != nil {
				return err
			}
			res, err := n.Clone(r.Context(), r.PathValue("id"), req)
			if err != nil && len(res.Children) > 0 {
				return writeJSON(w, http.StatusMultiStatus, partialClone{Result: res, Error: wireError(err)})
			}
			return reply(w, http.StatusCreated, res, err)
		}
		op, ok := nodeapi.ParseOp(r.PathValue("op"))
		if !ok {
			return fmt.Errorf("%w: no transition %q", errdefs.ErrBadInput, r.PathValue("op"))
		}
		sb, err := n.Transition(r.Context(), r.PathValue("id"), op)
		return reply(w, http.StatusOK, sb, err)
	})
	s.handle("GET /node/v1/sandboxes/{id}/logs", func(w http.ResponseWriter, r *http.Request) error {
		q := r.URL.Query()
		opt := nodeapi.LogOptions{Follow: q.Get("follow") == "1", Timestamps: q.Get("timestamps") == "1"}
		// Written through a writer that sends the status line with the
		// first byte, so an error found before any (an unknown sandbox)
		// is still an error answer.
		lw := &lazyWriter{w: w}
		err := n.Logs(r.Context(), r.PathValue("id"), opt, lw)
		if err != nil && !lw.started {
			return err
		}
		return nil
	})
	s.handle("GET /node/v1/sandboxes/{id}/layer", func(w http.ResponseWriter, r *http.Request) error {
		// An unknown sandbox is an error answer; a failure after the
		// first byte cuts the stream, which the client reports.
		lw := &lazyWriter{w: w}
		if err := n.Layer(r.Context(), r.PathValue("id"), lw); err != nil && !lw.started {
			return err
		}
		return nil
	})
	s.mux.HandleFunc("/node/v1/sandboxes/{id}/envd/{path...}", func(w http.ResponseWriter, r *http.Request) {
		if err := pastDeadline(r); err != nil {
			writeError(w, err)
			return
		}
		if err := n.ServeEnvd(w, r, r.PathValue("id"), "/"+r.PathValue("path")); err != nil {
			seamError(w, err)
		}
	})
	s.mux.HandleFunc("/node/v1/sandboxes/{id}/ports/{port}/{path...}", func(w http.ResponseWriter, r *http.Request) {
		if err := pastDeadline(r); err != nil {
			writeError(w, err)
			return
		}
		port, err := strconv.Atoi(r.PathValue("port"))
		if err != nil {
			writeError(w, errdefs.New(errdefs.ErrBadInput, "port %q: want a number", r.PathValue("port")))
			return
		}
		// The request as the sandbox is to see it: its own path and the
		// name it was asked by.
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawPath = "/"+r.PathValue("path"), ""
		if h := r.Header.Get("X-Forwarded-Host"); h != "" {
			r2.Host = h
		}
		r2.Header.Del("X-Forwarded-Host")
		r2.Header.Del(DeadlineHeader)
		if err := n.ServePort(w, r2, r.PathValue("id"), port); err != nil {
			seamError(w, err)
		}
	})
}

// templates are the routes of templates and their trees.
func (s server) templates() {
	n := s.n
	s.handle("PUT /node/v1/templates/{name}", func(w http.ResponseWriter, r *http.Request) error {
		var t api.Template
		if err := readJSON(r, &t); err != nil {
			return err
		}
		if t.Name != r.PathValue("name") {
			return fmt.Errorf("%w: template %q sent to /templates/%s", errdefs.ErrBadInput, t.Name, r.PathValue("name"))
		}
		return noContent(w, n.PrepareTemplate(r.Context(), t))
	})
	s.handle("DELETE /node/v1/templates/{name}", func(w http.ResponseWriter, r *http.Request) error {
		return noContent(w, n.DropTemplate(r.Context(), r.PathValue("name")))
	})
	s.handle("PUT /node/v1/rootfs/{digest}", func(w http.ResponseWriter, r *http.Request) error {
		// The body is the tarball, streamed: its bound is the rootfs
		// extraction's own (rootfs.Limits), not maxBody.
		return noContent(w, n.PutRootfs(r.Context(), r.PathValue("digest"), r.Body))
	})
	s.handle("POST /node/v1/layers/missing", func(w http.ResponseWriter, r *http.Request) error {
		var req layersBody
		if err := readJSON(r, &req); err != nil {
			return err
		}
		missing, err := n.Layers(r.Context(), req.Digests)
		return reply(w, http.StatusOK, layersBody{Digests: append([]string{}, missing...)}, err)
	})
	s.handle("PUT /node/v1/layers/{digest}", func(w http.ResponseWriter, r *http.Request) error {
		// Streamed as a rootfs is: bounded by the layer's extraction.
		return noContent(w, n.PutLayer(r.Context(), r.PathValue("digest"), r.Body))
	})
}

// layersBody is a Layers call's request (the template's layers) and its
// answer (those the node lacks).
type layersBody struct {
	Digests []string `json:"digests"`
}

// moves are the routes of a live move's four calls.
func (s server) moves() {
	n := s.n
	s.handle("GET /node/v1/sandboxes/{id}/move-out", func(w http.ResponseWriter, r *http.Request) error {
		gen, err := generation(r)
		if err != nil {
			return err
		}
		// The status goes with the first byte: an error before any (a
		// sandbox that cannot leave) is an error answer; one after cuts
		// the stream, which the other end then finds incomplete.
		lw := &lazyWriter{w: w, contentType: "application/x-tar"}
		if err := n.MoveOut(r.Context(), r.PathValue("id"), gen, lw); err != nil && !lw.started {
			return err
		}
		return nil
	})
	s.handle("PUT /node/v1/move-in", func(w http.ResponseWriter, r *http.Request) error {
		gen, err := generation(r)
		if err != nil {
			return err
		}
		// The body is the move stream: its bounds are its manifest's,
		// checked as it is written (node.MoveIn), not maxBody.
		sb, err := n.MoveIn(r.Context(), gen, r.Body)
		return reply(w, http.StatusCreated, sb, err)
	})
	s.handle("POST /node/v1/sandboxes/{id}/move-commit", func(w http.ResponseWriter, r *http.Request) error {
		gen, err := generation(r)
		if err != nil {
			return err
		}
		sb, err := n.MoveCommit(r.Context(), r.PathValue("id"), gen)
		return reply(w, http.StatusOK, sb, err)
	})
	s.handle("POST /node/v1/sandboxes/{id}/move-abort", func(w http.ResponseWriter, r *http.Request) error {
		gen, err := generation(r)
		if err != nil {
			return err
		}
		return noContent(w, n.MoveAbort(r.Context(), r.PathValue("id"), gen))
	})
}

type partialClone struct {
	Result api.CloneResult `json:"result"`
	Error  api.Error       `json:"error"`
}

func readJSON(r *http.Request, v any) error {
	return readJSONUpTo(r, v, maxBody)
}

// maxRoutes bounds a push of routes: the whole table of a fleet of
// about 100,000 sandboxes (a route is about 400 bytes).
const maxRoutes = 64 << 20

func readJSONUpTo(r *http.Request, v any, limit int64) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: malformed JSON body: %v", errdefs.ErrBadInput, err)
	}
	return nil
}

func reply(w http.ResponseWriter, status int, v any, err error) error {
	if err != nil {
		return err
	}
	return writeJSON(w, status, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// wireError is err as the seam's error body (errdefs.Table).
func wireError(err error) api.Error {
	_, e := errdefs.ToWire(err)
	return e
}

func writeError(w http.ResponseWriter, err error) { errdefs.WriteHTTP(w, err) }

// SeamErrorHeader marks, on a forwarded call's answer, an error of the
// node's own (the sandbox was not there, not what the sandbox answered):
// the client returns it as an error, having written nothing, as
// nodeapi.Node's ServeEnvd and ServePort promise.
const SeamErrorHeader = "Sandstorm-Seam-Error"

func seamError(w http.ResponseWriter, err error) {
	w.Header().Set(SeamErrorHeader, "1")
	writeError(w, err)
}

// generation is a move call's ?generation=, a positive number.
func generation(r *http.Request) (int64, error) {
	g, err := strconv.ParseInt(r.URL.Query().Get("generation"), 10, 64)
	if err != nil || g <= 0 {
		return 0, errdefs.New(errdefs.ErrBadInput, "a move call needs ?generation=<its move's generation>")
	}
	return g, nil
}

// lazyWriter writes the 200 and its header with the first byte, and
// flushes after every write.
type lazyWriter struct {
	w           http.ResponseWriter
	started     bool
	contentType string // "": text
}

func (l *lazyWriter) start() {
	if !l.started {
		l.started = true
		ct := l.contentType
		if ct == "" {
			ct = "text/plain; charset=utf-8"
		}
		l.w.Header().Set("Content-Type", ct)
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	l.start()
	return l.w.Write(b)
}

func (l *lazyWriter) Flush() {
	l.start()
	if f, ok := l.w.(http.Flusher); ok {
		f.Flush()
	}
}

// serveWatch is the node's end of Watch over the network: one JSON
// nodeapi.Report per line, flushed as it is written.
func serveWatch(n nodeapi.Node, w http.ResponseWriter, r *http.Request) error {
	fl, ok := w.(http.Flusher)
	if !ok {
		return errors.New("watch: the connection cannot stream")
	}
	started := false
	enc := json.NewEncoder(w)
	err := n.Watch(r.Context(), func(rep nodeapi.Report) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		if err := enc.Encode(rep); err != nil {
			return err
		}
		fl.Flush()
		return nil
	})
	if err != nil && !started {
		return err
	}
	return nil
}
