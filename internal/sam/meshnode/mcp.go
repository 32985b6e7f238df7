package meshnode

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/policy"
)

// The MCP side of the node.
//
// Each (principal, scope) pair — scope "" for /mcp, a server name for
// /mcp/<server> — has a view: an mcp.Server holding exactly the tools that
// principal is granted, each a proxy to its upstream session. A view is
// brought up to date with the policy in force and the upstream catalogues
// whenever it is used (and eagerly when the node's own policy watcher or an
// upstream reports a change, so that connected clients get
// notifications/tools/list_changed). Sessions are bound to the view that
// created them: a session ID carries a MAC of principal and scope, so one
// agent's session cannot be used by another, or on another endpoint.

const (
	mcpSessionTimeout = time.Hour
	mcpDialTimeout    = 30 * time.Second
	maxBackoff        = 30 * time.Second
	// viewIdleTimeout: a view no session is bound to and no new session
	// asked for within this long is dropped when another view is made
	// (sam-bench principals: a view kept 17–29 KiB of heap for every
	// principal ever seen, sessions closed or not). Dropping only views
	// without sessions loses nothing: a view is remade, synced from the
	// policy in force, on the principal's next session, as on its first;
	// and a view that has one is still synced and notified (syncAll).
	viewIdleTimeout = 10 * time.Minute
)

type mcpHub struct {
	n       *Node
	order   []*upstream // config order
	byName  map[string]*upstream
	gen     atomic.Uint64 // bumped whenever an upstream catalogue changes
	key     []byte        // session-ID MAC key
	handler *mcp.StreamableHTTPHandler

	mu       sync.Mutex
	views    map[viewKey]*view
	viewIdle time.Duration // viewIdleTimeout; tests shorten it
	swept    time.Time     // the last sweep of idle views
}

type viewKey struct{ principal, scope string }

type viewCtxKey struct{}

func newHub(n *Node, servers []MCPServer) *mcpHub {
	h := &mcpHub{n: n, byName: map[string]*upstream{}, views: map[viewKey]*view{}, key: make([]byte, 32), viewIdle: viewIdleTimeout}
	if _, err := rand.Read(h.key); err != nil {
		panic(err)
	}
	for _, s := range servers {
		u := &upstream{hub: h, cfg: s, refresh: make(chan struct{}, 1)}
		h.order = append(h.order, u)
		h.byName[s.Name] = u
		n.m.mcpConnected.WithLabelValues(s.Name).Set(0)
		n.m.toolCalls.WithLabelValues(s.Name, "ok")
	}
	h.handler = mcp.NewStreamableHTTPHandler(h.getServer, &mcp.StreamableHTTPOptions{
		// Only boundaries connect, over a Unix socket or loopback, and they
		// send Host: mesh.sam.alt; DNS rebinding is a browser's problem.
		DisableLocalhostProtection: true,
		SessionTimeout:             mcpSessionTimeout,
		MaxRequestBodyBytes:        n.maxBody,
		Logger:                     n.log.With("component", "mcp"),
	})
	return h
}

func (h *mcpHub) start() {
	for _, u := range h.order {
		h.n.wg.Add(1)
		go func() {
			defer h.n.wg.Done()
			u.run(h.n.ctx)
		}()
	}
}

func (h *mcpHub) close() {
	for _, u := range h.order {
		u.closeSession()
	}
}

func (h *mcpHub) notConnected() []string {
	var down []string
	for _, u := range h.order {
		if !u.connected.Load() {
			down = append(down, u.cfg.Name)
		}
	}
	return down
}

