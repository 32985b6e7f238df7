// Package sambenchtest is what the mesh benchmarks' tests share: a stand-in
// for sam-node's agent listener on a Unix socket, and the real boundary in
// front of it with its metrics.
package sambenchtest

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

	"sandstorm/internal/sam/boundary"
	"sandstorm/internal/sam/policy"
)

// What the boundary counts of its mesh flows and refusals.
const (
	AllowedMesh     = `sam_box_flows_total{outcome="allowed",route="mesh"}`
	DeniedExternal  = `sam_box_flows_total{outcome="denied",route="external"}`
	ForwardedToNode = `sam_box_mesh_requests_total{outcome="forwarded"}`
)

// ShortDir is a temporary directory with a path short enough for Unix
// sockets (108 bytes).
func ShortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Node is a real HTTP server on a Unix socket standing in for sam-node's
// agent listener: /v1/models answers a model list, or per mode fails.
type Node struct {
	Socket string
	// principal, if set, must be sent in X-Sam-Principal (else 403).
	principal string
	Hits      atomic.Int64
	Mode      atomic.Int32 // ModeOK, ModeFlaky, ModeFail
	n         atomic.Int64
}

const (
	ModeOK    = iota
	ModeFlaky // every second request answers 500
	ModeFail  // every request answers 500
)

func StartNode(t *testing.T, principal string) *Node {
	t.Helper()
	n := &Node{Socket: filepath.Join(ShortDir(t), "node.sock"), principal: principal}
	ln, err := net.Listen("unix", n.Socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		n.Hits.Add(1)
		if n.principal != "" && r.Header.Get("X-Sam-Principal") != n.principal {
			http.Error(w, "who are you", http.StatusForbidden)
			return
		}
		switch n.Mode.Load() {
		case ModeFlaky:
			if n.n.Add(1)%2 == 0 {
				http.Error(w, "flaky", http.StatusInternalServerError)
				return
			}
		case ModeFail:
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

// The boundary under test is the real one (internal/sam/boundary, as sam-box
// runs it) with its real Prometheus metrics: agent-a may use the mesh and
// nothing else, and the mesh is the test node's Unix socket.
const TestPolicy = `
roles:
  - name: models
    services: ["inference://*"]
bindings:
  - principal: agent-a
    roles: [models]
`

type Box struct {
	Socket     string
	MetricsURL string
}

func StartBoundary(t *testing.T, nodeSocket string) Box {
	t.Helper()
	pol, err := policy.Parse([]byte(TestPolicy))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	socket := filepath.Join(ShortDir(t), "agent.sock")
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
	return Box{Socket: socket, MetricsURL: srv.URL + "/metrics"}
}
