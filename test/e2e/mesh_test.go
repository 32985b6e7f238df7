package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandstorm/api"
	"sandstorm/internal/sam/fakellm"
	"sandstorm/internal/sam/meshlab"
	"sandstorm/internal/testenv"
)

// The mesh across machines (issue 17): a control plane, a router and
// three nodes, each "machine" its own network namespace on one LAN (a
// bridge in a namespace of its own), node C reachable only through the
// router's relay (nftables in C's namespace lets it talk to the control
// plane and the router only).

const meshLAN = "10.199.77" // the test's own LAN, inside its namespaces only

type meshHost struct {
	ns, addr string
}

// cmd runs bin inside the host's namespace (nsenter execs it: the PID is
// the program's own, so a kill reaches it).
func (h meshHost) cmd(bin string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.ns, "--", bin}, args...)...)
}

// nsClient is an HTTP client whose connections are made inside ns.
func nsClient(t *testing.T, ns string) *http.Client {
	return meshlab.Host{NS: ns}.HTTPClient(10 * time.Second)
}

// meshLab makes the LAN and the hosts on it.
func meshLab(t *testing.T, names ...string) map[string]meshHost {
	t.Helper()
	tag := fmt.Sprintf("%04x", os.Getpid()&0xffff)
	lan := "sm-lan-" + tag
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	exec.Command("ip", "netns", "delete", lan).Run() // a run cut short
	sh("ip", "netns", "add", lan)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", lan).Run() })
	sh("ip", "-n", lan, "link", "add", "br0", "type", "bridge")
	sh("ip", "-n", lan, "link", "set", "br0", "up")
	hosts := map[string]meshHost{}
	for i, n := range names {
		h := meshHost{ns: "sm-" + n + "-" + tag, addr: fmt.Sprintf("%s.%d", meshLAN, 10+i)}
		exec.Command("ip", "netns", "delete", h.ns).Run()
		sh("ip", "netns", "add", h.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "delete", h.ns).Run() })
		port := fmt.Sprintf("p%d", i)
		sh("ip", "-n", lan, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
		sh("ip", "-n", lan, "link", "set", port, "master", "br0", "up")
		sh("ip", "-n", h.ns, "addr", "add", h.addr+"/24", "dev", "eth0")
		sh("ip", "-n", h.ns, "link", "set", "eth0", "up")
		sh("ip", "-n", h.ns, "link", "set", "lo", "up")
		hosts[n] = h
	}
	return hosts
}

// proc is a program running on a mesh host, with its log.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, name string, c *exec.Cmd) *proc {
	t.Helper()
	logPath := filepath.Join(workDir, "mesh-"+name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	c.Stdout, c.Stderr = f, f
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: c, log: logPath, done: make(chan struct{})}
	go func() { c.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s log:\n%s", name, tail(string(b), 40))
		}
	})
	return p
}

func (p *proc) stop() {
	stopProcess(p.cmd.Process, p.done, syscall.SIGTERM, 10*time.Second)
}

