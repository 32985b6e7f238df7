package meshnode

// The rest of the mesh (issue 17, item 3): models and MCP servers that
// other members serve, used by this node's agents by name, with the
// policy decided here on the agent's principal and again on the member
// that serves the call.
//
// Two directions:
//
//   - out: a model or MCP server this node does not serve itself is
//     looked up in the mesh (Mesh.Providers: the DHT, through the
//     discovery cache) and the call sent to a member that serves it,
//     naming the principal in X-Sam-Principal;
//   - in: MeshHandler answers other members' calls with this node's own
//     providers and servers only — never forwarded again, so a call
//     cannot loop or be amplified across the mesh — after deciding on
//     the principal it names, with this node's copy of the policy.
//
// What an agent may use anywhere in the mesh (/v1/models, tools/list) is
// the union of the catalogues that the members serving CatalogName
// publish (GET /v1/catalog on their mesh handler), refreshed every
// catalogInterval, filtered by the principal's grants here.
//
// Trust: a member speaks for the principals of its own sandboxes (a
// principal is not a peer: seed 000, "A thousand agents on one host").
// The member that serves a call cannot check that the agent is who the
// caller says; it checks that the caller is a member now (its credential,
// on every stream: internal/sam/meshpeer) and that the principal named is
// granted what it asks by the mesh's one policy.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/policy"
)

// Mesh is the rest of the mesh as this node reaches it. internal/sam/meshpeer
// is the real one (libp2p streams, both ends checked members); tests use
// one in memory over loopback HTTP servers.
type Mesh interface {
	// Providers are the members (by ID) other than this one that serve
	// name: "inference://<model>", "mcp://<server>" or CatalogName.
	Providers(ctx context.Context, name string) ([]string, error)
	// Do sends req to member's MeshHandler; req.URL.Path is the
	// handler's own path (/v1/...). The request's context bounds it. An
	// error that wraps ErrNotSent means no whole request reached the
	// member (none left, or it was cut off as it was written): only then
	// may the call go to another member without running twice.
	Do(member string, req *http.Request) (*http.Response, error)
}

// ErrNotSent marks a mesh call that never reached the member whole (no
// connection, its credential refused before the request was written, or
// the request cut off as it was written: the member's handlers read a
// request's whole body before they act on it).
var ErrNotSent = errors.New("the call was not sent")

// HeaderMember names the member a mesh call came from. The mesh's
// transport sets it from the caller's checked credential (whatever the
// caller sent is replaced); MeshHandler refuses a request without it.
const HeaderMember = "X-Sam-Member"

// CatalogName is the name every member that serves anything publishes,
// so that the members with a catalogue can be found.
const CatalogName = "catalog"

const (
	// catalogInterval is how often the rest of the mesh's catalogue is
	// read again. The lookup under it is cached (internal/sam/discovery: 30 s,
	// refreshed from 20 s), so a member that joins shows within about
	// half a minute; one that leaves stays listed as long, and a call to
	// it fails over to the next provider.
	catalogInterval = 5 * time.Second
	// meshCallTimeout bounds a catalogue read or the connection of a call
	// to one member (the call itself is bounded by its agent).
	meshCallTimeout = 10 * time.Second
	// firstCatalogWait is how long a request that arrives before the
	// first catalogue is in waits for it.
	firstCatalogWait = 5 * time.Second
	maxCatalogBytes  = 4 << 20
)

// catalogue is what one member serves, as GET /v1/catalog answers.
type catalogue struct {
	Member  string                 `json:"member,omitempty"`
	Models  []string               `json:"models"`
	Servers map[string][]*mcp.Tool `json:"mcp_servers"`
}

// Names is what this node serves to the mesh, as it publishes them:
// each model, each MCP server, and CatalogName if any.
func (n *Node) Names() []string {
	var out []string
	for _, m := range n.models {
		out = append(out, "inference://"+m)
	}
	for _, u := range n.hub.order {
		out = append(out, "mcp://"+u.cfg.Name)
	}
	models, servers := n.servedNames()
	for _, m := range models {
		out = append(out, "inference://"+m)
	}
	for _, s := range servers {
		out = append(out, "mcp://"+s)
	}
	if len(out) > 0 {
		out = append(out, CatalogName)
	}
	return out
}

