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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/fullduplex"
	"sandstorm/internal/sam/policy"
)

// The mesh entrypoint. A flow to mesh.sam.alt or <svc>.<type>.sam.alt is
// not spliced to the node: the boundary is the HTTP/1.1 server on it, and
// forwards only the agent-facing paths, with the agent's identity set by
// the boundary (who the sandbox is) and every identity or credential header
// the agent sent removed.

// firstConnMaxAge: a mesh connection opened at admission and not used
// within this long is not trusted to be open still (the node closes a
// connection that sends no request within its ReadHeaderTimeout, 10 s); a
// fresh one is dialled instead.
const firstConnMaxAge = 5 * time.Second

// Connections to the node are kept and reused across flows. A new
// connection to the node cost ≈ 110 µs of a new flow on this VM (sam-bench:
// baseline with a new connection per request 0.33 ms, reused 0.22 ms),
// besides the boundary's own dial at admission (≈ 55 µs,
// BenchmarkAdmission/cold); so a MeshPool keeps idle keep-alive
// connections, at most MaxIdle of them, each for MeshIdleTimeout. Every
// request on them carries the principal of the boundary that forwards it,
// set by that boundary (rewrite) — the node trusts the header, never the
// connection — so the boundaries of one process share one pool (sam-box's
// Set, sandstormd's node): what idle connections cost is the process's,
// bounded by MaxIdle, not a descriptor and two goroutines per agent.
const (
	// DefaultMeshIdle is a pool's MaxIdle when none is given.
	DefaultMeshIdle = 32
	// MeshIdleTimeout is how long an idle connection to the node is kept.
	MeshIdleTimeout = 15 * time.Second
)

var discardLog = log.New(io.Discard, "", 0)

// MeshPool is the connections to the local sam-node of every boundary that
// shares it. The zero value is not usable; see NewMeshPool.
type MeshPool struct {
	dial func(ctx context.Context) (net.Conn, error)
	tr   *http.Transport
	// live counts connections to the node open now: admission needs no
	// dial while one is (the node answered on it and has not closed it;
	// the transport notices a close on an idle connection at once).
	live atomic.Int64

	mu    sync.Mutex
	fresh []*nodeConn // dialled at admission, not yet used by the transport
}

// NewMeshPool returns a pool of connections opened with dial (a
// Config.Mesh), keeping at most maxIdle idle ones (0: DefaultMeshIdle).
// Close it when the boundaries sharing it are closed.
func NewMeshPool(dial func(ctx context.Context) (net.Conn, error), maxIdle int) *MeshPool {
	if maxIdle <= 0 {
		maxIdle = DefaultMeshIdle
	}
	p := &MeshPool{dial: dial}
	p.tr = &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return p.conn(ctx) },
		MaxIdleConns:        maxIdle,
		MaxIdleConnsPerHost: maxIdle,
		IdleConnTimeout:     MeshIdleTimeout,
		DisableCompression:  true,
	}
	return p
}

// Open is the number of connections to the node open now.
func (p *MeshPool) Open() int64 { return p.live.Load() }

// nodeConn is a connection to the node, counted in live until closed.
type nodeConn struct {
	net.Conn
	p      *MeshPool
	at     time.Time
	closed atomic.Bool
}

func (c *nodeConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.p.live.Add(-1)
	}
	return c.Conn.Close()
}

// open dials a new connection to the node.
func (p *MeshPool) open(ctx context.Context) (*nodeConn, error) {
	c, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	p.live.Add(1)
	return &nodeConn{Conn: c, p: p, at: time.Now()}, nil
}