// serve handles /mcp and /mcp/<server> for principal.
func (h *mcpHub) serve(w http.ResponseWriter, r *http.Request, principal string, svc service, scope string) {
	switch {
	case svc.kind == "inference":
		h.n.refused(r, principal, api.RefusedMCPServer, cmp.Or(scope, "/mcp"), "asked of the endpoint of model "+svc.name)
		refuse(w, errdefs.ErrForbidden, "wrong_service",
			fmt.Sprintf("this endpoint is the model %q; it serves no MCP tools", svc.name))
		return
	case svc.kind == "mcp" && scope != "" && scope != svc.name:
		h.n.refused(r, principal, api.RefusedMCPServer, scope, "asked of the endpoint of MCP server "+svc.name)
		refuse(w, errdefs.ErrForbidden, "wrong_service",
			fmt.Sprintf("this endpoint is the MCP server %q, not %q", svc.name, scope))
		return
	case svc.kind == "mcp":
		scope = svc.name
	}
	if scope != "" {
		// Refuse a server that is not granted before looking it up, so that
		// the answer is the same whether or not it exists.
		if !h.n.policy.Current().For(principal).MCPServer(scope) {
			h.n.refused(r, principal, api.RefusedMCPServer, scope, whyNotGranted)
			refuse(w, errdefs.ErrForbidden, "server_not_granted",
				fmt.Sprintf("MCP server %q is not granted to principal %q", scope, principal))
			return
		}
		if h.byName[scope] == nil && h.n.servedServer(scope) == nil && (h.n.remote == nil || !h.n.remote.hasServer(scope)) {
			if h.n.remote != nil && h.n.remote.recently("mcp://"+scope) {
				writeUnavailable(w, "server_unavailable",
					fmt.Sprintf("MCP server %q is granted to principal %q, but no member of the mesh serves it right now", scope, principal))
				return
			}
			refuse(w, errdefs.ErrNotFound, "server_not_found",
				fmt.Sprintf("no MCP server %q on this mesh node", scope))
			return
		}
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" && !h.validSession(sid, principal, scope) {
		// What the SDK answers for a session it does not know: the client
		// starts a new one.
		// MCP's Streamable HTTP transport: a 404 tells the client to
		// start a new session.
		refuse(w, errdefs.ErrNotFound, "session_not_found", "session not found: initialize a new one")
		return
	}
	ctx := context.WithValue(r.Context(), viewCtxKey{}, viewKey{principal, scope})
	if r.Method == http.MethodGet {
		// A standalone notification stream lasts as long as the client
		// wants; Drain ends it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(h.n.streams, cancel)
		defer stop()
	}
	h.handler.ServeHTTP(w, r.WithContext(ctx))
}

func (h *mcpHub) sessionTag(principal, scope string) string {
	m := hmac.New(sha256.New, h.key)
	io.WriteString(m, principal)
	m.Write([]byte{0})
	io.WriteString(m, scope)
	return hex.EncodeToString(m.Sum(nil)[:16])
}

func (h *mcpHub) newSessionID(principal, scope string) string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b) + "." + h.sessionTag(principal, scope)
}

func (h *mcpHub) validSession(sid, principal, scope string) bool {
	i := strings.LastIndexByte(sid, '.')
	if i < 0 {
		return false
	}
	return hmac.Equal([]byte(sid[i+1:]), []byte(h.sessionTag(principal, scope)))
}

// getServer is the SDK's hook: the view of the request's principal and
// scope, brought up to date.
func (h *mcpHub) getServer(r *http.Request) *mcp.Server {
	k, ok := r.Context().Value(viewCtxKey{}).(viewKey)
	if !ok {
		return nil
	}
	if h.n.remote != nil {
		h.n.remote.wait(r.Context())
	}
	v := h.view(k)
	v.sync()
	return v.server
}

func (h *mcpHub) view(k viewKey) *view {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if v := h.views[k]; v != nil {
		v.used = now
		return v
	}
	h.sweepLocked(now)
	v := &view{hub: h, key: k, tools: map[string]*exposed{}, used: now}
	instructions := "Tools of the mesh: each is named <server>__<tool>."
	if k.scope != "" {
		instructions = fmt.Sprintf("Tools of the MCP server %q, by their own names.", k.scope)
	}
	v.server = mcp.NewServer(&mcp.Implementation{Name: "sam-node", Version: "0.1.0"}, &mcp.ServerOptions{
		Instructions: instructions,
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
		GetSessionID: func() string { return h.newSessionID(k.principal, k.scope) },
	})
	v.server.AddReceivingMiddleware(v.refuseUngranted)
	h.views[k] = v
	return v
}

// sweepLocked drops the views that no session is bound to and that no new
// session asked for within viewIdle, at most once per viewIdle/10. A view
// marked used by getServer has its session registered by the SDK at once,
// far within viewIdle, so a view is never dropped under a session being
// made. h.mu is held.
func (h *mcpHub) sweepLocked(now time.Time) {
	if now.Sub(h.swept) < h.viewIdle/10 {
		return
	}
	h.swept = now
	for k, v := range h.views {
		if now.Sub(v.used) < h.viewIdle {
			continue
		}
		bound := false
		for range v.server.Sessions() {
			bound = true
			break
		}
		if !bound {
			delete(h.views, k)
		}
	}
}

