package boundary

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"strings"
	"sync"
	"time"

	"sandstorm/internal/policy"
)

// The mesh entrypoint. A flow to mesh.sam.alt or <svc>.<type>.sam.alt is
// not spliced to the node: the boundary is the HTTP/1.1 server on it, and
// forwards only the agent-facing paths, with the agent's identity set by
// the boundary (who the sandbox is) and every identity or credential header
// the agent sent removed.

// firstConnMaxAge: a mesh connection opened at admission and not used
// within this long is not trusted to be open still (the node may have timed
// it out); a fresh one is dialled instead.
const firstConnMaxAge = 5 * time.Second

var discardLog = log.New(io.Discard, "", 0)

// serveMesh serves HTTP on the sandbox's side of f. a.far is the mesh
// connection opened at admission; it carries the first request.
func (b *Boundary) serveMesh(f *flow, a *admission, prefix []byte) {
	mc := &meshConn{Conn: f.c, f: f, closed: make(chan struct{})}
	if len(prefix) > 0 {
		mc.r = io.MultiReader(bytes.NewReader(prefix), f.c)
	}
	first := &firstConn{c: a.far, at: time.Now()}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if c := first.take(); c != nil {
				return c, nil
			}
			if b.cfg.Mesh == nil {
				return nil, errMeshUnreachable
			}
			c, err := b.cfg.Mesh(ctx)
			if err != nil {
				return nil, err
			}
			if !f.addFar(c) {
				return nil, errFlowClosed
			}
			return c, nil
		},
		// One agent connection is one sequence of requests: one node
		// connection serves it.
		MaxIdleConns:        1,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	h := &meshHandler{b: b, dest: a.dest}
	h.proxy = &httputil.ReverseProxy{
		Rewrite:       h.rewrite,
		Transport:     tr,
		FlushInterval: -1, // server-sent events reach the agent as they come
		ErrorHandler:  h.proxyError,
		ErrorLog:      discardLog,
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          discardLog,
	}
	srv.Serve(&oneConnListener{c: mc})
	tr.CloseIdleConnections()
	first.discard()
	mc.Close()
}

// meshConn is the sandbox's side as the HTTP server sees it. It has no
// CloseWrite, so the server never half-closes it (a FIN); Close resets it
// once the sandbox has every byte.
type meshConn struct {
	net.Conn
	r      io.Reader // bytes read before the server took over, then Conn
	f      *flow
	once   sync.Once
	closed chan struct{}
}