// conn is the transport's dialer: a connection admission opened, if one is
// fresh, else a new one.
func (p *MeshPool) conn(ctx context.Context) (net.Conn, error) {
	p.mu.Lock()
	for len(p.fresh) > 0 {
		c := p.fresh[len(p.fresh)-1]
		p.fresh = p.fresh[:len(p.fresh)-1]
		if c.closed.Load() {
			continue
		}
		if time.Since(c.at) > firstConnMaxAge {
			c.Close()
			continue
		}
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	return p.open(ctx)
}

// offer hands the transport a connection opened at admission.
func (p *MeshPool) offer(c *nodeConn) {
	p.mu.Lock()
	p.fresh = append(p.fresh, c)
	p.mu.Unlock()
}

// withdraw closes c if the transport never took it (the flow sent no
// request).
func (p *MeshPool) withdraw(c *nodeConn) {
	p.mu.Lock()
	i := slices.Index(p.fresh, c)
	if i >= 0 {
		p.fresh = slices.Delete(p.fresh, i, i+1)
	}
	p.mu.Unlock()
	if i >= 0 {
		c.Close()
	}
}

// Close closes the idle connections; those in use close when their flow
// ends.
func (p *MeshPool) Close() {
	p.tr.CloseIdleConnections()
	p.mu.Lock()
	fresh := p.fresh
	p.fresh = nil
	p.mu.Unlock()
	for _, c := range fresh {
		c.Close()
	}
}

// newMeshProxy is a boundary's reverse proxy to the node, over pool.
func (b *Boundary) newMeshProxy(pool *MeshPool) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:   b.rewrite,
		Transport: pool.tr,
		// 0, not -1: httputil flushes server-sent events and bodies of no
		// known length at once by itself; -1 also flushed every answer's
		// header from a timer of its own, ahead of its body — two writes
		// and two wake-ups of the agent per response (strace of sam-box).
		FlushInterval: 0,
		ErrorHandler:  b.proxyError,
		ModifyResponse: func(resp *http.Response) error {
			if mr, ok := resp.Request.Context().Value(meshReqKey{}).(meshReq); ok {
				return mr.body.Respond(resp)
			}
			return nil
		},
		// What it logs itself is an answer cut while it was being passed
		// (the node's side read failing; the sandbox's side going away
		// cancels the read, which it does not log): the one trace of a
		// stream that ended before its end. Rate-limited like refusals:
		// a sandbox that resets mid-request can make the transport cut.
		ErrorLog: log.New(cutLog{b}, "", 0),
	}
}

// serveMesh serves HTTP on the sandbox's side of f. a.far, if admission
// opened one, is a new mesh connection for the first request; else the
// transport has one open already.
func (b *Boundary) serveMesh(f *flow, a *admission, prefix []byte) {
	mc := &meshConn{Conn: f.c, f: f, b: b, closed: make(chan struct{})}
	if len(prefix) > 0 {
		mc.r = io.MultiReader(bytes.NewReader(prefix), f.c)
	}
	if nc, ok := a.far.(*nodeConn); ok && f.dropFar(nc) {
		// From here the connection is the boundary's, for this flow's first
		// request and then any flow's: aborting this flow does not close it
		// (the request on it is cancelled with the flow's HTTP server).
		b.pool.offer(nc)
		defer b.pool.withdraw(nc)
	}
	srv := &http.Server{
		Handler:           &meshHandler{b: b, dest: a.dest},
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          discardLog,
	}
	srv.Serve(&oneConnListener{c: mc})
	mc.Close()
}

// meshConn is the sandbox's side as the HTTP server sees it. It has no
// CloseWrite, so the server never half-closes it (a FIN); Close resets it
// once the sandbox has every byte.
type meshConn struct {
	net.Conn
	r      io.Reader // bytes read before the server took over, then Conn
	f      *flow
	b      *Boundary
	once   sync.Once
	closed chan struct{}
}