// syncAll brings every view up to date now, so that connected clients are
// told when their catalogue changed.
func (h *mcpHub) syncAll() {
	h.mu.Lock()
	vs := make([]*view, 0, len(h.views))
	for _, v := range h.views {
		vs = append(vs, v)
	}
	h.mu.Unlock()
	for _, v := range vs {
		v.sync()
	}
}

// view is what one principal sees on one MCP endpoint.
type view struct {
	hub    *mcpHub
	key    viewKey
	server *mcp.Server
	used   time.Time // the last getServer for it; under hub.mu

	mu    sync.Mutex
	pol   *policy.Policy
	gen   uint64
	init  bool
	tools map[string]*exposed // by exposed name
}

// exposed is one upstream tool as a view shows it.
type exposed struct {
	up     *upstream // nil: a server another member of the mesh serves
	server string
	tool   *mcp.Tool // the upstream's definition (upstream name)
}

func (v *view) sync() {
	h := v.hub
	pol := h.n.policy.Current()
	gen := h.gen.Load()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.init && v.pol == pol && v.gen == gen {
		return
	}
	g := pol.For(v.key.principal)
	want := map[string]*exposed{}
	// add exposes what g grants of server's tools, in this view's names.
	// The first source of a server wins: configured here, then served by
	// this machine's sandboxes, then served elsewhere in the mesh.
	add := func(server string, up *upstream, tools []*mcp.Tool) {
		if (v.key.scope != "" && server != v.key.scope) || !g.MCPServer(server) {
			return
		}
		for _, t := range tools {
			if !g.MCPTool(server, t.Name) {
				continue
			}
			name := t.Name
			if v.key.scope == "" {
				name = server + ToolSeparator + t.Name
			}
			if want[name] == nil {
				want[name] = &exposed{up: up, server: server, tool: t}
			}
		}
	}
	for _, u := range h.order {
		add(u.cfg.Name, u, u.catalogue())
	}
	_, served := h.n.servedNames()
	for _, server := range served {
		if sv := h.n.servedServer(server); sv != nil {
			add(server, nil, sv.catalogue())
		}
	}
	if h.n.remote != nil {
		_, servers := h.n.remote.snapshot()
		for _, server := range sortedKeys(servers) {
			add(server, nil, servers[server])
		}
	}
	var gone []string
	for name := range v.tools {
		if want[name] == nil {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		v.server.RemoveTools(gone...)
	}
	for name, e := range want {
		if old := v.tools[name]; old != nil && old.tool == e.tool && old.server == e.server {
			continue
		}
		if err := v.add(name, e); err != nil {
			h.n.log.Warn("meshnode: upstream tool not served", "server", e.server, "tool", e.tool.Name, "err", err)
			delete(want, name)
		}
	}
	v.tools, v.pol, v.gen, v.init = want, pol, gen, true
}

// add registers the proxy of e under name. AddTool panics on a tool it
// cannot serve (a schema that is not an object); such a tool from an
// upstream is skipped, not fatal.
func (v *view) add(name string, e *exposed) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	t := *e.tool
	t.Name = name
	if t.InputSchema == nil {
		t.InputSchema = map[string]any{"type": "object"}
	}
	principal, server, tool := v.key.principal, e.server, e.tool.Name
	v.server.AddTool(&t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return v.hub.call(ctx, principal, server, tool, name, req.Params.Arguments), nil
	})
	return nil
}