// remote is what this node knows of the rest of the mesh's catalogue.
type remote struct {
	n    *Node
	mesh Mesh

	mu      sync.Mutex
	models  map[string]string      // model → the first member listing it
	servers map[string][]*mcp.Tool // server → its tools, from the first member listing it
	seen    string                 // the last merged catalogue, encoded: a change bumps the hub's generation
	// listed is when each mesh name ("inference://m", "mcp://s") was last
	// in a member's catalogue: a granted name listed within recentlyListed
	// and not now is one whose providers are away ("try again"), not one
	// that does not exist.
	listed map[string]time.Time

	loaded     chan struct{}
	loadedOnce sync.Once
}

func newRemote(n *Node, m Mesh) *remote {
	return &remote{n: n, mesh: m, models: map[string]string{}, servers: map[string][]*mcp.Tool{}, listed: map[string]time.Time{},
		loaded: make(chan struct{})}
}

// recentlyListed is how long a name that left every catalogue is taken
// for away rather than gone.
const recentlyListed = 10 * time.Minute

// recently reports whether name ("inference://m", "mcp://s") was in the
// mesh's catalogue within recentlyListed (or is now).
func (r *remote) recently(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.listed[name]
	return ok && time.Since(at) < recentlyListed
}

// run reads the catalogue now and every catalogInterval until ctx ends.
func (r *remote) run(ctx context.Context) {
	t := time.NewTicker(catalogInterval)
	defer t.Stop()
	for {
		r.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *remote) refresh(ctx context.Context) {
	defer r.loadedOnce.Do(func() { close(r.loaded) })
	lctx, cancel := context.WithTimeout(ctx, meshCallTimeout)
	defer cancel()
	ids, err := r.mesh.Providers(lctx, CatalogName)
	if err != nil {
		// Keep what was known: a DHT that cannot be asked now says
		// nothing about what the members serve.
		r.n.log.Warn("meshnode: cannot look up the mesh's catalogues; keeping the last", "err", err)
		return
	}
	sort.Strings(ids) // the same first member for a name on every read
	models := map[string]string{}
	servers := map[string][]*mcp.Tool{}
	for _, id := range ids {
		c, err := r.read(lctx, id)
		if err != nil {
			r.n.log.Debug("meshnode: a member's catalogue could not be read", "member", id, "err", err)
			continue
		}
		who := c.Member
		if who == "" {
			who = id
		}
		for _, m := range c.Models {
			if _, ok := models[m]; !ok && validModelName(m) && len(r.n.localProviders(m)) == 0 {
				models[m] = who
			}
		}
		for s, tools := range c.Servers {
			if _, ok := servers[s]; !ok && r.n.hub.byName[s] == nil && r.n.servedServer(s) == nil && policy.ValidLabel(s) {
				sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
				servers[s] = tools
			}
		}
	}
	enc, _ := json.Marshal(catalogue{Models: sortedKeys(models), Servers: servers})
	now := time.Now()
	r.mu.Lock()
	for m := range models {
		r.listed["inference://"+m] = now
	}
	for s := range servers {
		r.listed["mcp://"+s] = now
	}
	for k, at := range r.listed {
		if now.Sub(at) > recentlyListed {
			delete(r.listed, k)
		}
	}
	changed := string(enc) != r.seen
	if changed {
		r.models, r.servers, r.seen = models, servers, string(enc)
	}
	r.mu.Unlock()
	if changed {
		r.n.hub.gen.Add(1)
		r.n.hub.syncAll()
	}
}

func (r *remote) read(ctx context.Context, id string) (catalogue, error) {
	var c catalogue
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+id+"/v1/catalog", nil)
	if err != nil {
		return c, err
	}
	resp, err := r.mesh.Do(id, req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("catalogue: %s", resp.Status)
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, maxCatalogBytes)).Decode(&c)
	return c, err
}

