package master

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/metrics"
)

// TestAPIMetricsByRoute: the API's requests are counted by the pattern
// that serves them and their status — a sandbox's ID never becomes a
// label — whether they were let through, refused for their token, or
// matched no route.
func TestAPIMetricsByRoute(t *testing.T) {
	e := fleettest.New(t, fleettest.NewNode())
	reg := prometheus.NewRegistry()
	m := metrics.NewMaster(reg)
	srv := httptest.NewServer(Handler(Config{Store: e.Store, Fleet: e.Fleet, CA: e.CA, Token: token, DataDir: t.TempDir(), Log: e.Log, Metrics: m}))
	t.Cleanup(srv.Close)

	do(t, srv, "GET", "/v1/sandboxes/3f2a9c0d1e7b", "")
	do(t, srv, "GET", "/v1/sandboxes/8d1c5e2f0a4b", "")
	doAs(t, srv, "GET", "/v1/sandboxes/3f2a9c0d1e7b", "", "Bearer wrong")
	do(t, srv, "POST", "/v1/sandboxes/3f2a9c0d1e7b/freeze", "")
	do(t, srv, "GET", "/v1/sandboxes", "")
	do(t, srv, "GET", "/no/such/thing", "")
	if r, err := srv.Client().Get(srv.URL + "/v1/ca"); err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/ca: %v %v", r, err)
	}

	want := `
# HELP sandstorm_api_requests_total Requests to the master's API listener, by route (the pattern that serves it, method included, e.g. "GET /v1/sandboxes/{id}"; "other" when none does) and status code.
# TYPE sandstorm_api_requests_total counter
sandstorm_api_requests_total{code="200",route="GET /v1/ca"} 1
sandstorm_api_requests_total{code="200",route="GET /v1/sandboxes"} 1
sandstorm_api_requests_total{code="401",route="GET /v1/sandboxes/{id}"} 1
sandstorm_api_requests_total{code="404",route="/"} 1
sandstorm_api_requests_total{code="404",route="GET /v1/sandboxes/{id}"} 2
sandstorm_api_requests_total{code="404",route="POST /v1/sandboxes/{id}/{op}"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sandstorm_api_requests_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "sandstorm_api_request_duration_seconds"); n != 5 {
		t.Errorf("%d duration series, want one per route (5)", n)
	}
}
