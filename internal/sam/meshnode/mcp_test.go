package meshnode

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandstorm/internal/testenv"
)

const mcpPolicy = `
roles:
  - name: echo-only
    services: ["mcp://everything/echo"]
  - name: all-tools
    services: ["mcp://everything"]
  - name: any-server
    services: ["mcp://*"]
bindings:
  - principal: agent-a
    roles: [echo-only]
  - principal: agent-b
    roles: [all-tools]
  - principal: agent-c
    roles: [any-server]
`

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startMCPNode starts a node aggregating server-everything over stdio.
func startMCPNode(t *testing.T, policyText string) (*Node, string, string) {
	t.Helper()
	log, _ := testLogger(t)
	pf := policyFile(t, policyText)
	n, url := startNode(t, Config{
		MCPServers:     []MCPServer{{Name: "everything", Command: everythingCommand(t)}},
		PolicyFile:     pf,
		PolicyInterval: 20 * time.Millisecond,
		Logger:         log,
	})
	if err := n.WaitReady(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return n, url, pf
}

// agentMCP connects as principal to endpoint, with the official SDK's
// client, as an agent in a sandbox does.
func agentMCP(t *testing.T, endpoint, principal string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, opts)
	s, err := c.Connect(ctxT(t), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: agentHTTP(principal)}, nil)
	if err != nil {
		t.Fatalf("%s connecting to %s: %v", principal, endpoint, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func toolNames(t *testing.T, s *mcp.ClientSession) []string {
	t.Helper()
	res, err := s.ListTools(ctxT(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

func callText(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := s.CallTool(ctxT(t), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("calling %s: a protocol error, not a tool result: %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

// upstreamToolNames asks server-everything itself, with no node between.
func upstreamToolNames(t *testing.T) []string {
	t.Helper()
	argv := everythingCommand(t)
	c := mcp.NewClient(&mcp.Implementation{Name: "test-direct", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {},
	})
	s, err := c.Connect(ctxT(t), &mcp.CommandTransport{Command: exec.Command(argv[0], argv[1:]...), TerminateDuration: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return toolNames(t, s)
}

func TestMCPPerPrincipal(t *testing.T) {
	n, url, _ := startMCPNode(t, mcpPolicy)
	upstream := upstreamToolNames(t)
	if !slices.Contains(upstream, "echo") || !slices.Contains(upstream, "get-sum") {
		t.Fatalf("server-everything lists %v; the test expects echo and get-sum", upstream)
	}

	// agent-a is granted one tool: it sees exactly that one.
	a := agentMCP(t, url+"/mcp", "agent-a", nil)
	if got := toolNames(t, a); !slices.Equal(got, []string{"everything__echo"}) {
		t.Fatalf("agent-a sees %v", got)
	}
	if text, isErr := callText(t, a, "everything__echo", map[string]any{"message": "hi mesh"}); isErr || text != "Echo: hi mesh" {
		t.Fatalf("echo: %q error=%v", text, isErr)
	}
	// Anything else is a tool error its model can read, not a crash; the
	// same for a tool that exists and one that does not.
	for _, name := range []string{"everything__get-sum", "everything__no-such-tool", "nowhere__echo", "bare"} {
		text, isErr := callText(t, a, name, map[string]any{"a": 1, "b": 2})
		if !isErr || text != fmt.Sprintf("tool %q is not granted to principal \"agent-a\"; tools/list shows the tools you may call", name) {
			t.Errorf("calling %s: %q error=%v", name, text, isErr)
		}
	}
	// The session survives refusals.
	if _, isErr := callText(t, a, "everything__echo", map[string]any{"message": "still here"}); isErr {
		t.Fatal("echo after a refusal failed")
	}

	// agent-b is granted the whole server: every tool, prefixed.
	b := agentMCP(t, url+"/mcp", "agent-b", nil)
	var want []string
	for _, name := range upstream {
		want = append(want, "everything"+ToolSeparator+name)
	}
	if got := toolNames(t, b); !slices.Equal(got, want) {
		t.Fatalf("agent-b sees %v, want %v", got, want)
	}
	if text, isErr := callText(t, b, "everything__get-sum", map[string]any{"a": 1, "b": 2}); isErr || text != "The sum of 1 and 2 is 3." {
		t.Fatalf("get-sum: %q error=%v", text, isErr)
	}

	// /mcp/everything: the same grants, under the tools' own names.
	a1 := agentMCP(t, url+"/mcp/everything", "agent-a", nil)
	if got := toolNames(t, a1); !slices.Equal(got, []string{"echo"}) {
		t.Fatalf("agent-a on /mcp/everything sees %v", got)
	}
	if text, isErr := callText(t, a1, "echo", map[string]any{"message": "plain"}); isErr || text != "Echo: plain" {
		t.Fatalf("plain echo: %q %v", text, isErr)
	}
	if text, isErr := callText(t, a1, "get-sum", map[string]any{"a": 1, "b": 2}); !isErr || !strings.Contains(text, "not granted") {
		t.Fatalf("plain get-sum: %q %v", text, isErr)
	}
	b1 := agentMCP(t, url+"/mcp/everything", "agent-b", nil)
	if got := toolNames(t, b1); !slices.Equal(got, upstream) {
		t.Fatalf("agent-b on /mcp/everything sees %v", got)
	}
	// A boundary narrowing /mcp to one server (X-Sam-Service) gives the
	// same view.
	c := mcp.NewClient(&mcp.Implementation{Name: "narrowed", Version: "1"}, nil)
	narrowed, err := c.Connect(ctxT(t), &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{
		Transport: &boundary{principal: "agent-a", service: "mcp://everything", base: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer narrowed.Close()
	if got := toolNames(t, narrowed); !slices.Equal(got, []string{"echo"}) {
		t.Fatalf("narrowed to mcp://everything: %v", got)
	}

	// A server not granted is refused alike whether or not it exists;
	// one granted but not configured is 404.
	for _, tc := range []struct {
		principal, path string
		code            int
	}{
		{"agent-a", "/mcp/absent", http.StatusForbidden},
		{"agent-b", "/mcp/absent", http.StatusForbidden},
		{"stranger", "/mcp/everything", http.StatusForbidden},
		{"agent-c", "/mcp/absent", http.StatusNotFound},
	} {
		resp, err := agentHTTP(tc.principal).Post(url+tc.path, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.principal, tc.path, resp.StatusCode, tc.code)
		}
	}

	// A principal with no grants connects and sees nothing.
	s := agentMCP(t, url+"/mcp", "stranger", nil)
	if got := toolNames(t, s); len(got) != 0 {
		t.Fatalf("stranger sees %v", got)
	}

	// A session belongs to the principal that opened it.
	if a.ID() == "" {
		t.Fatal("no session ID")
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", a.ID())
	req.Header.Set("Mcp-Protocol-Version", a.InitializeResult().ProtocolVersion)
	resp, err := agentHTTP("agent-b").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("agent-b using agent-a's session: %d", resp.StatusCode)
	}

	m := scrape(t, n)
	for _, want := range []string{
		`sam_node_mcp_tool_calls_total{outcome="ok",server="everything"} 4`,
		`sam_node_mcp_upstream_connected{server="everything"} 1`,
		`sam_node_mcp_upstream_dials_total{outcome="ok",server="everything"} 1`,
	} {
		if !hasLine(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !strings.Contains(m, `sam_node_mcp_tool_calls_total{outcome="denied",server="everything"}`) {
		t.Error("metrics lack the denials")
	}
	if strings.Contains(m, "agent-") || strings.Contains(m, "get-sum") {
		t.Error("a principal or a tool name became a metric label")
	}
	if code, body := get(t, n.AdminHandler(), "/readyz", nil); code != 200 {
		t.Fatalf("readyz: %d %s", code, body)
	}
}

func TestMCPPolicyReload(t *testing.T) {
	n, url, pf := startMCPNode(t, mcpPolicy)
	changed := make(chan struct{}, 16)
	a := agentMCP(t, url+"/mcp", "agent-a", &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	})
	if got := toolNames(t, a); !slices.Equal(got, []string{"everything__echo"}) {
		t.Fatalf("before: %v", got)
	}

	// Grant get-sum too: the catalogue grows, and the connected agent is
	// told so.
	replaceFile(t, pf, strings.Replace(mcpPolicy, `["mcp://everything/echo"]`, `["mcp://everything/echo", "mcp://everything/get-sum"]`, 1))
	// A notification may also come from the upstream's own start-up, so
	// wait for the grant to show rather than trusting the first one.
	select {
	case <-changed:
	case <-ctxT(t).Done():
		t.Fatal("no notifications/tools/list_changed after the policy changed")
	}
	testenv.WaitFor(t, 30*time.Second, "get-sum to be listed after the grant", func() bool {
		return slices.Equal(toolNames(t, a), []string{"everything__echo", "everything__get-sum"})
	})
	if text, isErr := callText(t, a, "everything__get-sum", map[string]any{"a": 2, "b": 3}); isErr || !strings.Contains(text, "is 5") {
		t.Fatalf("get-sum after the grant: %q %v", text, isErr)
	}

	// A bad file is rejected and the policy in force holds.
	replaceFile(t, pf, "roles: [{name: x, services: [\"mcp://Bad Name\"]}]\n")
	testenv.WaitFor(t, 30*time.Second, "the bad policy to be rejected", func() bool {
		return hasLine(scrape(t, n), "sam_node_policy_rejected_total 1")
	})
	if got := toolNames(t, a); !slices.Equal(got, []string{"everything__echo", "everything__get-sum"}) {
		t.Fatalf("after a bad file: %v", got)
	}
	if _, isErr := callText(t, a, "everything__get-sum", map[string]any{"a": 2, "b": 3}); isErr {
		t.Fatal("get-sum refused after a bad file")
	}

	// Revoke everything: nothing is listed, and a call is refused.
	replaceFile(t, pf, "bindings: []\n")
	testenv.WaitFor(t, 30*time.Second, "the revocation", func() bool { return len(toolNames(t, a)) == 0 })
	if text, isErr := callText(t, a, "everything__echo", map[string]any{"message": "x"}); !isErr || !strings.Contains(text, "not granted") {
		t.Fatalf("echo after revocation: %q %v", text, isErr)
	}
	if !hasLine(scrape(t, n), "sam_node_policy_reloads_total 2") {
		t.Error("reloads not counted")
	}
}

// childrenRunning returns the PIDs of this process's children whose
// command line contains s.
func childrenRunning(t *testing.T, s string) []int {
	t.Helper()
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) || f[0] == "Z" {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmd), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestMCPUpstreamRedial(t *testing.T) {
	n, url, _ := startMCPNode(t, mcpPolicy)
	a := agentMCP(t, url+"/mcp", "agent-a", nil)
	pids := childrenRunning(t, "server-everything")
	if len(pids) != 1 {
		t.Fatalf("server-everything children: %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the node to re-dial server-everything", func() bool {
		return hasLine(scrape(t, n), `sam_node_mcp_upstream_dials_total{outcome="ok",server="everything"} 2`) && n.Ready()
	})
	// The agent's own session with the node never broke.
	if text, isErr := callText(t, a, "everything__echo", map[string]any{"message": "again"}); isErr || text != "Echo: again" {
		t.Fatalf("echo after the re-dial: %q %v", text, isErr)
	}
	n.Close()
	testenv.WaitFor(t, 30*time.Second, "server-everything to be stopped by Close", func() bool {
		return len(childrenRunning(t, "server-everything")) == 0
	})
}

func TestMCPUpstreamUnreachable(t *testing.T) {
	log, _ := testLogger(t)
	n, url := startNode(t, Config{
		MCPServers: []MCPServer{{Name: "ghost", Command: []string{filepath.Join(t.TempDir(), "no-such-server")}}},
		PolicyFile: policyFile(t, mcpPolicy),
		Logger:     log,
	})
	testenv.WaitFor(t, 30*time.Second, "a failed dial", func() bool {
		return hasLine(scrape(t, n), `sam_node_mcp_upstream_dials_total{outcome="error",server="ghost"} 1`)
	})
	code, body := get(t, n.AdminHandler(), "/readyz", nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "ghost") {
		t.Fatalf("readyz: %d %s", code, body)
	}
	if code, _ := get(t, n.AdminHandler(), "/healthz", nil); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	// The node still serves: agent-c (mcp://*) sees no tools yet.
	c := agentMCP(t, url+"/mcp", "agent-c", nil)
	if got := toolNames(t, c); len(got) != 0 {
		t.Fatalf("tools of an unreachable server: %v", got)
	}
}

// TestMCPStreamableHTTPUpstream aggregates server-everything run as a
// Streamable HTTP server on loopback.
func TestMCPStreamableHTTPUpstream(t *testing.T) {
	argv := everythingCommand(t)
	addr := closedPort(t)
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command(argv[0], argv[1], "streamableHttp")
	cmd.Env = append(os.Environ(), "PORT="+port)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	log, _ := testLogger(t)
	n, url := startNode(t, Config{
		MCPServers: []MCPServer{{Name: "everything", URL: "http://" + addr + "/mcp"}},
		PolicyFile: policyFile(t, mcpPolicy),
		Logger:     log,
	})
	if err := n.WaitReady(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	a := agentMCP(t, url+"/mcp", "agent-a", nil)
	if got := toolNames(t, a); !slices.Equal(got, []string{"everything__echo"}) {
		t.Fatalf("agent-a sees %v", got)
	}
	if text, isErr := callText(t, a, "everything__echo", map[string]any{"message": "over http"}); isErr || text != "Echo: over http" {
		t.Fatalf("echo: %q %v", text, isErr)
	}
}

// A principal's view is dropped once no session is bound to it and no new
// session asked for it for a while (here: at once), when another view is
// made; a view with a session is kept and still answers; a principal whose
// view was dropped gets its tools again on its next session.
func TestMCPIdleViewsDropped(t *testing.T) {
	n, url, _ := startMCPNode(t, mcpPolicy)
	h := n.hub
	h.mu.Lock()
	h.viewIdle = time.Nanosecond
	h.mu.Unlock()
	views := func() map[viewKey]*view {
		h.mu.Lock()
		defer h.mu.Unlock()
		return maps.Clone(h.views)
	}
	a := agentMCP(t, url+"/mcp", "agent-a", nil)
	b := agentMCP(t, url+"/mcp", "agent-b", nil)
	allTools := toolNames(t, b)
	b.Close()
	vb := views()[viewKey{"agent-b", ""}]
	if vb == nil {
		t.Fatal("no view of agent-b")
	}
	testenv.WaitFor(t, 10*time.Second, "agent-b's session gone from its view", func() bool {
		for range vb.server.Sessions() {
			return false
		}
		return true
	})
	time.Sleep(time.Millisecond) // past viewIdle/10 since the last sweep
	agentMCP(t, url+"/mcp", "agent-c", nil)
	vs := views()
	if _, ok := vs[viewKey{"agent-b", ""}]; ok {
		t.Error("agent-b's view, with no session, was kept")
	}
	if _, ok := vs[viewKey{"agent-a", ""}]; !ok {
		t.Error("agent-a's view was dropped under its open session")
	}
	if got := toolNames(t, a); !slices.Equal(got, []string{"everything__echo"}) {
		t.Errorf("agent-a's session after the sweep sees %v", got)
	}
	if got := toolNames(t, agentMCP(t, url+"/mcp", "agent-b", nil)); !slices.Equal(got, allTools) || len(got) < 2 {
		t.Errorf("agent-b's new session sees %v, want %v", got, allTools)
	}
}