// wait waits (bounded) for the first catalogue.
func (r *remote) wait(ctx context.Context) {
	t := time.NewTimer(firstCatalogWait)
	defer t.Stop()
	select {
	case <-r.loaded:
	case <-ctx.Done():
	case <-t.C:
	}
}

// snapshot is the rest of the mesh's models and servers now.
func (r *remote) snapshot() (map[string]string, map[string][]*mcp.Tool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.models, r.servers
}

func (r *remote) hasServer(s string) bool {
	_, servers := r.snapshot()
	_, ok := servers[s]
	return ok
}

// validModelName: a name another member lists is shown to agents and
// used as a key; one that is empty, huge or has control characters or
// spaces in it is not taken.
func validModelName(m string) bool {
	if m == "" || len(m) > 128 {
		return false
	}
	for _, c := range m {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type fromMeshKey struct{}

// fromMesh reports whether r is another member's call, which is served
// with this node's own providers and servers only.
func fromMesh(r *http.Request) bool { return r.Context().Value(fromMeshKey{}) != nil }

// MeshHandler answers other members' calls: GET /v1/catalog, POST
// /v1/chat/completions and /v1/completions, POST /v1/tools/call. Serve it
// only on the mesh's transport, which sets HeaderMember from the caller's
// checked credential.
func (n *Node) MeshHandler() http.Handler { return http.HandlerFunc(n.serveMesh) }

// toolCall is the body of POST /v1/tools/call.
type toolCall struct {
	Server    string          `json:"server"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

func (n *Node) serveMesh(w http.ResponseWriter, r *http.Request) {
	member := r.Header.Get(HeaderMember)
	if member == "" {
		refuse(w, errdefs.ErrForbidden, "not_a_member", "mesh calls are answered for members only")
		return
	}
	if r.URL.Path == "/v1/catalog" {
		if r.Method != http.MethodGet {
			refuse(w, errdefs.ErrMethod, "method_not_allowed", "use GET")
			return
		}
		models, servers := n.servedNames()
		c := catalogue{Member: n.member, Models: append(slices.Clone(n.models), models...), Servers: map[string][]*mcp.Tool{}}
		for _, u := range n.hub.order {
			if tools := u.catalogue(); tools != nil {
				c.Servers[u.cfg.Name] = tools
			}
		}
		for _, name := range servers {
			if sv := n.servedServer(name); sv != nil && sv.catalogue() != nil {
				c.Servers[name] = sv.catalogue()
			}
		}
		writeJSON(w, http.StatusOK, c)
		return
	}
	principal := r.Header.Get(HeaderPrincipal)
	if !validPrincipal(principal) {
		refuse(w, errdefs.ErrForbidden, "no_principal", "a mesh call must name the principal it is made for in "+HeaderPrincipal)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), fromMeshKey{}, member))
	n.log.Debug("meshnode: mesh call", "member", member, "principal", principal, "path", r.URL.Path)
	switch r.URL.Path {
	case "/v1/chat/completions":
		n.serveInference(w, r, principal, service{}, "/chat/completions")
	case "/v1/completions":
		n.serveInference(w, r, principal, service{}, "/completions")
	case "/v1/tools/call":
		if r.Method != http.MethodPost {
			refuse(w, errdefs.ErrMethod, "method_not_allowed", "use POST")
			return
		}
		var c toolCall
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, n.maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil || c.Server == "" || c.Tool == "" {
			refuse(w, errdefs.ErrBadInput, "invalid_request", "want {\"server\", \"tool\", \"arguments\"}")
			return
		}
		// Decided here again, on this node's policy, before the server
		// is looked up (the same answer whether or not it exists).
		if !n.policy.Current().For(principal).MCPTool(c.Server, c.Tool) {
			label := "" // a name a caller sent is a label only if it is configured here
			if n.hub.byName[c.Server] != nil {
				label = c.Server
			}
			n.m.toolCalls.WithLabelValues(label, "denied").Inc()
			n.log.Info("meshnode: mesh tool call refused", "member", member, "principal", principal, "server", c.Server, "tool", c.Tool)
			n.refused(r, principal, api.RefusedTool, c.Server+ToolSeparator+c.Tool, "not granted by this member's policy")
			writeJSON(w, http.StatusOK, denied(c.Server+ToolSeparator+c.Tool, principal))
			return
		}
		if n.hub.byName[c.Server] == nil && n.servedServer(c.Server) == nil {
			refuse(w, errdefs.ErrNotFound, "server_not_found", fmt.Sprintf("no MCP server %q on this member", c.Server))
			return
		}
		writeJSON(w, http.StatusOK, n.hub.call(r.Context(), principal, c.Server, c.Tool, c.Server+ToolSeparator+c.Tool, c.Arguments))
	default:
		refuse(w, errdefs.ErrNotFound, "not_found", fmt.Sprintf("no such mesh endpoint %q", r.URL.Path))
	}
}

// meshTarget is one member to try for a model.
func (n *Node) meshTargets(ctx context.Context, name string) ([]string, error) {
	lctx, cancel := context.WithTimeout(ctx, meshCallTimeout)
	defer cancel()
	return n.remote.mesh.Providers(lctx, name)
}

// meshAttempt sends an inference request to one member for principal.
func (n *Node) meshAttempt(ctx context.Context, member, principal, path string, body []byte, in http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+member+"/v1"+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if a := in.Get("Accept"); a != "" {
		req.Header.Set("Accept", a)
	}
	req.Header.Set(HeaderPrincipal, principal)
	return n.remote.mesh.Do(member, req)
}

// callRemoteTool sends a tool call to a member that serves server, the
// next one on a connection error or a 5xx. Its outcomes are counted under
// server="" with a "mesh_" prefix: a server name another member
// publishes never becomes a label (metrics.go).
func (n *Node) callRemoteTool(ctx context.Context, principal, server, tool string, args json.RawMessage) *mcp.CallToolResult {
	ids, err := n.meshTargets(ctx, "mcp://"+server)
	if err != nil || len(ids) == 0 {
		n.m.toolCalls.WithLabelValues("", "unavailable").Inc()
		return toolError(fmt.Sprintf("tool %q of MCP server %q is granted to principal %q, but no member of the mesh serves %q right now; %s",
			tool, server, principal, server, unavailableRetry()))
	}
	body, _ := json.Marshal(toolCall{Server: server, Tool: tool, Arguments: args})
	last := ""
	for _, id := range ids {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+id+"/v1/tools/call", bytes.NewReader(body))
		if err != nil {
			return toolError(err.Error())
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(HeaderPrincipal, principal)
		resp, err := n.remote.mesh.Do(id, req)
		if err != nil {
			if ctx.Err() != nil {
				return toolError("the call was cancelled")
			}
			if !errors.Is(err, ErrNotSent) {
				// It may have run there: a tool call is not sent to a
				// second member, so that nothing runs twice.
				n.m.toolCalls.WithLabelValues("", "unavailable").Inc()
				return toolError(fmt.Sprintf("the call to %q on the member serving MCP server %q broke off (%v); it may have run there, so it was not sent elsewhere", tool, server, err))
			}
			last = err.Error()
			continue
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, n.maxBody))
		resp.Body.Close()
		if err != nil || resp.StatusCode >= 500 {
			n.m.toolCalls.WithLabelValues("", "unavailable").Inc()
			return toolError(fmt.Sprintf("the member serving MCP server %q failed the call to %q (%s); it may have run there, so it was not sent elsewhere", server, tool, resp.Status))
		}
		if resp.StatusCode != http.StatusOK {
			var e apiError
			json.Unmarshal(data, &e)
			return toolError(fmt.Sprintf("the member serving %q refused the call: %s", server, e.Error.Message))
		}
		var res mcp.CallToolResult
		if err := json.Unmarshal(data, &res); err != nil {
			last = "a result that is not a tool result: " + err.Error()
			continue
		}
		outcome := "ok"
		if res.IsError {
			outcome = "tool_error"
		}
		n.m.toolCalls.WithLabelValues("", "mesh_"+outcome).Inc()
		return &res
	}
	n.m.toolCalls.WithLabelValues("", "unavailable").Inc()
	return toolError(fmt.Sprintf("no member serving the MCP server %q could take the call (last: %s); %s", server, last, unavailableRetry()))
}
