package interpreter

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// keepaliveEvery is how often an execution that prints nothing writes a
// line the SDK ignores: a write is how a server learns its client went
// away (its timeout, or it was killed), and then the kernel is
// interrupted instead of running on for nobody.
const keepaliveEvery = 5 * time.Second

// Handler serves the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-s.ready:
		default:
			// Not yet: a warm template's probe waits for 2xx.
			http.Error(w, "starting the default kernel", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `"OK"`)
	})
	mux.HandleFunc("POST /execute", s.serveExecute)
	mux.HandleFunc("POST /contexts", s.serveCreate)
	mux.HandleFunc("GET /contexts", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.list()) })
	mux.HandleFunc("DELETE /contexts/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.remove(r.PathValue("id")); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /contexts/{id}/restart", func(w http.ResponseWriter, r *http.Request) {
		if err := s.restart(r.PathValue("id")); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /reseed", func(w http.ResponseWriter, r *http.Request) {
		// Only from inside the sandbox (the warm image's reseed command):
		// callers from outside come through the node, not loopback.
		if host, _, _ := net.SplitHostPort(r.RemoteAddr); !net.ParseIP(host).IsLoopback() {
			fail(w, errdefs.New(errdefs.ErrForbidden, "reseed is for the sandbox itself"))
			return
		}
		if err := s.Reseed(r.Context()); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			select {
			case <-s.ready:
			case <-r.Context().Done():
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

// fail answers err as plain text (the SDK shows a 404's body, and reads
// any other status as an error of that status).
func fail(w http.ResponseWriter, err error) {
	status, body := errdefs.ToWire(err)
	http.Error(w, body.Message, status)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func decode(r *http.Request, v any) error {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		return errdefs.New(errdefs.ErrBadInput, "request body: %v", err)
	}
	return nil
}

func (s *Server) serveCreate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	c, err := s.createContext(req.Language, req.Cwd)
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, c)
}

// executeRequestBody is what the SDK posts to /execute.
type executeRequestBody struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (s *Server) serveExecute(w http.ResponseWriter, r *http.Request) {
	var req executeRequestBody
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	if req.ContextID != "" && req.Language != "" {
		fail(w, errdefs.New(errdefs.ErrBadInput, "give context_id or language, not both"))
		return
	}
	c, err := s.context(req.ContextID, req.Language)
	if err != nil {
		fail(w, err)
		return
	}
	// The sandbox's own environment (E2B's envVars at create), which the
	// master adds to the calls it forwards to this port.
	sandboxEnv := api.DecodeEnv(r.Header.Get(api.EnvdEnvHeader))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := newStream(w)
	defer out.stop()
	if err := s.execute(r.Context(), c, req, sandboxEnv, out.emit); err != nil && r.Context().Err() == nil {
		out.emit(output{"type": "error", "name": "InterpreterError", "value": err.Error(), "traceback": ""})
	}
}

// execute runs one /execute in c: the environment first (silently), then
// the code, then the per-call variables put back as they were.
func (s *Server) execute(ctx context.Context, c *codeContext, req executeRequestBody, sandboxEnv map[string]string, emit func(output)) error {
	c.run.Lock()
	defer c.run.Unlock()
	k, err := s.live(c)
	if err != nil {
		return err
	}
	envCode := languages[c.Language].env
	if set := envCode(diff(c.env, sandboxEnv), nil); set != "" {
		if err := k.execute(ctx, set, true, func(output) {}); err != nil {
			return err
		}
		c.env = sandboxEnv
	}
	if set := envCode(req.EnvVars, nil); set != "" {
		if err := k.execute(ctx, set, true, func(output) {}); err != nil {
			return err
		}
		// Put back even if ctx ended: the next call must not see them.
		defer k.execute(context.WithoutCancel(ctx), envCode(restoreOf(req.EnvVars, c.env)), true, func(output) {})
	}
	return k.execute(ctx, req.Code, false, emit)
}

// diff is what of now is not in was, or is there with another value.
func diff(was, now map[string]string) map[string]string {
	d := map[string]string{}
	for k, v := range now {
		if old, ok := was[k]; !ok || old != v {
			d[k] = v
		}
	}
	return d
}

// restoreOf is how to undo setting vars where base was the environment
// before: base's value back, or unset (in the second map).
func restoreOf(vars, base map[string]string) (set map[string]string, unset []string) {
	set = map[string]string{}
	for k := range vars {
		if v, ok := base[k]; ok {
			set[k] = v
		} else {
			unset = append(unset, k)
		}
	}
	sort.Strings(unset)
	return set, unset
}

// stream writes output lines to an HTTP response as they come, and a
// keepalive line when none has come for keepaliveEvery.
type stream struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	last time.Time
	done chan struct{}
}

func newStream(w http.ResponseWriter) *stream {
	s := &stream{w: w, rc: http.NewResponseController(w), last: time.Now(), done: make(chan struct{})}
	s.rc.Flush()
	go s.keepalive()
	return s
}

func (s *stream) emit(o output) {
	b, err := json.Marshal(o)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.w.Write(append(b, '\n'))
	s.rc.Flush()
	s.last = time.Now()
}

func (s *stream) keepalive() {
	t := time.NewTicker(keepaliveEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			s.mu.Lock()
			select {
			case <-s.done: // stopped meanwhile: the response is not ours
			default:
				if time.Since(s.last) >= keepaliveEvery {
					s.w.Write([]byte(`{"type":"keepalive"}` + "\n"))
					s.rc.Flush()
					s.last = time.Now()
				}
			}
			s.mu.Unlock()
		}
	}
}

// stop ends the keepalives; after it the response is the handler's again.
func (s *stream) stop() {
	s.mu.Lock() // waits out a keepalive being written
	close(s.done)
	s.mu.Unlock()
}