// refuseUngranted answers a tools/call of a tool the view does not hold
// with a tool error the agent's model can read, rather than the protocol
// error ("unknown tool") the SDK would give.
func (v *view) refuseUngranted(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		ctr, ok := req.(*mcp.CallToolRequest)
		if !ok || ctr.Params == nil {
			return next(ctx, method, req)
		}
		v.sync()
		v.mu.Lock()
		e := v.tools[ctr.Params.Name]
		v.mu.Unlock()
		if e == nil {
			server, tool := v.key.scope, ctr.Params.Name
			if server == "" {
				server, tool, _ = strings.Cut(ctr.Params.Name, ToolSeparator)
			}
			if res := v.hub.awayTool(v.key.principal, server, tool); res != nil {
				return res, nil
			}
			if v.hub.byName[server] == nil {
				server = ""
			}
			v.hub.n.m.toolCalls.WithLabelValues(server, "denied").Inc()
			v.hub.n.log.Debug("meshnode: tool call refused", "principal", v.key.principal, "server", server)
			target := ctr.Params.Name
			if v.key.scope != "" {
				target = v.key.scope + ToolSeparator + target
			}
			v.hub.n.refused(nil, v.key.principal, api.RefusedTool, target, whyNotGranted)
			return denied(ctr.Params.Name, v.key.principal), nil
		}
		return next(ctx, method, req)
	}
}

// awayTool answers a call of a tool the principal is granted on a server
// that the mesh listed lately and no member serves now (issue 29: such a
// call was refused as "not granted", which sends the operator to the
// policy): a tool error saying so and when to try again. nil: not that
// case.
func (h *mcpHub) awayTool(principal, server, tool string) *mcp.CallToolResult {
	if h.n.remote == nil || !h.n.policy.Current().For(principal).MCPTool(server, tool) ||
		h.byName[server] != nil || h.n.servedServer(server) != nil || h.n.remote.hasServer(server) ||
		!h.n.remote.recently("mcp://"+server) {
		return nil
	}
	h.n.m.toolCalls.WithLabelValues("", "unavailable").Inc()
	return toolError(fmt.Sprintf("tool %q of MCP server %q is granted to principal %q, but no member of the mesh serves %q right now; %s",
		tool, server, principal, server, unavailableRetry()))
}

func denied(name, principal string) *mcp.CallToolResult {
	return toolError(fmt.Sprintf("tool %q is not granted to principal %q; tools/list shows the tools you may call", name, principal))
}

func toolError(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// call proxies one tool call to its upstream, deciding on the policy in
// force at the moment of the call.
func (h *mcpHub) call(ctx context.Context, principal, server, tool, exposedName string, args json.RawMessage) *mcp.CallToolResult {
	if !h.n.policy.Current().For(principal).MCPTool(server, tool) {
		h.n.m.toolCalls.WithLabelValues(server, "denied").Inc()
		h.n.refused(nil, principal, api.RefusedTool, server+ToolSeparator+tool, whyNotGranted)
		return denied(exposedName, principal)
	}
	u := h.byName[server]
	if u == nil {
		if sv := h.n.servedServer(server); sv != nil {
			return h.n.callServed(ctx, sv, tool, args)
		}
		if h.n.remote == nil {
			return toolError(fmt.Sprintf("no MCP server %q on this mesh node", server))
		}
		return h.n.callRemoteTool(ctx, principal, server, tool, args)
	}
	sess := u.session()
	if sess == nil {
		h.n.m.toolCalls.WithLabelValues(server, "unavailable").Inc()
		return toolError(fmt.Sprintf("MCP server %q is not connected right now; try again shortly", server))
	}
	params := &mcp.CallToolParams{Name: tool}
	if len(args) > 0 {
		params.Arguments = args
	}
	res, err := sess.CallTool(ctx, params)
	if err != nil {
		if ctx.Err() != nil {
			h.n.m.toolCalls.WithLabelValues(server, "canceled").Inc()
			return toolError("the call was cancelled")
		}
		h.n.m.toolCalls.WithLabelValues(server, "upstream_error").Inc()
		h.n.log.Warn("meshnode: upstream tool call failed", "server", server, "tool", tool, "err", err)
		if errors.Is(err, mcp.ErrConnectionClosed) {
			u.kick()
		}
		return toolError(fmt.Sprintf("MCP server %q failed the call to %q: %v", server, tool, err))
	}
	outcome := "ok"
	if res.IsError {
		outcome = "tool_error"
	}
	h.n.m.toolCalls.WithLabelValues(server, outcome).Inc()
	return res
}

// upstream is one configured MCP server and the node's session with it.
type upstream struct {
	hub       *mcpHub
	cfg       MCPServer
	connected atomic.Bool
	refresh   chan struct{}

	mu    sync.Mutex
	sess  *mcp.ClientSession
	tools []*mcp.Tool
}

func (u *upstream) session() *mcp.ClientSession {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sess
}

// catalogue is the upstream's tools as last listed, sorted by name. It is
// kept while the upstream is re-dialled, so agents' catalogues do not
// flicker; calls meanwhile get a readable "not connected" error.
func (u *upstream) catalogue() []*mcp.Tool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.tools
}

