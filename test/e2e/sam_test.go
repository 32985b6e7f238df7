package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/proxy"

	"sandstorm/api"
	"sandstorm/internal/sam/fakellm"
	"sandstorm/internal/testenv"
)

// agentResult mirrors test/agent's /run answer.
type agentResult struct {
	Models       []string `json:"models"`
	Chat         string   `json:"chat"`
	StreamChunks int      `json:"stream_chunks"`
	Stream       string   `json:"stream"`
	DeniedModel  string   `json:"denied_model_error"`
	Tools        []string `json:"tools"`
	ToolResult   string   `json:"tool_result"`
	DeniedTool   string   `json:"denied_tool_result"`
	DeniedToolIs bool     `json:"denied_tool_is_error"`
	Errors       []string `json:"errors"`
}

type probeResult struct {
	OK     bool     `json:"ok"`
	Status int      `json:"status"`
	Body   string   `json:"body"`
	Addrs  []string `json:"addrs"`
	Error  string   `json:"error"`
}

const samPolicy = `
roles:
  - name: a
    services: ["inference://gpt-small", "mcp://everything/echo"]
  - name: b
    services: ["inference://*", "mcp://everything"]
bindings:
  - {principal: agent-a, roles: [a]}
  - {principal: agent-b, roles: [b]}
`

