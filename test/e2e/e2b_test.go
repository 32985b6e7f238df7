package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/demo"
	"sandstorm/internal/sam/fakellm"
)

var (
	baseOnce   sync.Once
	baseDemo   demo.Demo
	baseRootfs string
	baseErr    error
)

// registerBase registers the base demo (the E2B SDK's default template)
// as "base", building its rootfs once per run.
func (d *Daemon) registerBase(t *testing.T) {
	t.Helper()
	d.registerBaseFrom(t, builtBase(t), "")
}

// builtBase is the base demo's rootfs, built once per run.
func builtBase(t *testing.T) string {
	t.Helper()
	baseOnce.Do(func() {
		baseRootfs, baseDemo, baseErr = buildDemo("base")
	})
	if baseErr != nil {
		t.Fatalf("build the base demo: %v", baseErr)
	}
	return baseRootfs
}

// registerBaseFrom registers rootfs, the base demo's or a copy of it, as
// "base", whose sandboxes are principal to their boundaries ("": each
// its own name).
func (d *Daemon) registerBaseFrom(t *testing.T, rootfs, principal string) {
	t.Helper()
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{
		Name: "base", RootfsDir: rootfs, Principal: principal,
		Process: api.Process{Args: baseDemo.Args, Env: baseDemo.Env, Envd: baseDemo.Envd}, Ports: baseDemo.Ports, Warm: baseDemo.Warm,
	}); err != nil {
		t.Fatalf("register base: %v", err)
	}
}