func (u *upstream) closeSession() {
	u.mu.Lock()
	s := u.sess
	u.sess = nil
	u.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// kick closes a session that failed, so that run dials a new one.
func (u *upstream) kick() { u.closeSession() }

func (u *upstream) log() *slog.Logger { return u.hub.n.log.With("mcp_server", u.cfg.Name) }

// run keeps a session with the upstream until ctx ends: dial, list the
// tools, wait for the session to end (re-listing on
// notifications/tools/list_changed), and dial again with backoff.
func (u *upstream) run(ctx context.Context) {
	m := u.hub.n.m
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		sess, err := u.dial(ctx)
		if err == nil {
			var tools []*mcp.Tool
			if tools, err = listTools(ctx, sess); err == nil {
				u.mu.Lock()
				u.sess, u.tools = sess, tools
				u.mu.Unlock()
			} else {
				sess.Close()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			m.mcpRedials.WithLabelValues(u.cfg.Name, "error").Inc()
			u.log().Warn("meshnode: cannot reach MCP server; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, maxBackoff)
			continue
		}
		m.mcpRedials.WithLabelValues(u.cfg.Name, "ok").Inc()
		backoff = 250 * time.Millisecond
		u.connected.Store(true)
		m.mcpConnected.WithLabelValues(u.cfg.Name).Set(1)
		u.log().Info("meshnode: MCP server connected", "tools", len(u.tools))
		u.hub.gen.Add(1)
		u.hub.syncAll()

		done := make(chan struct{})
		go func() { sess.Wait(); close(done) }()
	wait:
		for {
			select {
			case <-ctx.Done():
				u.closeSession()
				<-done
				u.connected.Store(false)
				return
			case <-done:
				break wait
			case <-u.refresh:
				tools, err := listTools(ctx, sess)
				if err != nil {
					u.log().Warn("meshnode: re-listing tools failed", "err", err)
					continue
				}
				u.mu.Lock()
				u.tools = tools
				u.mu.Unlock()
				u.log().Info("meshnode: MCP server's tools changed", "tools", len(tools))
				u.hub.gen.Add(1)
				u.hub.syncAll()
			}
		}
		u.connected.Store(false)
		m.mcpConnected.WithLabelValues(u.cfg.Name).Set(0)
		u.mu.Lock()
		if u.sess == sess {
			u.sess = nil
		}
		u.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		u.log().Warn("meshnode: MCP server session ended; re-dialling")
	}
}

func (u *upstream) dial(ctx context.Context) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "sam-node", Version: "0.1.0"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case u.refresh <- struct{}{}:
			default:
			}
		},
	})
	var t mcp.Transport
	if len(u.cfg.Command) > 0 {
		cmd := exec.Command(u.cfg.Command[0], u.cfg.Command[1:]...)
		cmd.Env = append(os.Environ(), u.cfg.Env...)
		cmd.Stderr = &lineLogger{log: u.log()}
		// The server dies with the node, however the node dies.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		t = &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	} else {
		t = &mcp.StreamableClientTransport{Endpoint: u.cfg.URL, HTTPClient: u.hub.n.upstream}
	}
	dctx, cancel := context.WithTimeout(ctx, mcpDialTimeout)
	defer cancel()
	return client.Connect(dctx, t, nil)
}

func listTools(ctx context.Context, s *mcp.ClientSession) ([]*mcp.Tool, error) {
	lctx, cancel := context.WithTimeout(ctx, mcpDialTimeout)
	defer cancel()
	var out []*mcp.Tool
	for t, err := range s.Tools(lctx, nil) {
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// lineLogger turns a stdio server's stderr into log lines.
type lineLogger struct {
	log *slog.Logger
	buf []byte
	mu  sync.Mutex
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			break
		}
		l.emit(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 4096 {
		l.emit(l.buf)
		l.buf = nil
	}
	return len(p), nil
}

func (l *lineLogger) emit(line []byte) {
	s := strings.TrimRight(string(line), "\r")
	if s != "" {
		l.log.Info("mcp server stderr", "line", s)
	}
}