func (c *meshConn) Read(p []byte) (int, error) {
	if c.r != nil {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

func (c *meshConn) Close() error {
	c.once.Do(func() {
		c.f.end()
		close(c.closed)
	})
	return nil
}

// oneConnListener hands out one connection, then blocks until it is closed.
type oneConnListener struct {
	c    *meshConn
	done bool
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.done {
		l.done = true
		return l.c, nil
	}
	<-l.c.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// firstConn is the mesh connection opened at admission, used once.
type firstConn struct {
	mu sync.Mutex
	c  net.Conn
	at time.Time
}

func (f *firstConn) take() net.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.c
	f.c = nil
	if c != nil && time.Since(f.at) > firstConnMaxAge {
		c.Close()
		return nil
	}
	return c
}

func (f *firstConn) discard() {
	if c := f.take(); c != nil {
		c.Close()
	}
}

type meshHandler struct {
	b     *Boundary
	dest  policy.Dest
	proxy *httputil.ReverseProxy
}

type meshReqKey struct{}

// meshReq is what ServeHTTP decided for the proxy's Rewrite.
type meshReq struct {
	target string
	dest   policy.Dest
}

// identityHeaders are removed from every request an agent sends to the
// mesh, besides every X-Sam-* and X-Forwarded-* header.
var identityHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key", "Forwarded", "X-Real-Ip"}

// stripIdentity removes identity and credential headers; it reports whether
// there were any.
func stripIdentity(h http.Header) bool {
	found := false
	for k := range h {
		if strings.HasPrefix(k, "X-Sam-") || strings.HasPrefix(k, "X-Forwarded-") {
			delete(h, k)
			found = true
		}
	}
	for _, k := range identityHeaders {
		if _, ok := h[k]; ok {
			delete(h, k)
			found = true
		}
	}
	return found
}

// meshTarget maps the path an agent asked for to the node's path; false if
// agents may not use it.
func meshTarget(d policy.Dest, p string) (string, bool) {
	switch {
	case d.Kind == policy.KindMesh:
		switch {
		case p == "/v1/models", p == "/v1/chat/completions", p == "/v1/completions", p == "/mcp",
			strings.HasPrefix(p, "/mcp/"),
			strings.HasPrefix(p, "/v1/models/") && len(p) > len("/v1/models/"):
			return p, true
		}
	case d.Type == "mcp":
		switch p {
		case "/", "/mcp", "/mcp/":
			return "/mcp/" + d.Service, true
		}
	case d.Type == "inference":
		switch {
		case p == "/v1/models", p == "/v1/chat/completions", p == "/v1/completions",
			strings.HasPrefix(p, "/v1/models/") && len(p) > len("/v1/models/"):
			return p, true
		}
	}
	return "", false
}

// cleanPath reports whether p is already in canonical form (no "..", ".",
// "//"); a trailing slash is kept.
func cleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

func (h *meshHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b := h.b
	dest := h.dest
	if r.URL.Host != "" {
		// Absolute form: the boundary is the agent's HTTP proxy, and a
		// client may send requests for several hosts on one connection.
		// Mesh names are served here; anything else wants CONNECT.
		d, err := policy.Classify(hostOnly(r.URL.Host))
		if err != nil || d.Kind == policy.KindExternal {
			h.refuse(w, http.StatusMethodNotAllowed, "method_not_allowed", "plain HTTP is served for mesh names only; use CONNECT")
			return
		}
		dest = d
	}
	if r.Method == http.MethodConnect {
		h.refuse(w, http.StatusMethodNotAllowed, "method_not_allowed", "CONNECT is not served on the mesh")
		return
	}
	// The policy in force decides every request: it may have changed since
	// the flow was admitted.
	if ok, _ := b.policy().Decide(b.cfg.Principal, dest); !ok {
		h.refuse(w, http.StatusForbidden, "destination_not_allowed", "destination not allowed for this sandbox")
		return
	}
	target, ok := "", false
	if r.URL.RawPath == "" && cleanPath(r.URL.Path) {
		target, ok = meshTarget(dest, r.URL.Path)
	}
	if !ok {
		h.refuse(w, http.StatusForbidden, "path_not_allowed", "path not available to agents: "+r.URL.Path)
		return
	}
	if stripIdentity(r.Header) {
		b.st.stripped.Add(1)
	}
	b.st.meshForwarded.Add(1)
	b.m.meshRequest(meshForwarded)
	h.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), meshReqKey{}, meshReq{target: target, dest: dest})))
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

func (h *meshHandler) rewrite(pr *httputil.ProxyRequest) {
	mr, _ := pr.In.Context().Value(meshReqKey{}).(meshReq)
	u := pr.Out.URL
	u.Scheme, u.Host, u.Path, u.RawPath, u.Opaque, u.User = "http", policy.MeshHost, mr.target, "", "", nil
	pr.Out.Host = policy.MeshHost
	stripIdentity(pr.Out.Header) // again: the proxy's own additions, if any
	pr.Out.Trailer = nil         // nor may identity arrive as a trailer
	pr.Out.Header.Set(HeaderPrincipal, h.b.cfg.Principal)
	if mr.dest.Kind == policy.KindService {
		// <svc>.inference.sam.alt or <svc>.mcp.sam.alt: the node sees only
		// that service.
		pr.Out.Header.Set(HeaderService, mr.dest.Type+"://"+mr.dest.Service)
	}
}

func (h *meshHandler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	h.b.st.meshErrors.Add(1)
	h.b.m.meshRequest(meshError)
	h.b.log.Debug("boundary mesh request failed", "principal", h.b.cfg.Principal, "path", r.URL.Path, "err", err)
	if r.Context().Err() != nil {
		return // the agent went away
	}
	writeJSONError(w, http.StatusBadGateway, "mesh_unreachable", "the mesh could not be reached")
}

func (h *meshHandler) refuse(w http.ResponseWriter, status int, code, msg string) {
	h.b.st.meshRefused.Add(1)
	h.b.m.meshRequest(meshRefused)
	h.b.refusal()
	writeJSONError(w, status, code, msg)
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(errorBody(code, msg))
}
