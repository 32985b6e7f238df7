package meshnode

// Services that sandboxes serve (issue 17, item 6): a template names a
// model or an MCP server it serves on one of its ports (api.Serve), and
// the node's sandstormd tells this node where each of its sandboxes
// serves one — a URL on the node's gateway (PUT ServedPath). The node
// then serves those names as its own: publishes them to the mesh, lists
// them to the principals granted them, and sends calls to them through
// the gateway, which wakes the sandbox from any tier as a request to its
// port does. So an MCP server costs nothing while idle and still answers
// when called, from anywhere in the mesh.
//
// Such a server is called without a session kept open: a connection held
// to it would keep its sandbox awake, and a standalone SSE stream (GET)
// would hold a request open across the gateway's drain before a
// checkpoint. Each call is a session of its own (initialize, call,
// close) with no standalone stream; its tools are listed once when it
// first appears and then kept.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/policy"
)

// ServedPath, ServedService and ServedList are api's wire types.
const ServedPath = api.SAMServedPath

type (
	ServedService = api.SAMServed
	ServedList    = api.SAMServedList
)

const (
	maxServed      = 4096
	servedDialWait = 30 * time.Second // a wake from the snapshot tier is well under this
)

// served is what this machine's sandboxes serve now.
type served struct {
	mu      sync.Mutex
	models  map[string][]*provider // model → the sandboxes serving it, as providers
	servers map[string]*sbServer   // MCP server → the sandboxes serving it
}

// sbServer is an MCP server that sandboxes serve.
type sbServer struct {
	name  string
	urls  []string
	mu    sync.Mutex
	tools []*mcp.Tool // listed once; nil until then
}

func (s *sbServer) catalogue() []*mcp.Tool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tools
}

func (n *Node) servedModels(model string) []*provider {
	n.sv.mu.Lock()
	defer n.sv.mu.Unlock()
	return n.sv.models[model]
}

func (n *Node) servedServer(name string) *sbServer {
	n.sv.mu.Lock()
	defer n.sv.mu.Unlock()
	return n.sv.servers[name]
}

// servedNames are the models and MCP servers sandboxes serve here.
func (n *Node) servedNames() (models, servers []string) {
	n.sv.mu.Lock()
	defer n.sv.mu.Unlock()
	for m := range n.sv.models {
		models = append(models, m)
	}
	for s := range n.sv.servers {
		servers = append(servers, s)
	}
	sort.Strings(models)
	sort.Strings(servers)
	return models, servers
}

func validServed(s ServedService) error {
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("service %s://%s: url %q: want http://host:port/path on the node's gateway", s.Kind, s.Name, s.URL)
	}
	switch s.Kind {
	case "mcp":
		if !policy.ValidLabel(s.Name) {
			return fmt.Errorf("MCP server name %q: a DNS label", s.Name)
		}
	case "inference":
		if s.Name == "" || len(s.Name) > 128 {
			return fmt.Errorf("model name %q", s.Name)
		}
	default:
		return fmt.Errorf("kind %q: want mcp or inference", s.Kind)
	}
	return nil
}

// serveServed takes the set of sandbox-served services (PUT ServedPath).
// A name configured here already is not taken over by a sandbox.
func (n *Node) serveServed(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", "PUT")
		refuse(w, errdefs.ErrMethod, "method_not_allowed", "use PUT")
		return
	}
	var l ServedList
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		refuse(w, errdefs.ErrBadInput, "invalid_request", "want {\"services\": [{\"kind\", \"name\", \"url\"}]}: "+err.Error())
		return
	}
	if len(l.Services) > maxServed {
		refuse(w, errdefs.ErrTooLarge, "too_many", fmt.Sprintf("at most %d services", maxServed))
		return
	}
	models := map[string][]*provider{}
	servers := map[string]*sbServer{}
	for _, s := range l.Services {
		if err := validServed(s); err != nil {
			refuse(w, errdefs.ErrBadInput, "invalid_request", err.Error())
			return
		}
		switch s.Kind {
		case "inference":
			if len(n.byModel[s.Name]) > 0 {
				continue
			}
			models[s.Name] = append(models[s.Name], &provider{Provider: Provider{Name: "sandbox", URL: s.URL, Models: []string{s.Name}}})
		case "mcp":
			if n.hub.byName[s.Name] != nil {
				continue
			}
			sv := servers[s.Name]
			if sv == nil {
				sv = &sbServer{name: s.Name}
				servers[s.Name] = sv
			}
			sv.urls = append(sv.urls, s.URL)
		}
	}
	n.sv.mu.Lock()
	var list []*sbServer
	for name, sv := range servers {
		sort.Strings(sv.urls)
		// A server already known keeps the tools it listed.
		if old := n.sv.servers[name]; old != nil {
			sv.tools = old.catalogue()
		}
		if sv.catalogue() == nil {
			list = append(list, sv)
		}
	}
	changed := !sameServed(n.sv.models, models) || !sameServers(n.sv.servers, servers)
	n.sv.models, n.sv.servers = models, servers
	n.sv.mu.Unlock()
	for _, sv := range list {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.listServed(sv)
		}()
	}
	if changed {
		n.log.Info("meshnode: sandbox-served services", "models", len(models), "mcp_servers", len(servers))
		n.hub.gen.Add(1)
		n.hub.syncAll()
	}
	w.WriteHeader(http.StatusNoContent)
}