// baseTrusting is a copy of the base demo's rootfs whose trust store
// (Debian's bundle, which curl and pip read) also holds caPEM. Made before
// the daemon that runs it starts, so that it is removed after that daemon
// stops (cleanups run last first).
func baseTrusting(t *testing.T, caPEM []byte) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", builtBase(t), dst).CombinedOutput(); err != nil {
		t.Fatalf("copy the base rootfs: %v: %s", err, out)
	}
	f, err := os.OpenFile(filepath.Join(dst, "etc/ssl/certs/ca-certificates.crt"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(caPEM); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestE2BSDK drives a master and node with the real E2B SDK from npm
// (testdata/e2b, pinned), unchanged: only its environment variables point
// it here. testdata/e2b/flows.mjs holds the flows (commands, files,
// pause/connect, lifetimes, list filters and paging, another team's key)
// and checks each answer; this test sets them up and reads the report.
func TestE2BSDK(t *testing.T) {
	script, err := filepath.Abs("../../testdata/e2b/flows.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "e2b")); err != nil {
		t.Fatalf("the E2B SDK is not installed (%v): run npm ci --prefix testdata/e2b", err)
	}
	d := startDaemon(t)
	d.registerBase(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	keyA := strings.TrimSpace(cli(t, env, "api-key", "create", "team-a").Stdout)
	keyB := strings.TrimSpace(cli(t, env, "api-key", "create", "team-b").Stdout)
	if !strings.HasPrefix(keyA, "e2b_") || len(keyA) != 44 {
		t.Fatalf("api-key create printed %q, want e2b_ and 40 hex digits", keyA)
	}
	// The current release, and the oldest this API is meant for.
	for _, module := range []string{"e2b", "e2b-2.45"} {
		t.Run(module, func(t *testing.T) { runFlows(t, d, script, module, keyA, keyB) })
	}

	// The other way the SDK addresses a sandbox: its Host,
	// 49983-<id>.<domain>, on the API's listener, whose certificate
	// covers *.<domain> — curl, resolving that name to loopback itself.
	ca := filepath.Join(d.DataDir, "pki", "ca.pem")
	port := d.API[strings.LastIndex(d.API, ":")+1:]
	created := curl(t, "-sS", "--cacert", ca, "-H", "X-API-KEY: "+keyA, "-H", "Content-Type: application/json",
		"-d", `{"templateID": "base", "timeout": 60}`, d.API+"/e2b/sandboxes")
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(created), &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create through curl: %q %v", created, err)
	}
	host := "49983-" + sb.SandboxID + ".sandbox.localhost"
	health := func(token string) string {
		return curl(t, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", ca, "--resolve", host+":"+port+":127.0.0.1",
			"-H", "X-Access-Token: "+token, "https://"+host+":"+port+"/health")
	}
	if code := health(sb.EnvdAccessToken); code != "204" {
		t.Errorf("envd's /health by Host with its token: %s, want 204", code)
	}
	if code := health(strings.Repeat("0", 64)); code != "401" {
		t.Errorf("envd's /health by Host with a wrong token: %s, want 401", code)
	}

	// A revoked key is refused at once.
	keys := cli(t, env, "api-key", "ls")
	keys.ok(t, "api-key ls", `team-a`, `team-b`)
	if strings.Contains(keys.Stdout, keyA) {
		t.Errorf("api-key ls shows a key: %s", keys.Stdout)
	}
	id := ""
	for _, l := range strings.Split(keys.Stdout, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "team-b" {
			id = f[0]
		}
	}
	cli(t, env, "api-key", "rm", id).ok(t, "api-key rm")
	r := cli(t, []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN=" + keyB}, "sandbox", "ls")
	if r.Code == 0 || !strings.Contains(r.Stderr, "revoked") {
		t.Errorf("a revoked key: exit %d, stderr %q", r.Code, r.Stderr)
	}
}

func extra(connectMs, killedMs float64) string {
	var b strings.Builder
	if connectMs > 0 {
		b.WriteString("  (connect " + time.Duration(connectMs*float64(time.Millisecond)).Round(100*time.Microsecond).String() + ")")
	}
	if killedMs > 0 {
		b.WriteString("  (killed " + time.Duration(killedMs*float64(time.Millisecond)).Round(time.Millisecond).String() + " after create, timeout 2 s)")
	}
	return b.String()
}

// curl runs curl with args and returns its stdout, failing the test if it
// cannot run.
func curl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("curl", args...).Output()
	if err != nil {
		t.Fatalf("curl %v: %v (%s)", args, err, out)
	}
	return string(out)
}

// runFlows runs testdata/e2b/flows.mjs with the SDK module against d and
// checks its report, step by step; extraEnv (KEY=VALUE) override its
// environment.
func runFlows(t *testing.T, d *Daemon, script, module, keyA, keyB string, extraEnv ...string) {
	var run [4]byte
	rand.Read(run[:])
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = filepath.Dir(script)
	cmd.Env = append(os.Environ(), "E2B_MODULE="+module,
		"E2B_API_KEY="+keyA, "OTHER_KEY="+keyB,
		"E2B_API_URL="+d.API+"/e2b", "E2B_SANDBOX_URL="+d.API, "E2B_DOMAIN=sandbox.localhost",
		"NODE_EXTRA_CA_CERTS="+filepath.Join(d.DataDir, "pki", "ca.pem"),
		"SANDSTORM_API="+d.API, "RUN_ID="+hex.EncodeToString(run[:]),
	)
	cmd.Env = append(cmd.Env, extraEnv...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var report struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Steps []struct {
			Name  string  `json:"name"`
			OK    bool    `json:"ok"`
			Ms    float64 `json:"ms"`
			Error string  `json:"error"`
			// measured by some steps
			ConnectMs     float64 `json:"connectMs"`
			KilledAfterMs float64 `json:"killedAfterMs"`
		} `json:"steps"`
	}
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &report); jerr != nil {
		t.Fatalf("node %s: %v (%v)\nstdout: %s\nstderr: %s", script, err, jerr, out, stderr.String())
	}
	for _, s := range report.Steps {
		t.Logf("%-60s ok=%v %7.1f ms%s", s.Name, s.OK, s.Ms, extra(s.ConnectMs, s.KilledAfterMs))
		if !s.OK {
			t.Errorf("step %q: %s", s.Name, s.Error)
		}
	}
	if !report.OK {
		t.Fatalf("the SDK flows failed: %s\nstderr: %s", report.Error, stderr.String())
	}
}

// TestE2BMCP: E2B's Sandbox.create({mcp}) with the SDK unchanged gives an
// agent one MCP endpoint (getMcpUrl, getMcpToken) that serves the tools
// its principal is granted in the mesh, through its boundary: the MCP
// SDK's client lists and calls a granted tool, a tool of a server the
// policy does not grant is refused, the endpoint wants the token, and a
// gateway asked for a server the mesh does not grant fails to start and
// its sandbox is killed (testdata/e2b/mcp.mjs).
func TestE2BMCP(t *testing.T) {
	llm, err := fakellm.Listen("127.0.0.1:0", "gpt-small")
	if err != nil {
		t.Fatal(err)
	}
	defer llm.Close()
	policyPath := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policyPath, []byte(`
roles:
  - {name: tools, services: ["mcp://everything"]}
bindings:
  - {principal: mcp-agent, roles: [tools]}
`), 0o600)
	sn := startSAMNode(t, llm, policyPath)
	d := startDaemon(t, "--policy", policyPath, "--sam-node", "unix://"+sn.Sock)
	builtBase(t)
	// E2B's SDK creates from "mcp-gateway" when a create has mcp: here a
	// base sandbox whose principal the policy grants the tools.
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{
		Name: "mcp-gateway", RootfsDir: baseRootfs, Principal: "mcp-agent",
		Process: api.Process{Args: baseDemo.Args, Env: baseDemo.Env, Envd: baseDemo.Envd}, Ports: baseDemo.Ports, Warm: baseDemo.Warm,
	}); err != nil {
		t.Fatalf("register mcp-gateway: %v", err)
	}
	// The same with no principal (cold, no warm image needed): its
	// sandboxes are sb-<id>, which the policy binds to nothing.
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{
		Name: "mcp-unbound", RootfsDir: baseRootfs,
		Process: api.Process{Args: baseDemo.Args, Env: baseDemo.Env, Envd: baseDemo.Envd}, Ports: baseDemo.Ports,
	}); err != nil {
		t.Fatalf("register mcp-unbound: %v", err)
	}
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	key := strings.TrimSpace(cli(t, env, "api-key", "create", "team-mcp").Stdout)
	script, err := filepath.Abs("../../testdata/e2b/mcp.mjs")
	if err != nil {
		t.Fatal(err)
	}
	// getMcpUrl is https://50005-<id>.<domain>, the domain the create
	// answered: E2B's layout, as the SDK's own suite has it
	// (e2bsdk_test.go), the API at api.<domain> with the API's port.
	domain := "sandbox.localhost:" + d.API[strings.LastIndex(d.API, ":")+1:]
	runFlows(t, d, script, "e2b", key, key, "E2B_DOMAIN="+domain, "E2B_API_URL=https://api."+domain)
}
