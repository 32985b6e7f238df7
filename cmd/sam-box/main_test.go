package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/proxy"

	"sandstorm/api"
	"sandstorm/internal/logging"
	"sandstorm/internal/sam/meshnode"
	"sandstorm/internal/testenv"
)

// TestMain lets the test binary be sam-box itself, for the signal test.
func TestMain(m *testing.M) {
	if os.Getenv("SAM_BOX_TEST_MAIN") == "1" {
		os.Args = append([]string{"sam-box"}, strings.Fields(os.Getenv("SAM_BOX_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeNode is a real HTTP server on a Unix socket standing in for
// sam-node's agent listener; it answers with the principal it was told.
func fakeNode(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "node.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == api.SAMRefusalsPath && r.Header.Get("X-Sam-Principal") == "" {
			w.WriteHeader(http.StatusNoContent) // the boundaries' report (TestRefusalsReported has a real node)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "principal": r.Header.Get("X-Sam-Principal"), "auth": r.Header.Get("Authorization")})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// policyDir is a directory of the test's with policyA in it, as pf.
func policyDir(t *testing.T) (dir, pf string) {
	t.Helper()
	dir = t.TempDir()
	pf = filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pf, []byte(policyA), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, pf
}

// start runs sam-box in-process until the test ends.
func start(t *testing.T, o options) (metrics net.Addr, log *testenv.SyncBuffer) {
	t.Helper()
	log = &testenv.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	o.ready = func(a net.Addr) { ready <- a }
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	select {
	case a := <-ready:
		return a, log
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, log)
	case <-time.After(10 * time.Second):
		t.Fatalf("not ready\n%s", log)
	}
	return nil, log
}

func defaults() options {
	return options{socketMode: "0660", synthetic: "169.254.64.0/18", proxyPort: 1080, dnsPort: 53, transparentPort: 15001,
		policyInterval: 20 * time.Millisecond, handshake: 10 * time.Second, dialTimeout: 10 * time.Second, log: logging.Flags{Level: "debug", Format: "text"}}
}

func through(t *testing.T, sock, url string) (int, map[string]string) {
	t.Helper()
	d, err := proxy.SOCKS5("unix", sock, nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{DialContext: d.(proxy.ContextDialer).DialContext}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Sam-Principal", "root")
	req.Header.Set("Authorization", "Bearer x")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]string
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

const policyA = `
roles:
  - name: r
    services: ["inference://*"]
bindings:
  - principal: agent-a
    roles: [r]
  - principal: agent-b
    roles: [r]
`

// One boundary from flags: the mesh through SOCKS5 with the boundary's
// identity, metrics only on --metrics-addr, policy reloads (a bad file is
// rejected and the old policy holds), the socket removed at the end.
func TestOneBoundary(t *testing.T) {
	dir, pf := policyDir(t)
	o := defaults()
	o.principal, o.policy, o.socket = "agent-a", pf, filepath.Join(dir, "agent.sock")
	o.mesh = "unix://" + fakeNode(t)
	o.metricsAddr = testenv.FreeAddr(t)
	maddr, log := start(t, o)

	status, got := through(t, o.socket, "http://mesh.sam.alt/v1/models")
	if status != 200 || got["principal"] != "agent-a" || got["auth"] != "" || got["path"] != "/v1/models" {
		t.Fatalf("through the boundary: %d %v", status, got)
	}
	if fi, err := os.Stat(o.socket); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode: %v %v", fi, err)
	}
	if status, _ := through(t, o.socket, "http://mesh.sam.alt/metrics"); status != 403 {
		t.Errorf("admin path: %d", status)
	}

	// A bad policy file is rejected; the old one stays in force.
	os.WriteFile(pf, []byte("roles: [{name: r, egress: ['*']}]"), 0o600)
	testenv.WaitFor(t, 10*time.Second, "the changed policy rejected", func() bool { return strings.Contains(log.String(), "rejected the changed file") })
	if status, _ := through(t, o.socket, "http://mesh.sam.alt/v1/models"); status != 200 {
		t.Errorf("after a bad policy file: %d", status)
	}
	// A good one that takes agent-a's grants away is in force at once.
	os.WriteFile(pf, []byte("roles: [{name: r, services: ['mcp://x']}]\nbindings: [{principal: someone, roles: [r]}]"), 0o600)
	testenv.WaitFor(t, 10*time.Second, "the new policy in force", func() bool { s, _ := through(t, o.socket, "http://mesh.sam.alt/v1/models"); return s == 0 })

	resp, err := http.Get("http://" + maddr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sam_box_flows_total{outcome="allowed",route="mesh"} `,
		`sam_box_flows_total{outcome="denied",route="mesh"}`,
		`sam_box_admission_seconds_bucket{le="5e-06"}`,
		`sam_box_active_flows`,
		`sam_box_refusals_total`,
		`sam_box_dns_queries_total{answer="nxdomain"} 0`,
		`sam_box_boundaries 1`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(string(body), "sam_box_"))
		}
	}
	if strings.Contains(string(body), "agent-a") || strings.Contains(string(body), "mesh.sam.alt") {
		t.Error("a principal or a name became a label")
	}
}

// Metrics are off unless asked for.
func TestNoMetricsListenerByDefault(t *testing.T) {
	o := defaults()
	o.principal, o.socket = "agent-a", filepath.Join(t.TempDir(), "a.sock")
	maddr, log := start(t, o)
	if maddr != nil {
		t.Fatalf("metrics listener at %v", maddr)
	}
	if !strings.Contains(log.String(), "no --mesh") || !strings.Contains(log.String(), "grants nothing") {
		t.Errorf("log does not warn of the missing mesh and policy:\n%s", log)
	}
	// No policy: even the mesh is denied.
	if status, _ := through(t, o.socket, "http://mesh.sam.alt/v1/models"); status != 0 {
		t.Errorf("no policy, mesh reached: %d", status)
	}
}

// Many boundaries in one process, each its own principal.
func TestConfigManyBoundaries(t *testing.T) {
	dir, pf := policyDir(t)
	cf := filepath.Join(dir, "boxes.yaml")
	os.WriteFile(cf, []byte(`
mesh: unix://`+fakeNode(t)+`
policy: `+pf+`
boundaries:
  - principal: agent-a
    socket: `+dir+`/a.sock
  - principal: agent-b
    socket: `+dir+`/b.sock
  - principal: agent-c
    socket: `+dir+`/c.sock
`), 0o600)
	o := defaults()
	o.config = cf
	start(t, o)
	for _, p := range []string{"a", "b"} {
		if status, got := through(t, dir+"/"+p+".sock", "http://mesh.sam.alt/v1/models"); status != 200 || got["principal"] != "agent-"+p {
			t.Errorf("agent-%s: %d %v", p, status, got)
		}
	}
	// agent-c has no binding.
	if status, _ := through(t, dir+"/c.sock", "http://mesh.sam.alt/v1/models"); status != 0 {
		t.Errorf("agent-c reached the mesh: %d", status)
	}
}

func TestBadInvocations(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("roles: [{name: r, egress: ['api.*.com']}]"), 0o600)
	for name, mod := range map[string]func(*options){
		"nothing":         func(o *options) {},
		"no socket":       func(o *options) { o.principal = "a" },
		"bad mesh":        func(o *options) { o.principal, o.socket, o.mesh = "a", dir+"/x.sock", "http://x" },
		"bad policy":      func(o *options) { o.principal, o.socket, o.policy = "a", dir+"/x.sock", bad },
		"missing policy":  func(o *options) { o.principal, o.socket, o.policy = "a", dir+"/x.sock", dir+"/none.yaml" },
		"bad listen":      func(o *options) { o.principal, o.listen = "a", "not-an-ip" },
		"listen, no peer": func(o *options) { o.principal, o.listen = "a", "127.0.0.1" },
		"bad peer":        func(o *options) { o.principal, o.listen, o.peer = "a", "127.0.0.1", "x" },
		"bad sandbox net": func(o *options) { o.principal, o.socket, o.sandboxNets = "a", dir+"/x.sock", []string{"10.0.0.0"} },
		"bad resolver":    func(o *options) { o.principal, o.socket, o.resolver = "a", dir+"/x.sock", "dns.example" },
		"both":            func(o *options) { o.principal, o.config = "a", bad },
		"bad config":      func(o *options) { o.config = bad },
		"bad socket mode": func(o *options) { o.principal, o.socket, o.socketMode = "a", dir+"/x.sock", "999" },
	} {
		o := defaults()
		mod(&o)
		if err := run(context.Background(), o, io.Discard); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(dir + "/x.sock"); !os.IsNotExist(err) {
		t.Errorf("a socket was left behind: %v", err)
	}
}

func TestHelp(t *testing.T) {
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--principal", "--policy", "--socket", "--mesh", "--listen", "--proxy-port", "--dns-port", "--transparent-port", "--metrics-addr", "--config", "--peer", "--sandbox-net", "--resolver", "egress_private", "SIGTERM", "mesh.sam.alt"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %s", want)
		}
	}
}

// The real process: SIGTERM resets flows, removes the socket, exits 0.
func TestSIGTERM(t *testing.T) {
	dir, pf := policyDir(t)
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SAM_BOX_TEST_MAIN=1",
		"SAM_BOX_TEST_ARGS=--principal agent-a --policy "+pf+" --socket "+sock+" --mesh unix://"+fakeNode(t))
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	testenv.WaitFor(t, 10*time.Second, "sam-box ready", func() bool { return strings.Contains(stderr.String(), "sam-box: ready") })
	// An open flow, kept alive.
	d, _ := proxy.SOCKS5("unix", sock, nil, proxy.Direct)
	c, err := d.Dial("tcp", "mesh.sam.alt:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	errc := make(chan error, 1)
	go func() { errc <- cmd.Wait() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no exit after SIGTERM\n%s", stderr.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	if !strings.Contains(stderr.String(), "flows_reset=1") {
		t.Errorf("log:\n%s", stderr.String())
	}
}

func grep(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestRefusalsReported: sam-box reports its boundaries' refusals to the
// sam-node on --mesh (a real one here), as sandstormd's node does, and a
// forged report sent through a boundary is refused there — by the
// boundary and by the node — and never counted.
func TestRefusalsReported(t *testing.T) {
	dir, pf := policyDir(t)
	node, err := meshnode.New(meshnode.Config{PolicyFile: pf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	sock := filepath.Join(dir, "node.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: node.Handler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	o := defaults()
	o.principal, o.policy, o.socket, o.mesh = "agent-a", pf, filepath.Join(dir, "agent.sock"), "unix://"+sock
	start(t, o)
	if status, _ := through(t, o.socket, "http://secret.example/"); status != 0 {
		t.Fatalf("an ungranted name: %d", status)
	}
	// The forged report: through the boundary, to the node's own path.
	d, _ := proxy.SOCKS5("unix", o.socket, nil, proxy.Direct)
	c := &http.Client{Transport: &http.Transport{DialContext: d.(proxy.ContextDialer).DialContext}, Timeout: 10 * time.Second}
	forged := `{"rows": [{"principal": "forged", "by": "boundary", "what": "dns", "target": "x", "reason": "x", "count": 1, "first": "2026-01-01T00:00:00Z", "last": "2026-01-01T00:00:00Z"}]}`
	resp, err := c.Post("http://mesh.sam.alt"+api.SAMRefusalsPath, "application/json", strings.NewReader(forged))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a report through the boundary: %d, want 403", resp.StatusCode)
	}
	var rows []api.RefusalRow
	testenv.WaitFor(t, 15*time.Second, "the refusals reach the node", func() bool {
		rows = append(rows, node.Refusals().Take().Rows...)
		return len(rows) >= 2
	})
	found := map[string]bool{}
	for _, r := range rows {
		if r.Principal != "agent-a" || r.By != api.RefusedByBoundary {
			t.Errorf("row %+v", r)
		}
		found[r.What+" "+r.Target] = true
	}
	if !found["name secret.example"] || !found["mesh-request POST mesh.sam.alt"+api.SAMRefusalsPath] {
		t.Errorf("rows %+v", rows)
	}
}