func sameServed(a, b map[string][]*provider) bool {
	if len(a) != len(b) {
		return false
	}
	for k, ps := range a {
		qs := b[k]
		if len(ps) != len(qs) {
			return false
		}
		for i := range ps {
			if ps[i].URL != qs[i].URL {
				return false
			}
		}
	}
	return true
}

func sameServers(a, b map[string]*sbServer) bool {
	if len(a) != len(b) {
		return false
	}
	for k, s := range a {
		if b[k] == nil || !slices.Equal(s.urls, b[k].urls) {
			return false
		}
	}
	return true
}

// listServed lists a sandbox-served server's tools once (this wakes its
// sandbox once), retrying with backoff while it is there and fails.
func (n *Node) listServed(sv *sbServer) {
	backoff := time.Second
	for n.ctx.Err() == nil {
		if n.servedServer(sv.name) != sv {
			return // replaced or gone
		}
		var tools []*mcp.Tool
		err := n.sbSession(n.ctx, sv, func(s *mcp.ClientSession) (err error) {
			tools, err = listTools(n.ctx, s)
			return err
		})
		if err == nil {
			sv.mu.Lock()
			sv.tools = tools
			sv.mu.Unlock()
			n.log.Info("meshnode: a sandbox-served MCP server's tools", "server", sv.name, "tools", len(tools))
			n.hub.gen.Add(1)
			n.hub.syncAll()
			return
		}
		n.log.Warn("meshnode: cannot list a sandbox-served MCP server's tools; retrying", "server", sv.name, "err", err, "in", backoff)
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// sbSession runs f on a session of its own with one of sv's sandboxes
// (the next one if a sandbox cannot be reached), closed after.
func (n *Node) sbSession(ctx context.Context, sv *sbServer, f func(*mcp.ClientSession) error) error {
	var last error
	for _, u := range sv.urls {
		dctx, cancel := context.WithTimeout(ctx, servedDialWait)
		c := mcp.NewClient(&mcp.Implementation{Name: "sam-node", Version: "0.1.0"}, nil)
		s, err := c.Connect(dctx, &mcp.StreamableClientTransport{Endpoint: u, HTTPClient: n.upstream, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
		cancel()
		if err != nil {
			last = err
			continue
		}
		err = f(s)
		s.Close()
		return err
	}
	return last
}

// callServed calls a tool of a sandbox-served server.
func (n *Node) callServed(ctx context.Context, sv *sbServer, tool string, args json.RawMessage) *mcp.CallToolResult {
	var res *mcp.CallToolResult
	err := n.sbSession(ctx, sv, func(s *mcp.ClientSession) (err error) {
		p := &mcp.CallToolParams{Name: tool}
		if len(args) > 0 {
			p.Arguments = args
		}
		res, err = s.CallTool(ctx, p)
		return err
	})
	if err != nil {
		n.m.toolCalls.WithLabelValues("", "upstream_error").Inc()
		return toolError(fmt.Sprintf("the sandbox serving MCP server %q failed the call to %q: %v", sv.name, tool, err))
	}
	outcome := "sandbox_ok"
	if res.IsError {
		outcome = "sandbox_tool_error"
	}
	n.m.toolCalls.WithLabelValues("", outcome).Inc()
	return res
}
