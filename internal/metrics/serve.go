package metrics

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry is a process's registry: the Go runtime's and the process's
// own metrics (go_*, process_*: what every Go daemon exports), to which
// the node, the master and the boundaries add theirs.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Listen serves g's metrics on http://addr/metrics, and nothing else: no
// other path answers (404). It is plain HTTP with no authentication, as
// Prometheus scrapes, so it is off unless asked for (sandstormd serve
// --metrics-addr): give it a loopback or management address. No sandbox
// reaches it on any address: the node's firewall drops every packet from a
// sandbox to the host but those to its own boundary (netns.Firewall;
// TestMetricsUnreachableFromSandbox binds it on 0.0.0.0 and tries).
//
// listen opens the socket (nil: net.Listen): sandstormd's hands it over to
// the next process at a reload (internal/handoff).
func Listen(addr string, g prometheus.Gatherer, listen func(network, addr string) (net.Listener, error)) (srv *http.Server, bound net.Addr, err error) {
	if listen == nil {
		listen = net.Listen
	}
	ln, err := listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	// A collector that fails (the node's store busy) leaves its part out
	// of the scrape; the rest is still served.
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, ln.Addr(), nil
}