// startSAMNode runs sam-node with the fake provider and server-everything
// (twice: as "everything" and as "present", a service agent-a is not
// granted).
func startSAMNode(t *testing.T, llm *fakellm.Server, policyPath string) samNode {
	t.Helper()
	everything, err := filepath.Abs("../../testdata/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(everything); err != nil {
		t.Fatalf("server-everything is not installed (%v): run npm ci --prefix testdata/mcp", err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf(`providers:
  - {name: fake, url: %q, models: [gpt-small, gpt-big]}
mcp_servers:
  - {name: everything, command: [node, %q, stdio]}
  - {name: present, command: [node, %q, stdio]}
`, llm.BaseURL(), everything, everything)
	cfgPath := filepath.Join(dir, "node.yaml")
	os.WriteFile(cfgPath, []byte(cfg), 0o600)
	sock := filepath.Join(dir, "sam-node.sock")
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	logf, _ := os.Create(filepath.Join(workDir, "sam-node-"+filepath.Base(dir)+".log"))
	cmd := exec.Command(samNodeBin, "--config", cfgPath, "--policy", policyPath, "--listen", "unix://"+sock, "--admin-addr", admin)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		stopProcess(cmd.Process, done, os.Interrupt, 10*time.Second)
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("sam-node log:\n%s", tail(string(b), 40))
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		r, err := call("GET", "http://"+admin+"/readyz", nil, nil, 2*time.Second)
		if err == nil && r.Status == 200 {
			return samNode{Sock: sock, Admin: admin, Log: logf.Name()}
		}
		exited := false
		select {
		case <-done:
			exited = true
		default:
		}
		if exited || time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("sam-node not ready on %s (exited: %v; %v, %d); log:\n%s", admin, exited, err, r.Status, tail(string(b), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// samNode is a running sam-node: its agent socket, admin address and log.
type samNode struct{ Sock, Admin, Log string }

// waitLog waits until the file at path contains s.
func waitLog(t *testing.T, path, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q not in %s within %v; last lines:\n%s", s, path, timeout, tail(string(b), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// agentGET calls the agent in sandbox sb through its gateway and decodes
// the JSON answer into out.
func agentGET(t *testing.T, sb api.Sandbox, path string, q url.Values, out any) {
	t.Helper()
	u := endpoint(t, sb) + path + "?" + q.Encode()
	r, err := call("GET", u, nil, nil, 2*time.Minute)
	if err != nil || r.Status != 200 {
		t.Fatalf("GET %s: %v HTTP %d %s", u, err, r.Status, r.Body)
	}
	if err := json.Unmarshal([]byte(r.Body), out); err != nil {
		t.Fatalf("GET %s: %v: %s", u, err, r.Body)
	}
}

// agentRun is what test/agent's /run answers with the query q.
func agentRun(t *testing.T, sb api.Sandbox, q url.Values) agentResult {
	t.Helper()
	var r agentResult
	agentGET(t, sb, "/run", q, &r)
	return r
}

func probeFrom(t *testing.T, sb api.Sandbox, kv ...string) probeResult {
	t.Helper()
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Add(kv[i], kv[i+1])
	}
	var p probeResult
	agentGET(t, sb, "/probe", q, &p)
	return p
}

// nftCounter reads a named counter of the node's nftables table.
func nftCounter(t *testing.T, name string) int {
	t.Helper()
	out, err := exec.Command("nft", "-j", "list", "counter", "inet", "sandstorm", name).Output()
	if err != nil {
		t.Fatalf("nft list counter %s: %v", name, err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	json.Unmarshal(out, &doc)
	for _, o := range doc.Nftables {
		if raw, ok := o["counter"]; ok {
			var c struct{ Packets int }
			json.Unmarshal(raw, &c)
			return c.Packets
		}
	}
	t.Fatalf("no counter %s in %s", name, out)
	return 0
}

// TestAgentThroughBoundary runs an unmodified agent (openai-go and the MCP
// Go SDK, no proxy settings) in real runsc sandboxes: it gets the models and
// tools its principal's policy grants, chats (streaming too) with a
// provider behind sam-node, calls tools on @modelcontextprotocol/server-everything,
// and reaches nothing else.
func TestAgentThroughBoundary(t *testing.T) {
	llm, err := fakellm.Listen("127.0.0.1:0", "gpt-small", "gpt-big")
	if err != nil {
		t.Fatal(err)
	}
	defer llm.Close()
	policyPath := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policyPath, []byte(samPolicy), 0o600)
	sn := startSAMNode(t, llm, policyPath)
	sock := sn.Sock
	metrics := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	d := startDaemon(t, "--policy", policyPath, "--sam-node", "unix://"+sock, "--metrics-addr", metrics)
	d.registerAgent(t)
	a := d.create(t, "agent", "agent-a")
	b := d.create(t, "agent", "agent-b")
	if a.Principal != "agent-a" || b.Principal != "agent-b" {
		t.Fatalf("principals %q %q", a.Principal, b.Principal)
	}

	runA := func(t *testing.T) agentResult {
		return agentRun(t, a, url.Values{
			"model": {"gpt-small"}, "denied_model": {"gpt-big"},
			"tool": {"everything__echo"}, "tool_args": {`{"message":"hi from a"}`},
			"denied_tool": {"everything__add"},
		})
	}
	checkA := func(t *testing.T, r agentResult) {
		t.Helper()
		if len(r.Errors) > 0 {
			t.Fatalf("agent-a errors: %q", r.Errors)
		}
		if strings.Join(r.Models, ",") != "gpt-small" {
			t.Errorf("agent-a sees models %q, want only gpt-small", r.Models)
		}
		if !strings.Contains(r.Chat, "hello from the sandbox") {
			t.Errorf("chat answer %q", r.Chat)
		}
		if r.StreamChunks < 2 || !strings.Contains(r.Stream, "stream please") {
			t.Errorf("stream: %d chunks, %q", r.StreamChunks, r.Stream)
		}
		if !strings.HasPrefix(r.DeniedModel, "403") || !strings.Contains(r.DeniedModel, "gpt-big") {
			t.Errorf("ungranted model: %q, want a 403 naming gpt-big", r.DeniedModel)
		}
		if strings.Join(r.Tools, ",") != "everything__echo" {
			t.Errorf("agent-a sees tools %q, want only everything__echo", r.Tools)
		}
		if !strings.Contains(r.ToolResult, "hi from a") {
			t.Errorf("echo result %q", r.ToolResult)
		}
		if !r.DeniedToolIs || r.DeniedTool == "" {
			t.Errorf("ungranted tool: %q (is error %v), want a readable tool error", r.DeniedTool, r.DeniedToolIs)
		}
	}
	checkA(t, runA(t))

	rb := agentRun(t, b, url.Values{"model": {"gpt-big"}})
	if len(rb.Errors) > 0 {
		t.Fatalf("agent-b errors: %q", rb.Errors)
	}
	sort.Strings(rb.Models)
	if strings.Join(rb.Models, ",") != "gpt-big,gpt-small" || len(rb.Tools) < 3 || !strings.Contains(rb.Chat, "hello") {
		t.Errorf("agent-b: models %q, %d tools, chat %q", rb.Models, len(rb.Tools), rb.Chat)
	}
	for _, req := range llm.Requests() {
		for k := range req.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-sam-") {
				t.Errorf("provider received mesh header %s", k)
			}
		}
	}

	t.Run("denials", func(t *testing.T) {
		host := netip.MustParseAddr(a.Address).Prev().String() // the host end of a's /30
		for _, c := range []struct {
			what string
			kv   []string
		}{
			{"external name not in policy", []string{"kind", "dns", "name", "example.com"}},
			{"the host's address on its link", []string{"kind", "tcp", "addr", host + ":22"}},
			{"the host's API port", []string{"kind", "tcp", "addr", host + ":" + strings.Split(d.API, ":")[2]}},
			{"another sandbox", []string{"kind", "tcp", "addr", b.Address + ":8000"}},
			{"DNS to 8.8.8.8", []string{"kind", "udpdns", "server", "8.8.8.8:53", "name", "example.com"}},
		} {
			if p := probeFrom(t, a, c.kv...); p.OK {
				t.Errorf("%s: reachable from the sandbox (%+v)", c.what, p)
			}
		}
		if n := nftCounter(t, "dns_elsewhere"); n == 0 {
			t.Error("the DNS query to 8.8.8.8 was not counted as dropped on the host")
		}
		// Admin paths through the mesh entrypoint are refused.
		for _, p := range []string{"/metrics", "/healthz", "/readyz", "/admin"} {
			if r := probeFrom(t, a, "kind", "http", "url", "http://mesh.sam.alt"+p); r.Status != 403 {
				t.Errorf("mesh.sam.alt%s: HTTP %d %q, want 403", p, r.Status, r.Error)
			}
		}
		// A spoofed identity header changes nothing.
		r := probeFrom(t, a, "kind", "http", "url", "http://mesh.sam.alt/v1/models", "header", "X-Sam-Principal:agent-b")
		if r.Status != 200 || !strings.Contains(r.Body, "gpt-small") || strings.Contains(r.Body, "gpt-big") {
			t.Errorf("spoofed X-Sam-Principal: HTTP %d %s", r.Status, r.Body)
		}
		// A service that exists but is not granted is refused exactly like
		// one that does not exist.
		pa := probeFrom(t, a, "kind", "dns", "name", "absent.mcp.sam.alt")
		pp := probeFrom(t, a, "kind", "dns", "name", "present.mcp.sam.alt")
		if pa.OK || pp.OK || strings.ReplaceAll(pa.Error, "absent", "X") != strings.ReplaceAll(pp.Error, "present", "X") {
			t.Errorf("absent vs present: %+v vs %+v", pa, pp)
		}
		// Through the boundary's host-side socket (SOCKS5), as the boundary
		// sees it: localhost, literal IPs and ungranted names are refused.
		dialer, err := proxy.SOCKS5("unix", a.Boundary, nil, proxy.Direct)
		if err != nil {
			t.Fatal(err)
		}
		for _, dst := range []string{"localhost:22", "127.0.0.1:" + strings.Split(d.API, ":")[2], "192.0.2.1:80", "example.com:443", "absent.mcp.sam.alt:80", "present.mcp.sam.alt:80"} {
			c, err := dialer.Dial("tcp", dst)
			if err == nil {
				c.Close()
				t.Errorf("SOCKS5 CONNECT %s through agent-a's boundary succeeded", dst)
			}
		}
		// The boundaries count the denials too (the SOCKS5 ones above at
		// least), on their own metrics listener.
		m, err := call("GET", "http://"+metrics+"/metrics", nil, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("boundary metrics: %v", err)
		}
		denied := 0.0
		for _, line := range strings.Split(m.Body, "\n") {
			if strings.HasPrefix(line, "sam_box_flows_total{") && strings.Contains(line, `outcome="denied"`) {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				denied += v
			}
		}
		if denied < 6 {
			t.Errorf("the boundaries counted %v denied flows, want at least the 6 SOCKS5 refusals:\n%s", denied, m.Body)
		}
	})

	t.Run("tiers", func(t *testing.T) {
		// The boundary holds through freeze: the agent's SDKs carry on.
		d.transition(t, a.ID, "freeze", api.TierFrozen)
		checkA(t, runA(t))
		// runsc 2022-12 cannot checkpoint a Go server (its listening socket
		// is watched by epoll), so this snapshot fails; the node must say so
		// and keep the agent working, boundary included.
		_, err := d.C.Transition(ctxT(t), a.ID, "snapshot")
		got := d.get(t, a.ID)
		if err == nil {
			if got.Tier != api.TierSnapshot {
				t.Fatalf("snapshot succeeded but tier is %s", got.Tier)
			}
		} else if got.Tier != api.TierHot || !strings.Contains(got.Note, "epoll") {
			t.Fatalf("failed snapshot: %v; tier %s, note %q", err, got.Tier, got.Note)
		}
		checkA(t, runA(t))
	})

	t.Run("at_work_calling_out", func(t *testing.T) {
		// An agent at work calls out with nobody calling in: started by a
		// request answered at once, it waits on a model's streamed answer
		// that the provider holds after its first chunk for three times
		// the sandbox's freeze-after. Its boundary tells the node a mesh
		// request is in flight, so it is not frozen under its own call
		// (before, it was: nothing came in through the gateway).
		sb, err := d.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "agent", Name: "agent-w", Principal: "agent-a",
			Idle: &api.IdleTimers{FreezeAfter: "1s"}})
		if err != nil {
			t.Fatal(err)
		}
		d.track(sb.ID)
		endpoint(t, sb)
		pace := make(chan struct{})
		var release sync.Once
		llm.SetPace(pace)
		// Released on every way out: a stream left held would hold the
		// provider's Close for ever.
		defer func() { release.Do(func() { close(pace) }); llm.SetPace(nil) }()
		var started map[string]bool
		agentGET(t, sb, "/run", url.Values{"model": {"gpt-small"}, "background": {"1"}}, &started)
		if !started["started"] {
			t.Fatalf("background run: %v", started)
		}
		held := time.Now()
		for time.Since(held) < 3*time.Second {
			if tier := d.get(t, sb.ID).Tier; tier != api.TierHot {
				t.Fatalf("the sandbox went %s %v into its agent's call (freeze-after 1s)", tier, time.Since(held).Round(time.Millisecond))
			}
			time.Sleep(100 * time.Millisecond)
		}
		release.Do(func() { close(pace) })
		var last struct {
			Done   bool        `json:"done"`
			Result agentResult `json:"result"`
		}
		testenv.WaitFor(t, 30*time.Second, "the background run ends", func() bool {
			agentGET(t, sb, "/last", nil, &last)
			return last.Done
		})
		if len(last.Result.Errors) > 0 || last.Result.StreamChunks < 2 || !strings.Contains(last.Result.Stream, "stream please") {
			t.Fatalf("the held call: %+v", last.Result)
		}
		// Once it has nothing in flight, the same sandbox is idle again.
		testenv.WaitFor(t, 15*time.Second, "the idle agent frozen", func() bool { return d.get(t, sb.ID).Tier == api.TierFrozen })
	})

	t.Run("python_egress_across_snapshot", func(t *testing.T) {
		// A Python program (poll-based, so runsc can checkpoint it) reaches
		// the mesh by name through its boundary before and after a
		// snapshot, with its memory kept; what policy does not grant stays
		// out of reach.
		if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "py", RootfsDir: webRootfs,
			Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports, Principal: "agent-a"}); err != nil {
			t.Fatal(err)
		}
		py := d.create(t, "py", "py-a")
		if py.Principal != "agent-a" {
			t.Fatalf("principal %q, want the template's agent-a", py.Principal)
		}
		ep := endpoint(t, py)
		fetch := func(u string) string {
			return getBody(t, ep, "/fetch?"+url.Values{"url": {u}}.Encode())
		}
		if r := fetch("http://mesh.sam.alt/v1/models"); !strings.HasPrefix(r, "200 ") || !strings.Contains(r, "gpt-small") || strings.Contains(r, "gpt-big") {
			t.Fatalf("models from python: %q", r)
		}
		expectCount(t, ep, 1, "first call")
		d.transition(t, py.ID, "snapshot", api.TierSnapshot)
		if r := fetch("http://mesh.sam.alt/v1/models"); !strings.HasPrefix(r, "200 ") || !strings.Contains(r, "gpt-small") {
			t.Fatalf("models from python after restore: %q", r)
		}
		expectCount(t, ep, 2, "memory kept across the snapshot")
		for _, u := range []string{"http://example.com/", "http://absent.mcp.sam.alt/mcp", "http://present.mcp.sam.alt/mcp", "http://" + b.Address + ":8000/"} {
			if r := fetch(u); strings.HasPrefix(r, "200 ") {
				t.Errorf("python reached %s: %q", u, r)
			}
		}
	})

	t.Run("policy_reload", func(t *testing.T) {
		// A bad file is rejected and the old policy holds; a good one
		// changes what agent-a sees without restarting anything.
		os.WriteFile(policyPath, []byte("roles: [{name: a, egress: ['*']}]"), 0o600)
		// Both watchers poll: wait until each has seen and rejected it.
		const rejected = "policy: rejected the changed file"
		waitLog(t, d.LogPath, rejected, 30*time.Second)
		waitLog(t, sn.Log, rejected, 30*time.Second)
		checkA(t, runA(t))
		os.WriteFile(policyPath, []byte(strings.Replace(samPolicy, `"inference://gpt-small"`, `"inference://gpt-small", "inference://gpt-big"`, 1)), 0o600)
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := agentRun(t, a, url.Values{})
			if len(r.Models) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent-a still sees %q after the policy grants gpt-big", r.Models)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
}
