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

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"sandstorm/internal/sam/fakellm"
	"sandstorm/internal/testenv"
)

// unixClient reaches the agent listener as a boundary does: over the Unix
// socket, naming the principal.
func unixClient(sock, principal string) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("X-Sam-Principal", principal)
		return tr.RoundTrip(r)
	})}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type setup struct {
	dir, config, policy, key, sock, admin string
	llm                                   *fakellm.Server
}

func newSetup(t *testing.T, keyMode os.FileMode) setup {
	dir := t.TempDir()
	s := setup{
		dir:    dir,
		config: filepath.Join(dir, "node.yaml"),
		policy: filepath.Join(dir, "policy.yaml"),
		key:    filepath.Join(dir, "provider.key"),
		sock:   filepath.Join(dir, "node.sock"),
		admin:  testenv.FreeAddr(t),
		llm:    fakellm.Start(t, "m-a"),
	}
	s.llm.RequireKey("sk-cmd-test")
	write := func(path, content string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
	write(s.key, "sk-cmd-test\n", keyMode)
	write(s.config, "providers:\n  - name: fake\n    url: "+s.llm.BaseURL()+"\n    models: [m-a]\n    api_key_file: "+s.key+"\n", 0o644)
	write(s.policy, "roles: [{name: r, services: [\"inference://*\"]}]\nbindings: [{principal: agent-a, roles: [r]}]\n", 0o644)
	return s
}

func (s setup) args() []string {
	return []string{"--config", s.config, "--policy", s.policy, "--listen", "unix://" + s.sock, "--admin-addr", s.admin}
}

func waitHealthy(t *testing.T, admin string, exited <-chan struct{}) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		resp, err := http.Get("http://" + admin + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-exited:
			t.Fatal("sam-node exited before serving")
		case <-deadline:
			t.Fatal("sam-node did not become healthy")
		case <-time.After(20 * time.Millisecond):
		}
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
	for _, want := range []string{"--config", "--policy", "--listen", "--admin-addr", "unix:///run/sam-node.sock", "127.0.0.1:9601",
		"X-Sam-Principal", "<server>__<tool>", "api_key_file", "0600", "mcp_servers", "providers", "/readyz", "/metrics"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestServeInProcess(t *testing.T) {
	s := newSetup(t, 0o600)
	var logs testenv.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := rootCmd()
	cmd.SetErr(&logs)
	cmd.SetArgs(s.args())
	exited := make(chan struct{})
	var runErr error
	go func() { runErr = cmd.ExecuteContext(ctx); close(exited) }()
	waitHealthy(t, s.admin, exited)

	fi, err := os.Stat(s.sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket: %v %v", fi, err)
	}
	c := openai.NewClient(option.WithBaseURL("http://mesh.sam.alt/v1/"), option.WithHTTPClient(unixClient(s.sock, "agent-a")),
		option.WithAPIKey("agent-own"), option.WithMaxRetries(0))
	res, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "m-a", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("over the socket")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Message.Content != "echo: over the socket" {
		t.Fatalf("content %q", res.Choices[0].Message.Content)
	}
	// Admin paths are not on the agent socket.
	resp, err := unixClient(s.sock, "agent-a").Get("http://mesh.sam.alt/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/metrics on the agent socket: %d", resp.StatusCode)
	}
	resp, err = http.Get("http://" + s.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `sam_node_requests_total{code="200",route="chat_completions"} 1`) {
		t.Fatalf("metrics:\n%s", body)
	}

	cancel()
	<-exited
	if runErr != nil {
		t.Fatal(runErr)
	}
	if _, err := os.Stat(s.sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	if strings.Contains(logs.String(), "sk-cmd-test") {
		t.Fatal("the API key is in the log")
	}
	if !strings.Contains(logs.String(), "sam-node: stopped") {
		t.Fatalf("log:\n%s", logs.String())
	}
}

func TestRefusesOpenKeyFile(t *testing.T) {
	s := newSetup(t, 0o644)
	var logs testenv.SyncBuffer
	cmd := rootCmd()
	cmd.SetErr(&logs)
	cmd.SetArgs(s.args())
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "0600") {
		t.Fatalf("started with a 0644 key file: %v", err)
	}
	if _, err := os.Stat(s.sock); !os.IsNotExist(err) {
		t.Fatal("listened before refusing")
	}
}

func TestListenSpecs(t *testing.T) {
	dir := t.TempDir()
	for _, bad := range []string{"/run/x.sock", "unix://relative", "http://127.0.0.1:1", "tcp://", "unix:///" + dir} {
		if ln, err := listenAgent(bad, 0o660); err == nil {
			ln.Close()
			t.Errorf("accepted --listen %q", bad)
		}
	}
	// A stale socket (its server died) is replaced; a live one is not.
	sock := filepath.Join(dir, "s.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	ln, err := listenAgent("unix://"+sock, 0o600)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	if _, err := listenAgent("unix://"+sock, 0o600); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("live socket: %v", err)
	}
	ln.Close()
	ln, err = listenAgent("tcp://127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

// TestSIGTERM runs the real binary and stops it as a service manager does.
func TestSIGTERM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sam-node")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	s := newSetup(t, 0o600)
	var logs testenv.SyncBuffer
	cmd := exec.Command(bin, append(s.args(), "--log-format", "json")...)
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	waitHealthy(t, s.admin, exited)

	resp, err := unixClient(s.sock, "agent-a").Get("http://mesh.sam.alt/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 1 || list.Data[0].ID != "m-a" {
		t.Fatalf("models: %+v", list)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("sam-node did not stop on SIGTERM")
	}
	if waitErr != nil {
		t.Fatalf("exit: %v\n%s", waitErr, logs.String())
	}
	if _, err := os.Stat(s.sock); !os.IsNotExist(err) {
		t.Fatal("socket left behind")
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
	}
}
