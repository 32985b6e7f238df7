package meshnode

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"sandstorm/internal/testenv"
)

func testLogger(t *testing.T) (*slog.Logger, *testenv.SyncBuffer) {
	buf := &testenv.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// replaceFile writes content to path by rename, as editors do.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, content, 0o644)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startNode builds a node and serves its agent API on a real loopback
// listener, as a boundary would reach it.
func startNode(t *testing.T, cfg Config) (*Node, string) {
	t.Helper()
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(n.Handler())
	t.Cleanup(func() {
		srv.Close()
		n.Close()
	})
	return n, srv.URL
}

// boundary plays the boundary's part: every request carries the
// principal (and optionally a service) header.
type boundary struct {
	principal, service string
	base               http.RoundTripper
}

func (b *boundary) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.principal != "" {
		r.Header.Set(HeaderPrincipal, b.principal)
	}
	if b.service != "" {
		r.Header.Set(HeaderService, b.service)
	}
	return b.base.RoundTrip(r)
}

func agentHTTP(principal string) *http.Client {
	return &http.Client{Transport: &boundary{principal: principal, base: http.DefaultTransport}}
}

func agentOpenAI(url, principal string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(url + "/v1/"),
		option.WithHTTPClient(agentHTTP(principal)),
		option.WithAPIKey("agent-own-key"),
		option.WithMaxRetries(0),
	}, opts...)...)
}

func withService(s string) option.RequestOption { return option.WithHeader(HeaderService, s) }

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func repoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// everythingCommand is argv of @modelcontextprotocol/server-everything
// over stdio, from testdata/mcp. Its absence fails the test: these tests
// are about a real third-party MCP server, and must not pass without one.
func everythingCommand(t testing.TB) []string {
	t.Helper()
	root := repoRoot(t)
	entry := filepath.Join(root, "testdata/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	if _, err := os.Stat(entry); err != nil {
		t.Fatalf("the MCP test server is not installed (%v): run `npm ci --prefix %s`", err, filepath.Join(root, "testdata/mcp"))
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (Node.js) is not on PATH; the MCP test server needs it: %v", err)
	}
	return []string{node, entry, "stdio"}
}

func get(t *testing.T, h http.Handler, path string, header http.Header) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

func scrape(t *testing.T, n *Node) string {
	t.Helper()
	code, body := get(t, n.AdminHandler(), "/metrics", nil)
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	return body
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func hasLine(text, prefix string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