func (c *meshConn) Read(p []byte) (int, error) {
	if c.r != nil {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

// subscription reports whether r asks for a stream of events rather than
// an answer: a GET that accepts text/event-stream, as an MCP client's
// standalone stream (MCP Streamable HTTP: the GET a client keeps open for
// the server's notifications) is. An agent waits on an answer, and is
// busy to its node meanwhile (activity.go); it does not wait on a
// subscription it keeps open for its whole session, which would keep it
// hot for ever — what comes on one touches and thaws it like any answer.
// A POST whose answer is streamed (a chat completion with "stream": true,
// an MCP call answered as events) is an answer.
func subscription(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// Write thaws the sandbox first if it was frozen while its answer was on
// its way (activity.go).
func (c *meshConn) Write(p []byte) (int, error) {
	return intoSandbox{c.b, c.Conn}.Write(p)
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

type meshHandler struct {
	b    *Boundary
	dest policy.Dest
}

type meshReqKey struct{}

// meshReq is what ServeHTTP decided for the proxy's Rewrite.
type meshReq struct {
	target string
	dest   policy.Dest
	body   *fullduplex.Body
}

// identityHeaders are removed from every request an agent sends to the
// mesh, besides every X-Sam-* and X-Forwarded-* header; each in its
// folded form (foldHeader).
var identityHeaders = map[string]bool{
	"authorization": true, "proxy-authorization": true, "cookie": true, "x-api-key": true,
	"api-key": true, "forwarded": true, "x-real-ip": true,
}

// foldHeader is a header name as a lenient upstream reads it: any case, '_'
// for '-' (CGI and WSGI map both to HTTP_X_SAM_PRINCIPAL; Go's canonical
// names keep them apart). Envoy drops them so: headers_with_underscores_action.
func foldHeader(k string) string {
	return strings.ToLower(strings.ReplaceAll(k, "_", "-"))
}

// stripIdentity removes identity and credential headers, under any
// spelling that folds to one; it reports whether there were any.
func stripIdentity(h http.Header) bool {
	found := false
	for k := range h {
		f := foldHeader(k)
		if strings.HasPrefix(f, "x-sam-") || strings.HasPrefix(f, "x-forwarded-") || identityHeaders[f] {
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
			h.refuse(w, r, http.StatusMethodNotAllowed, "method_not_allowed", "plain HTTP is served for mesh names only; use CONNECT")
			return
		}
		dest = d
	}
	if r.Method == http.MethodConnect {
		h.refuse(w, r, http.StatusMethodNotAllowed, "method_not_allowed", "CONNECT is not served on the mesh")
		return
	}
	// The policy in force decides every request: it may have changed since
	// the flow was admitted.
	if ok, _ := b.policy().Decide(b.cfg.Principal, dest); !ok {
		h.refuse(w, r, http.StatusForbidden, "destination_not_allowed", "destination not allowed for this sandbox")
		return
	}
	target, ok := "", false
	if r.URL.RawPath == "" && cleanPath(r.URL.Path) {
		target, ok = meshTarget(dest, r.URL.Path)
	}
	if !ok {
		h.refuse(w, r, http.StatusForbidden, "path_not_allowed", "path not available to agents: "+r.URL.Path)
		return
	}
	if stripIdentity(r.Header) {
		b.st.stripped.Add(1)
	}
	b.st.meshForwarded.Add(1)
	b.m.meshRequest(meshForwarded)
	if !subscription(r) {
		defer b.busy()()
	}
	// An answer may start before the request's body is read to its end
	// (an MCP server's event stream opens at once): at that first flush
	// an HTTP/1 server closes a body that is not full duplex, the
	// transport's last read of it (for its EOF) fails, and the transport
	// closes its connection to the node, cutting the answer (TestE2BMCP,
	// 1 run in ~40; internal/node/envdlink guards its proxy alike).
	body := fullduplex.Guard(w, r)
	defer body.Stop()
	b.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), meshReqKey{}, meshReq{target: target, dest: dest, body: body})))
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

func (b *Boundary) rewrite(pr *httputil.ProxyRequest) {
	mr, _ := pr.In.Context().Value(meshReqKey{}).(meshReq)
	out := pr.Out.URL
	out.Scheme, out.Host, out.Path, out.RawPath, out.Opaque, out.User = "http", policy.MeshHost, mr.target, "", "", nil
	pr.Out.Host = policy.MeshHost
	stripIdentity(pr.Out.Header) // again: the proxy's own additions, if any
	pr.Out.Trailer = nil         // nor may identity arrive as a trailer
	pr.Out.Header.Set(HeaderPrincipal, b.cfg.Principal)
	if mr.dest.Kind == policy.KindService {
		// <svc>.inference.sam.alt or <svc>.mcp.sam.alt: the node sees only
		// that service.
		pr.Out.Header.Set(HeaderService, mr.dest.Type+"://"+mr.dest.Service)
	}
}

// cutLog writes the proxy's own lines as the boundary's warnings, at
// most as often as its refusal lines.
type cutLog struct{ b *Boundary }

func (c cutLog) Write(p []byte) (int, error) {
	c.b.logRefusal.Do(func() {
		c.b.log.Warn(strings.TrimSpace(string(p)), "principal", c.b.cfg.Principal, "mesh_answer", "cut")
	})
	return len(p), nil
}

func (b *Boundary) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	b.st.meshErrors.Add(1)
	b.m.meshRequest(meshError)
	b.log.Debug("boundary mesh request failed", "principal", b.cfg.Principal, "path", r.URL.Path, "err", err)
	if r.Context().Err() != nil {
		return // the agent went away
	}
	writeJSONError(w, http.StatusBadGateway, "mesh_unreachable", "the mesh could not be reached")
}

func (h *meshHandler) refuse(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	h.b.st.meshRefused.Add(1)
	h.b.m.meshRequest(meshRefused)
	h.b.refusal()
	if h.b.cfg.Refusals != nil {
		host := r.URL.Host // absolute form: the host the agent named
		if host == "" {
			host = r.Host
		}
		reason, _, _ := strings.Cut(msg, ":") // the path is the target already
		h.b.refused(api.RefusedMeshRequest, r.Method+" "+host+r.URL.Path, reason)
	}
	writeJSONError(w, status, code, msg)
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(errorBody(code, msg))
}