func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// run runs a command to its end and returns its output.
func runIn(t *testing.T, c *exec.Cmd) (string, error) {
	t.Helper()
	out, err := c.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

var tokenRE = regexp.MustCompile(`samb_[A-Za-z0-9_-]+`)

func TestMeshAcrossMachines(t *testing.T) {
	for _, b := range []string{samControlPlaneBin, samRouterBin, samNodeBin} {
		if _, err := os.Stat(b); err != nil {
			t.Fatal(err)
		}
	}
	hosts := meshLab(t, "cp", "router", "a", "b", "c")
	cp, rt, ha, hb, hc := hosts["cp"], hosts["router"], hosts["a"], hosts["b"], hosts["c"]

	// Node C talks to the control plane and the router, nothing else.
	nft := fmt.Sprintf(`table inet relayonly {
  counter refused {
  }
  chain in {
    type filter hook input priority 0; policy accept;
    iif lo accept
    ip saddr { %[1]s, %[2]s } accept
    counter name refused drop
  }
  chain out {
    type filter hook output priority 0; policy accept;
    oif lo accept
    ip daddr { %[1]s, %[2]s } accept
    counter name refused drop
  }
}
`, cp.addr, rt.addr)
	nftFile := filepath.Join(t.TempDir(), "c.nft")
	os.WriteFile(nftFile, []byte(nft), 0o600)
	if out, err := runIn(t, hc.cmd("nft", "-f", nftFile)); err != nil {
		t.Fatalf("nft in C: %v: %s", err, out)
	}

	// The control plane.
	cpDir := t.TempDir()
	cpAPI := "https://" + cp.addr + ":7600"
	startProc(t, "control-plane", cp.cmd(samControlPlaneBin, "serve", "--data-dir", cpDir, "--listen", cp.addr+":7600"))
	caFile := filepath.Join(cpDir, "pki", "ca.pem")
	operator := func(args ...string) (string, error) {
		return runIn(t, cp.cmd(samControlPlaneBin, append([]string{"--data-dir", cpDir, "--api", cpAPI}, args...)...))
	}
	testenv.WaitFor(t, 30*time.Second, "the control plane answers", func() bool {
		_, err := operator("members")
		return err == nil
	})
	newToken := func(args ...string) string {
		t.Helper()
		out, err := operator(append([]string{"token", "create"}, args...)...)
		tok := tokenRE.FindString(out)
		if err != nil || tok == "" {
			t.Fatalf("token create: %v: %s", err, out)
		}
		return tok
	}

	// Enrolment: good, bad, spent (a single-use token used again), expired.
	dirs := map[string]string{}
	join := func(h meshHost, bin, name, token string) (string, error) {
		dir := filepath.Join(t.TempDir(), "mesh")
		dirs[name] = dir
		return runIn(t, h.cmd(bin, "join", "--control-plane", cpAPI, "--ca", caFile, "--name", name, "--token", token, "--mesh-dir", dir))
	}
	four := newToken("--max-uses", "4")
	for _, j := range []struct {
		h         meshHost
		bin, name string
	}{{rt, samRouterBin, "router"}, {ha, samNodeBin, "node-a"}, {hb, samNodeBin, "node-b"}, {hc, samNodeBin, "node-c"}} {
		if out, err := join(j.h, j.bin, j.name, four); err != nil {
			t.Fatalf("join %s: %v: %s", j.name, err, out)
		}
	}
	if out, err := join(ha, samNodeBin, "node-x", four); err == nil {
		t.Errorf("a fifth join on a 4-use token: %s", out)
	}
	if out, err := join(ha, samNodeBin, "node-x", "samb_not-a-token"); err == nil {
		t.Errorf("a join with a made-up token: %s", out)
	}
	short := newToken("--ttl", "1s")
	expiry := time.Now().Add(time.Second)
	testenv.WaitFor(t, 5*time.Second, "the 1 s token's expiry", func() bool { return time.Now().After(expiry.Add(100 * time.Millisecond)) })
	if out, err := join(ha, samNodeBin, "node-x", short); err == nil {
		t.Errorf("a join with an expired token: %s", out)
	}
	matches, _ := filepath.Glob(filepath.Join(dirs["node-a"], "*"))
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil && fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is mode %v, want 0600", m, fi.Mode().Perm())
		}
	}

	// The router; it prints its address with its peer ID.
	router := startProc(t, "router", rt.cmd(samRouterBin, "--mesh-dir", dirs["router"], "--listen", "/ip4/"+rt.addr+"/tcp/7700"))
	var routerAddr string
	testenv.WaitFor(t, 30*time.Second, "the router prints its address", func() bool {
		routerAddr = firstLineWith(router.log, "/ip4/"+rt.addr+"/tcp/7700/p2p/")
		return routerAddr != ""
	})

	// Policy: the mesh's one policy, set on the control plane, grants
	// agent-a m-c and all of everything; A, C and A's sandstormd take it
	// from there (no file on them). B, which serves everything, narrows
	// it with a file of its own to echo only — so a call A lets through
	// is refused on B by B's own decision.
	meshPolicy := writeTemp(t, "policy-mesh.yaml", `
roles:
  - {name: a, services: ["inference://m-c", "mcp://everything"]}
  - {name: notes, services: ["mcp://notes"]}
bindings:
  - {principal: agent-a, roles: [a]}
  - {principal: caller-b, roles: [notes]}
`)
	if out, err := operator("policy", "set", meshPolicy); err != nil {
		t.Fatalf("policy set: %v: %s", err, out)
	}
	policyB := writeTemp(t, "policy-b.yaml", `
roles:
  - {name: a, services: ["inference://m-c", "mcp://everything/echo"]}
  - {name: notes, services: ["mcp://notes"]}
bindings:
  - {principal: agent-a, roles: [a]}
  - {principal: caller-b, roles: [notes]}
`)
	// C's model: a real OpenAI-protocol server on C's own loopback.
	var llm *fakellm.Server
	if err := meshlab.InNS(hc.ns, func() (err error) {
		llm, err = fakellm.Listen("127.0.0.1:0", "m-c")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer llm.Close()
	everything, _ := filepath.Abs("../../testdata/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	cfgB := writeTemp(t, "node-b.yaml", fmt.Sprintf("mcp_servers:\n  - {name: everything, command: [node, %q, stdio]}\n", everything))
	cfgC := writeTemp(t, "node-c.yaml", fmt.Sprintf("providers:\n  - {name: llm-c, url: %q, models: [m-c]}\n", llm.BaseURL()))
	sockA := filepath.Join(t.TempDir(), "sam-node-a.sock")
	node := func(h meshHost, name string, extra ...string) *proc {
		args := append([]string{"--mesh-dir", dirs[name], "--router", routerAddr, "--p2p-listen", "/ip4/" + h.addr + "/tcp/7701",
			"--admin-addr", "127.0.0.1:9601", "--log-level", "debug"}, extra...)
		return startProc(t, name, h.cmd(samNodeBin, args...))
	}
	sockB := filepath.Join(t.TempDir(), "b.sock")
	node(hb, "node-b", "--policy", policyB, "--config", cfgB, "--listen", "unix://"+sockB)
	node(hc, "node-c", "--config", cfgC, "--listen", "unix://"+filepath.Join(t.TempDir(), "c.sock"))
	pa := node(ha, "node-a", "--listen", "unix://"+sockA)
	waitLog(t, pa.log, "joined the mesh", 60*time.Second)

	// An agent in a sandbox on A, through its boundary, with the ordinary
	// OpenAI and MCP SDKs.
	// A's sandstormd is in this namespace; its gateway listens on a link
	// of its own into A's, where A's sam-node reaches the sandboxes that
	// serve the mesh.
	gw := linkTo(t, ha, "smgw", "10.199.78.1", "10.199.78.2")
	d := startDaemon(t, "--policy", "sam-node", "--sam-node", "unix://"+sockA, "--gateway-listen", gw)
	d.registerAgent(t)
	sb := d.create(t, "agent", "agent-a")
	runAgent := func() agentResult {
		return agentRun(t, sb, url.Values{
			"model": {"m-c"}, "denied_model": {"m-elsewhere"},
			"tool": {"everything__echo"}, "tool_args": {`{"message":"hi from A"}`},
			"denied_tool": {"everything__get-sum"},
		})
	}
	var r agentResult
	testenv.WaitFor(t, 60*time.Second, "the agent on A sees C's model and B's tools", func() bool {
		r = runAgent()
		return len(r.Errors) == 0 && strings.Join(r.Models, ",") == "m-c" && len(r.Tools) > 1
	})
	if !strings.Contains(r.Chat, "hello from the sandbox") || r.StreamChunks < 2 {
		t.Errorf("m-c on C through A: chat %q, %d chunks", r.Chat, r.StreamChunks)
	}
	if !strings.HasPrefix(r.DeniedModel, "403") {
		t.Errorf("a model A's policy does not grant: %q, want 403", r.DeniedModel)
	}
	if !strings.Contains(r.ToolResult, "hi from A") {
		t.Errorf("echo on B through A: %q", r.ToolResult)
	}
	if !r.DeniedToolIs || !strings.Contains(r.DeniedTool, "not granted") {
		t.Errorf("get-sum, granted on A and not on B: %q (error %v), want B's refusal", r.DeniedTool, r.DeniedToolIs)
	}
	if len(llm.Requests()) == 0 {
		t.Error("C's provider never saw a request")
	}
	metricsB := scrapeIn(t, hb, "127.0.0.1:9601")
	if !strings.Contains(metricsB, `sam_node_mcp_tool_calls_total{outcome="denied",server="everything"}`) {
		t.Errorf("B did not count its refusal:\n%s", grep(metricsB, "tool_calls"))
	}
	if n := nftPackets(t, hc, "relayonly", "refused"); n == 0 {
		t.Error("nothing tried to reach C directly: the test does not show the relay was needed")
	}

	// The router killed with -9 and restarted: the mesh comes back, C
	// through the relay again.
	router.kill()
	router = startProc(t, "router-2", rt.cmd(samRouterBin, "--mesh-dir", dirs["router"], "--listen", "/ip4/"+rt.addr+"/tcp/7700"))
	before := len(llm.Requests())
	testenv.WaitFor(t, 60*time.Second, "the mesh recovers after the router's restart", func() bool {
		r = runAgent()
		return len(r.Errors) == 0 && strings.Contains(r.Chat, "hello") && len(llm.Requests()) > before
	})

	// A revoked member is refused by the others within seconds.
	if out, err := operator("revoke", "node-c"); err != nil {
		t.Fatalf("revoke: %v: %s", err, out)
	}
	revokedAt := time.Now()
	testenv.WaitFor(t, 30*time.Second, "C's model refused once C is revoked", func() bool {
		r = runAgent()
		return r.Chat == "" && len(r.Errors) > 0
	})
	t.Logf("C refused %v after its revocation", time.Since(revokedAt).Round(time.Millisecond))

	// A sandbox on A serves an MCP server to the mesh (its template says
	// so); snapshotted, it answers a call from another node, with its
	// memory.
	notesTpl := agentTemplate("notes")
	notesTpl.Serves = []api.Serve{{Kind: "mcp", Name: "notes", Port: 8000, Path: "/mcp"}}
	if _, err := d.C.CreateTemplate(ctxT(t), notesTpl); err != nil {
		t.Fatal(err)
	}
	notes := d.create(t, "notes", "notes-1")
	fromB := unixMCP(t, sockB, "caller-b")
	var text string
	testenv.WaitFor(t, 60*time.Second, "B's agents see the MCP server a sandbox on A serves", func() bool {
		text = callTool(t, fromB, "notes__count")
		return strings.Contains(text, `"count":1`)
	})
	d.transition(t, notes.ID, "snapshot", api.TierSnapshot)
	if got := d.get(t, notes.ID).Tier; got != api.TierSnapshot {
		t.Fatalf("notes-1 is %s", got)
	}
	if text = callTool(t, fromB, "notes__count"); !strings.Contains(text, `"count":2`) {
		t.Errorf("the snapshotted server's answer from B: %q, want count 2 (its memory kept)", text)
	}
	if got := d.get(t, notes.ID).Tier; got != api.TierHot {
		t.Errorf("after the call notes-1 is %s, want hot", got)
	}
	if text = callTool(t, unixMCP(t, sockB, "agent-a"), "notes__count"); strings.Contains(text, "count") && !strings.Contains(text, "not granted") {
		t.Errorf("a principal not granted notes called it: %q", text)
	}

	// A policy change on the control plane reaches A, its boundaries and
	// B within seconds: agent-a loses MCP.
	narrower := writeTemp(t, "policy-mesh-2.yaml", `
roles:
  - {name: a, services: ["inference://m-c"]}
bindings:
  - {principal: agent-a, roles: [a]}
`)
	if out, err := operator("policy", "set", narrower); err != nil {
		t.Fatalf("policy set: %v: %s", err, out)
	}
	changedAt := time.Now()
	testenv.WaitFor(t, 30*time.Second, "the policy change reaches the agent's node", func() bool {
		r = runAgent()
		return len(r.Tools) == 0 && !strings.Contains(r.ToolResult, "hi from A")
	})
	t.Logf("the policy change took effect on A %v after it was set", time.Since(changedAt).Round(time.Millisecond))
}

func agentTemplate(name string) api.TemplateRequest {
	return api.TemplateRequest{Name: name, RootfsDir: agentRootfs, Process: api.Process{Args: []string{"/agent"}}, Ports: []int{8000}}
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// firstLineWith is the first whitespace-separated field of path's lines
// that contains s, or "".
func firstLineWith(path, s string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for _, w := range strings.Fields(sc.Text()) {
			if strings.Contains(w, s) {
				return w
			}
		}
	}
	return ""
}

func scrapeIn(t *testing.T, h meshHost, addr string) string {
	t.Helper()
	resp, err := nsClient(t, h.ns).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", h.ns, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grep(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// nftPackets reads a named counter of a table in h's namespace.
func nftPackets(t *testing.T, h meshHost, table, counter string) int {
	t.Helper()
	out, err := runIn(t, h.cmd("nft", "list", "counter", "inet", table, counter))
	if err != nil {
		t.Fatalf("nft list counter: %v: %s", err, out)
	}
	var n int
	if m := regexp.MustCompile(`packets (\d+)`).FindStringSubmatch(out); m != nil {
		fmt.Sscan(m[1], &n)
	}
	return n
}

// linkTo makes a veth between this namespace (addr here) and h's (peer
// there) and returns addr.
func linkTo(t *testing.T, h meshHost, name, addr, peer string) string {
	t.Helper()
	exec.Command("ip", "link", "delete", name).Run()
	for _, c := range [][]string{
		{"link", "add", name, "type", "veth", "peer", "name", "gw0", "netns", h.ns},
		{"addr", "add", addr + "/24", "dev", name},
		{"link", "set", name, "up"},
		{"-n", h.ns, "addr", "add", peer + "/24", "dev", "gw0"},
		{"-n", h.ns, "link", "set", "gw0", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "link", "delete", name).Run() })
	return addr
}

// unixMCP is an MCP client session to a sam-node's agent socket as a
// boundary would open one for principal.
func unixMCP(t *testing.T, sock, principal string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: &principalRT{principal: principal, base: &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}}
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	s, err := c.Connect(ctxT(t), &mcp.StreamableClientTransport{Endpoint: "http://mesh.sam.alt/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("MCP session with %s as %s: %v", sock, principal, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type principalRT struct {
	principal string
	base      http.RoundTripper
}

func (p *principalRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Sam-Principal", p.principal)
	return p.base.RoundTrip(r)
}

// callTool calls name and returns its text, or the protocol error's.
func callTool(t *testing.T, s *mcp.ClientSession, name string) string {
	t.Helper()
	res, err := s.CallTool(ctxT(t), &mcp.CallToolParams{Name: name})
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
