package meshnode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"sandstorm/internal/sam/fakellm"
)

// memNet is a mesh in memory: each member's MeshHandler on a loopback
// HTTP server, found by the names its node publishes. internal/sam/meshpeer
// tests the same seam over libp2p; this one tests what the nodes do.
type memNet struct {
	mu      sync.Mutex
	members map[string]*memMember
}

type memMember struct {
	node *Node
	srv  *httptest.Server
}

func (m *memNet) add(t *testing.T, name string, cfg Config) *Node {
	t.Helper()
	cfg.Mesh = &memMesh{net: m, self: name}
	cfg.Member = name
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(n.MeshHandler())
	t.Cleanup(func() { srv.Close(); n.Close() })
	m.mu.Lock()
	m.members[name] = &memMember{node: n, srv: srv}
	m.mu.Unlock()
	return n
}

type memMesh struct {
	net  *memNet
	self string
}

func (m *memMesh) Providers(ctx context.Context, name string) ([]string, error) {
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	var out []string
	for id, mm := range m.net.members {
		if id != m.self && slices.Contains(mm.node.Names(), name) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (m *memMesh) Do(member string, req *http.Request) (*http.Response, error) {
	m.net.mu.Lock()
	mm := m.net.members[member]
	m.net.mu.Unlock()
	u, _ := url.Parse(mm.srv.URL)
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = u.Scheme, u.Host, u.Host
	// What the mesh's transport does: the caller's name, from its
	// credential, replacing whatever it sent.
	req.Header.Set(HeaderMember, m.self)
	return http.DefaultTransport.RoundTrip(req)
}

const meshPolicy = `
roles:
  - name: b-only
    services: ["inference://m-b", "mcp://everything/echo"]
  - name: everything
    services: ["inference://*", "mcp://*"]
bindings:
  - principal: agent-a
    roles: [b-only]
  - principal: agent-all
    roles: [everything]
`

// TestMeshModelsAndTools: an agent on node A, which serves nothing
// itself, uses a model served by B and one by C and a tool served by B,
// by name, with the ordinary OpenAI and MCP clients; it sees and may use
// only what its policy grants, and the refusals are decided on A before
// anything is sent — and again on B, whose policy is its own copy.
func TestMeshModelsAndTools(t *testing.T) {
	llmB := fakellm.Start(t, "m-b")
	llmC := fakellm.Start(t, "m-c")
	log, _ := testLogger(t)
	pf := policyFile(t, meshPolicy)
	net := &memNet{members: map[string]*memMember{}}
	b := net.addServingB(t, llmB, pf, log)
	net.add(t, "node-c", Config{
		Providers:  []Provider{{Name: "llm-c", URL: llmC.BaseURL(), Models: []string{"m-c"}}},
		PolicyFile: pf, Logger: log.With("node", "c"),
	})
	a := net.add(t, "node-a", Config{PolicyFile: pf, Logger: log.With("node", "a")})
	agent := httptest.NewServer(a.Handler())
	t.Cleanup(agent.Close)

	if got := modelIDs(t, agentOpenAI(agent.URL, "agent-a")); !slices.Equal(got, []string{"m-b"}) {
		t.Errorf("agent-a's models on A: %v, want [m-b]", got)
	}
	if got := modelIDs(t, agentOpenAI(agent.URL, "agent-all")); !slices.Equal(got, []string{"m-b", "m-c"}) {
		t.Errorf("agent-all's models on A: %v, want [m-b m-c]", got)
	}
	ctx := ctxT(t)
	ca, cAll := agentOpenAI(agent.URL, "agent-a"), agentOpenAI(agent.URL, "agent-all")
	res, err := ca.Chat.Completions.New(ctx, chat("m-b", "across the mesh"))
	if err != nil {
		t.Fatalf("agent-a's call to m-b through A: %v", err)
	}
	if got := res.Choices[0].Message.Content; got != "echo: across the mesh" {
		t.Errorf("m-b answered %q", got)
	}
	if res, err := cAll.Chat.Completions.New(ctx, chat("m-c", "to C")); err != nil || res.Choices[0].Message.Content != "echo: to C" {
		t.Errorf("agent-all's call to m-c: %v, %v", res, err)
	}
	nC := len(llmC.Requests())
	_, err = ca.Chat.Completions.New(ctx, chat("m-c", "not mine"))
	wantAPIError(t, err, http.StatusForbidden)
	if len(llmC.Requests()) != nC {
		t.Error("a model refused on A still reached its provider")
	}
	_, err = cAll.Chat.Completions.New(ctx, chat("m-nowhere", "x"))
	wantAPIError(t, err, http.StatusNotFound)

	// MCP: B's server, through A, under the aggregated and the scoped
	// endpoint.
	s := agentMCP(t, agent.URL+"/mcp", "agent-a", nil)
	if got := toolNames(t, s); !slices.Equal(got, []string{"everything__echo"}) {
		t.Fatalf("agent-a's tools on A: %v", got)
	}
	if text, isErr := callText(t, s, "everything__echo", map[string]any{"message": "hi from A"}); isErr || !strings.Contains(text, "hi from A") {
		t.Errorf("echo through A: %q (error %v)", text, isErr)
	}
	if text, isErr := callText(t, s, "everything__get-sum", map[string]any{"a": 1, "b": 2}); !isErr || !strings.Contains(text, "not granted") {
		t.Errorf("an ungranted tool through A: %q (error %v)", text, isErr)
	}
	scoped := agentMCP(t, agent.URL+"/mcp/everything", "agent-all", nil)
	if text, isErr := callText(t, scoped, "get-sum", map[string]any{"a": 2, "b": 3}); isErr || !strings.Contains(text, "5") {
		t.Errorf("get-sum on /mcp/everything through A: %q (error %v)", text, isErr)
	}

	// On B, by B's own decision: a member that asks for what the policy
	// does not grant is refused there too.
	call := func(member, principal, path string, body any) (int, string) {
		data, _ := json.Marshal(body)
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(data))
		if member != "" {
			r.Header.Set(HeaderMember, member)
		}
		r.Header.Set(HeaderPrincipal, principal)
		w := httptest.NewRecorder()
		b.MeshHandler().ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	if code, body := call("node-a", "agent-a", "/v1/tools/call", toolCall{Server: "everything", Tool: "get-sum", Arguments: json.RawMessage(`{"a":1,"b":2}`)}); code != 200 || !strings.Contains(body, "not granted") || !strings.Contains(body, `"isError":true`) {
		t.Errorf("B's answer to an ungranted tool: %d %s", code, body)
	}
	if code, body := call("node-a", "agent-a", "/v1/chat/completions", map[string]any{"model": "m-c", "messages": []any{}}); code != http.StatusForbidden {
		t.Errorf("B's answer to an ungranted model: %d %s", code, body)
	}
	// A call from the mesh is never sent on: B does not serve m-c and
	// says so, though C does.
	nC = len(llmC.Requests())
	if code, body := call("node-a", "agent-all", "/v1/chat/completions", map[string]any{"model": "m-c", "messages": []any{map[string]string{"role": "user", "content": "x"}}}); code != http.StatusNotFound {
		t.Errorf("B asked for a model only C serves: %d %s", code, body)
	}
	if len(llmC.Requests()) != nC {
		t.Error("a mesh call was forwarded on to a third member")
	}
	if code, _ := call("", "agent-all", "/v1/tools/call", toolCall{Server: "everything", Tool: "echo"}); code != http.StatusForbidden {
		t.Errorf("a call with no member: %d, want 403", code)
	}
	if code, _ := call("node-a", "", "/v1/tools/call", toolCall{Server: "everything", Tool: "echo"}); code != http.StatusForbidden {
		t.Errorf("a call naming no principal: %d, want 403", code)
	}
	if code, _ := get(t, b.MeshHandler(), "/v1/catalog", nil); code != http.StatusForbidden {
		t.Errorf("the catalogue without a member: %d", code)
	}
	if !strings.Contains(scrape(t, b), `sam_node_mcp_tool_calls_total{outcome="denied",server="everything"} 1`) {
		t.Errorf("B did not count its own refusal:\n%s", grepLines(scrape(t, b), "sam_node_mcp_tool_calls_total"))
	}
}

// TestMeshRefusedOnTheServingMember: when the serving member's policy
// does not grant what the calling member's does, the serving member
// refuses, and the agent gets its refusal.
func TestMeshRefusedOnTheServingMember(t *testing.T) {
	llmB := fakellm.Start(t, "m-b")
	log, _ := testLogger(t)
	net := &memNet{members: map[string]*memMember{}}
	net.add(t, "node-b", Config{
		Providers:  []Provider{{Name: "llm-b", URL: llmB.BaseURL(), Models: []string{"m-b"}}},
		PolicyFile: policyFile(t, "roles: []\nbindings: []\n"), Logger: log,
	})
	a := net.add(t, "node-a", Config{PolicyFile: policyFile(t, meshPolicy), Logger: log})
	agent := httptest.NewServer(a.Handler())
	t.Cleanup(agent.Close)
	c := agentOpenAI(agent.URL, "agent-a")
	_, err := c.Chat.Completions.New(ctxT(t), chat("m-b", "x"))
	e := wantAPIError(t, err, http.StatusForbidden)
	if !strings.Contains(e.Message, "not granted") {
		t.Errorf("refusal: %q", e.Message)
	}
	if len(llmB.Requests()) != 0 {
		t.Error("the provider was reached though the serving member refused")
	}
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// brokenMesh is a mesh whose first member takes the request and then
// breaks off (the request was sent), and whose second would answer. It
// records where tool calls went; the node's own catalogue reads, which run
// in the background from New on (1 run in CI counted one as a call), are
// not tool calls.
type brokenMesh struct {
	mu   sync.Mutex
	sent []string
}

func (b *brokenMesh) Providers(context.Context, string) ([]string, error) {
	return []string{"m1", "m2"}, nil
}

func (b *brokenMesh) Do(member string, req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/v1/tools/call" {
		b.mu.Lock()
		b.sent = append(b.sent, member)
		b.mu.Unlock()
	}
	return nil, errors.New("connection reset after the request was written")
}

// TestMeshToolCallNotRunTwice: a tool call that may have run on one
// member is not sent to another.
func TestMeshToolCallNotRunTwice(t *testing.T) {
	log, _ := testLogger(t)
	m := &brokenMesh{}
	n, err := New(Config{Mesh: m, PolicyFile: policyFile(t, meshPolicy), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	res := n.callRemoteTool(ctxT(t), "agent-all", "everything", "echo", nil)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !res.IsError || len(m.sent) != 1 {
		t.Errorf("sent to %v (result error %v), want to the first member only", m.sent, res.IsError)
	}
}

// addServingB adds node-b, serving model m-b from llm and the everything
// MCP server under pf, and waits until its MCP server is connected.
func (m *memNet) addServingB(t *testing.T, llm *fakellm.Server, pf string, log *slog.Logger) *Node {
	t.Helper()
	b := m.add(t, "node-b", Config{
		Providers:  []Provider{{Name: "llm-b", URL: llm.BaseURL(), Models: []string{"m-b"}}},
		MCPServers: []MCPServer{{Name: "everything", Command: everythingCommand(t)}},
		PolicyFile: pf, Logger: log.With("node", "b"),
	})
	if err := b.WaitReady(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return b
}

func (m *memNet) remove(name string) {
	m.mu.Lock()
	delete(m.members, name)
	m.mu.Unlock()
}

// TestGrantedButServedNowhereNow (issue 29): a model and an MCP server
// that the mesh served a moment ago and no member serves now are
// "granted, but no member serves it now" — 503 with Retry-After, naming
// the service — not "not granted" (403), which sends the operator to the
// policy, nor "not found". What was never served stays 404, and what is
// not granted stays 403.
func TestGrantedButServedNowhereNow(t *testing.T) {
	llmB := fakellm.Start(t, "m-b")
	log, _ := testLogger(t)
	pf := policyFile(t, meshPolicy)
	net := &memNet{members: map[string]*memMember{}}
	net.addServingB(t, llmB, pf, log)
	a := net.add(t, "node-a", Config{PolicyFile: pf, Logger: log.With("node", "a")})
	agent := httptest.NewServer(a.Handler())
	t.Cleanup(agent.Close)
	ca := agentOpenAI(agent.URL, "agent-a")
	if _, err := ca.Chat.Completions.New(ctxT(t), chat("m-b", "while B serves")); err != nil {
		t.Fatalf("m-b while B serves: %v", err)
	}
	s := agentMCP(t, agent.URL+"/mcp", "agent-a", nil)
	if text, isErr := callText(t, s, "everything__echo", map[string]any{"message": "hi"}); isErr {
		t.Fatalf("echo while B serves: %q", text)
	}

	net.remove("node-b")
	a.remote.refresh(ctxT(t))

	post := func(principal, model string) (*http.Response, string) {
		body, _ := json.Marshal(map[string]any{"model": model, "messages": []any{map[string]string{"role": "user", "content": "x"}}})
		req, _ := http.NewRequest(http.MethodPost, agent.URL+"/v1/chat/completions", bytes.NewReader(body))
		resp, err := agentHTTP(principal).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp, string(data)
	}
	resp, body := post("agent-a", "m-b")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, `granted to principal \"agent-a\"`) || !strings.Contains(body, "m-b") || !strings.Contains(body, "right now") {
		t.Errorf("m-b with B gone: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if code, body := get(t, a.Handler(), "/v1/models/m-b", http.Header{HeaderPrincipal: {"agent-a"}}); code != http.StatusServiceUnavailable {
		t.Errorf("GET /v1/models/m-b with B gone: %d %s", code, body)
	}
	if resp, body := post("agent-all", "m-nowhere"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a model never served: %d %s, want 404", resp.StatusCode, body)
	}
	if resp, body := post("agent-a", "m-c"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a model not granted: %d %s, want 403", resp.StatusCode, body)
	}
	text, isErr := callText(t, s, "everything__echo", map[string]any{"message": "hi"})
	if !isErr || strings.Contains(text, "not granted") || !strings.Contains(text, "is granted") || !strings.Contains(text, `"everything"`) {
		t.Errorf("echo with B gone: %q (error %v), want granted-but-away", text, isErr)
	}
	if text, isErr := callText(t, s, "everything__get-sum", map[string]any{"a": 1, "b": 2}); !isErr || !strings.Contains(text, "not granted") {
		t.Errorf("get-sum, not granted, with B gone: %q", text)
	}
	req := httptest.NewRequest(http.MethodPost, "/mcp/everything", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	req.Header.Set(HeaderPrincipal, "agent-all")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	w := httptest.NewRecorder()
	a.Handler().ServeHTTP(w, req)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("/mcp/everything with B gone: %d %s", w.Code, w.Body.String())
	}
}
