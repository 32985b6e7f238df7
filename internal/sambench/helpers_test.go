package sambench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sandstorm/internal/boundary"
	"sandstorm/internal/policy"
)

// shortDir is a temporary directory with a path short enough for Unix
// sockets (108 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// node is a real HTTP server on a Unix socket standing in for sam-node's
// agent listener: /v1/models answers a model list, or per mode fails.
type node struct {
	socket string
	// principal, if set, must be sent in X-Sam-Principal (else 403).
	principal string
	hits      atomic.Int64
	mode      atomic.Int32 // modeOK, modeFlaky, modeFail
	n         atomic.Int64
}

const (
	modeOK    = iota
	modeFlaky // every second request answers 500
	modeFail  // every request answers 500
)

func startNode(t *testing.T, principal string) *node {
	t.Helper()
	n := &node{socket: filepath.Join(shortDir(t), "node.sock"), principal: principal}
	ln, err := net.Listen("unix", n.socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		n.hits.Add(1)
		if n.principal != "" && r.Header.Get("X-Sam-Principal") != n.principal {
			http.Error(w, "who are you", http.StatusForbidden)
			return
		}
		switch n.mode.Load() {
		case modeFlaky:
			if n.n.Add(1)%2 == 0 {
				http.Error(w, "flaky", http.StatusInternalServerError)
				return
			}
		case modeFail:
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"test/model","object":"model","owned_by":"test"}]}`)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return n
}

// The boundary under test is the real one (internal/boundary, as sam-box
// runs it) with its real Prometheus metrics: agent-a may use the mesh and
// nothing else, and the mesh is the test node's Unix socket.
const testPolicy = `
roles:
  - name: models
    services: ["inference://*"]
bindings:
  - principal: agent-a
    roles: [models]
`

type box struct {
	socket     string
	metricsURL string
}

func startBoundary(t *testing.T, nodeSocket string) box {
	t.Helper()
	pol, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	socket := filepath.Join(shortDir(t), "agent.sock")
	b, err := boundary.New(boundary.Config{
		Principal: "agent-a",
		Policy:    func() *policy.Policy { return pol },
		Mesh: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", nodeSocket)
		},
		SocketPath: socket,
		// Nothing external is granted; should the boundary ever try, the
		// attempt fails here and never leaves the machine.
		Resolve: func(context.Context, string) ([]netip.Addr, error) {
			t.Error("the boundary resolved an external name")
			return nil, errors.New("no resolving in tests")
		},
		Dial: func(context.Context, string, string) (net.Conn, error) {
			t.Error("the boundary dialled an external destination")
			return nil, errors.New("no dialling in tests")
		},
		Metrics: boundary.NewMetrics(reg),
		Log:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return box{socket: socket, metricsURL: srv.URL + "/metrics"}
}
