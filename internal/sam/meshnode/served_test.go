package meshnode

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandstorm/internal/sam/fakellm"
	"sandstorm/internal/testenv"
)

// sandboxMCP stands for an MCP server in a sandbox behind the node's
// gateway: a real Streamable HTTP server (the official SDK's) with one
// tool that counts its calls, and a count of the HTTP requests and of
// the standalone streams (GET) it was sent.
func sandboxMCP(t *testing.T) (url string, requests, gets *atomic.Int64) {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "notes", Version: "1"}, nil)
	var calls atomic.Int64
	type in struct{}
	type out struct {
		Count int64 `json:"count"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "counts its calls"}, func(context.Context, *mcp.CallToolRequest, in) (*mcp.CallToolResult, out, error) {
		return nil, out{Count: calls.Add(1)}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	requests, gets = &atomic.Int64{}, &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.Method == http.MethodGet {
			gets.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp", requests, gets
}

func putServed(t *testing.T, h http.Handler, l ServedList) int {
	t.Helper()
	b, _ := json.Marshal(l)
	r := httptest.NewRequest(http.MethodPut, ServedPath, bytes.NewReader(b))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// TestSandboxServed: what sandstormd says its sandboxes serve is served
// as the node's own — listed to the principals granted it, called
// without a session or stream kept open to the sandbox, published to
// the mesh and called from another node — and what it no longer says is
// gone.
func TestSandboxServed(t *testing.T) {
	mcpURL, requests, gets := sandboxMCP(t)
	llm := fakellm.Start(t, "tiny")
	log, _ := testLogger(t)
	pf := policyFile(t, `
roles:
  - {name: r, services: ["mcp://notes", "inference://tiny"]}
bindings:
  - {principal: agent-a, roles: [r]}
`)
	net := &memNet{members: map[string]*memMember{}}
	b := net.add(t, "node-b", Config{PolicyFile: pf, Logger: log.With("node", "b")})
	if code := putServed(t, b.Handler(), ServedList{Services: []ServedService{
		{Kind: "mcp", Name: "notes", URL: mcpURL}, {Kind: "inference", Name: "tiny", URL: llm.BaseURL()},
	}}); code != http.StatusNoContent {
		t.Fatalf("PUT served: %d", code)
	}
	for _, bad := range []ServedList{
		{Services: []ServedService{{Kind: "mcp", Name: "Bad Name", URL: mcpURL}}},
		{Services: []ServedService{{Kind: "smtp", Name: "x", URL: mcpURL}}},
		{Services: []ServedService{{Kind: "mcp", Name: "x", URL: "file:///etc/passwd"}}},
	} {
		if code := putServed(t, b.Handler(), bad); code != http.StatusBadRequest {
			t.Errorf("PUT %+v: %d, want 400", bad, code)
		}
	}
	// An agent's request (it names a principal) never reaches the path.
	r := httptest.NewRequest(http.MethodPut, ServedPath, strings.NewReader(`{"services":[]}`))
	r.Header.Set(HeaderPrincipal, "agent-a")
	w := httptest.NewRecorder()
	b.Handler().ServeHTTP(w, r)
	if w.Code == http.StatusNoContent {
		t.Error("a request naming a principal changed what the sandboxes serve")
	}
	if !slices.Contains(b.Names(), "mcp://notes") || !slices.Contains(b.Names(), "inference://tiny") {
		t.Errorf("B publishes %v", b.Names())
	}

	agentB := httptest.NewServer(b.Handler())
	t.Cleanup(agentB.Close)
	s := agentMCP(t, agentB.URL+"/mcp", "agent-a", nil)
	testenv.WaitFor(t, 10*time.Second, "B lists the sandbox's tools", func() bool { return len(toolNames(t, s)) == 1 })
	text, isErr := callText(t, s, "notes__count", nil)
	if isErr || !strings.Contains(text, `"count":1`) {
		t.Errorf("count on B: %q (error %v)", text, isErr)
	}
	if gets.Load() != 0 {
		t.Errorf("%d standalone streams were opened to the sandbox", gets.Load())
	}

	// From node A, across the mesh.
	a := net.add(t, "node-a", Config{PolicyFile: pf, Logger: log.With("node", "a")})
	agentA := httptest.NewServer(a.Handler())
	t.Cleanup(agentA.Close)
	sa := agentMCP(t, agentA.URL+"/mcp", "agent-a", nil)
	if got := toolNames(t, sa); !slices.Equal(got, []string{"notes__count"}) {
		t.Fatalf("agent on A sees %v", got)
	}
	if text, isErr := callText(t, sa, "notes__count", nil); isErr || !strings.Contains(text, `"count":2`) {
		t.Errorf("count from A: %q (error %v)", text, isErr)
	}
	c := agentOpenAI(agentA.URL, "agent-a")
	if res, err := c.Chat.Completions.New(ctxT(t), chat("tiny", "to a sandbox")); err != nil || res.Choices[0].Message.Content != "echo: to a sandbox" {
		t.Errorf("a sandbox-served model from A: %v, %v", res, err)
	}

	// Gone when sandstormd says so.
	before := requests.Load()
	if code := putServed(t, b.Handler(), ServedList{}); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if got := toolNames(t, s); len(got) != 0 {
		t.Errorf("after the sandboxes stopped serving: %v", got)
	}
	if requests.Load() != before {
		t.Error("listing reached a sandbox that no longer serves")
	}
}
