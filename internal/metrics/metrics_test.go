package metrics

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestNodeCounters: each call moves its own series by one and no other;
// every series of the closed sets is there at zero before anything
// happened; a failed or refused wake is no wake time; TransitionsTo reads
// the counters, ok transitions only, summed by the tier reached.
func TestNodeCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewNode(reg)
	if n := testutil.CollectAndCount(m.transitions); n != len(Moves)*3 {
		t.Errorf("%d transition series up front, want %d (every move × outcome)", n, len(Moves)*3)
	}
	if n := testutil.CollectAndCount(m.runscFails); n != len(RunscVerbs) {
		t.Errorf("%d runsc failure series up front, want %d", n, len(RunscVerbs))
	}
	m.Transition(Hot, Frozen, OK)
	m.Transition(Frozen, Snapshot, OK)
	m.Transition(Hot, Snapshot, Failed)
	m.Wake(Frozen, OK, 12*time.Millisecond)
	m.Wake(Snapshot, OK, 200*time.Millisecond)
	m.Wake(Snapshot, Refused, time.Second)
	m.Wake(Detached, Failed, time.Second)
	m.Create("cold", OK)
	m.Create("pooled", Refused)
	m.Refusal(ReasonMemory, "create")
	m.Delete()
	m.Runsc("checkpoint", 300*time.Millisecond, nil)
	m.Runsc("checkpoint", 40*time.Second, errors.New("timed out"))

	for _, c := range []struct {
		what string
		got  float64
		want float64
	}{
		{"hot→frozen ok", testutil.ToFloat64(m.transitions.WithLabelValues(Hot, Frozen, OK)), 1},
		{"hot→snapshot failed", testutil.ToFloat64(m.transitions.WithLabelValues(Hot, Snapshot, Failed)), 1},
		{"hot→snapshot ok", testutil.ToFloat64(m.transitions.WithLabelValues(Hot, Snapshot, OK)), 0},
		{"snapshot→hot ok", testutil.ToFloat64(m.transitions.WithLabelValues(Snapshot, Hot, OK)), 1},
		{"snapshot→hot refused", testutil.ToFloat64(m.transitions.WithLabelValues(Snapshot, Hot, Refused)), 1},
		{"detached→hot failed", testutil.ToFloat64(m.transitions.WithLabelValues(Detached, Hot, Failed)), 1},
		{"cold creates ok", testutil.ToFloat64(m.creates.WithLabelValues("cold", OK)), 1},
		{"pooled creates refused", testutil.ToFloat64(m.creates.WithLabelValues("pooled", Refused)), 1},
		{"memory refusals of creates", testutil.ToFloat64(m.refusals.WithLabelValues(ReasonMemory, "create")), 1},
		{"deletes", testutil.ToFloat64(m.deletes), 1},
		{"checkpoint failures", testutil.ToFloat64(m.runscFails.WithLabelValues("checkpoint")), 1},
		{"run failures", testutil.ToFloat64(m.runscFails.WithLabelValues("run")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// Only the two successful wakes were timed, each under its own tier.
	wakes := `
# HELP sandstorm_wake_duration_seconds Time of a successful wake to hot on the node (the resume, restore or cold start), by the tier it woke from.
# TYPE sandstorm_wake_duration_seconds histogram
` + wakeSeries(Detached, "", "0") + wakeSeries(Frozen, "0.025", "0.012") + wakeSeries(Snapshot, "0.25", "0.2")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wakes), "sandstorm_wake_duration_seconds"); err != nil {
		t.Error(err)
	}
	got := m.TransitionsTo()
	want := map[string]uint64{Hot: 2, Frozen: 1, Snapshot: 1, Detached: 0}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("TransitionsTo = %v, want %v", got, want)
			break
		}
	}
	var none *Node // a node without metrics
	none.Transition(Hot, Frozen, OK)
	none.Runsc("run", time.Second, nil)
	if none.TransitionsTo() != nil {
		t.Error("a nil *Node reports transitions")
	}
}

// TestNodeCollector: a scrape sends what the node's state says, every tier
// of each template (zero included), and leaves out what could not be
// read instead of sending zero — and counts the scrape's error.
func TestNodeCollector(t *testing.T) {
	state := NodeState{
		Sandboxes: map[[2]string]int{{Hot, "web"}: 2, {Snapshot, "web"}: 1, {Frozen, "gone"}: 1},
		Templates: []string{"web", "app"}, Pooled: map[string]int{"app": 3},
		MemAvailable: 3 << 30, MemReserve: 256 << 20, Promised: 512 << 20, Headroom: 3<<30 - 256<<20 - 512<<20,
		DiskFree: 10 << 30, DiskReserve: 1 << 30, Conns: 5, InFlight: 2, Wakes: 1, Starts: 0,
	}
	var fail error
	c := NodeCollector(func() (NodeState, error) { s := state; s.Sandboxes = clone(state.Sandboxes); return s, fail })
	want := `
# HELP sandstorm_sandboxes Sandboxes on this node, by tier and template.
# TYPE sandstorm_sandboxes gauge
sandstorm_sandboxes{template="app",tier="detached"} 0
sandstorm_sandboxes{template="app",tier="frozen"} 0
sandstorm_sandboxes{template="app",tier="hot"} 0
sandstorm_sandboxes{template="app",tier="snapshot"} 0
sandstorm_sandboxes{template="gone",tier="frozen"} 1
sandstorm_sandboxes{template="web",tier="detached"} 0
sandstorm_sandboxes{template="web",tier="frozen"} 0
sandstorm_sandboxes{template="web",tier="hot"} 2
sandstorm_sandboxes{template="web",tier="snapshot"} 1
# HELP sandstorm_warm_pool_sandboxes Sandboxes in each warm template's pool: restored and paused ahead of demand, not in sandstorm_sandboxes.
# TYPE sandstorm_warm_pool_sandboxes gauge
sandstorm_warm_pool_sandboxes{template="app"} 3
# HELP sandstorm_memory_headroom_bytes Memory a new sandbox may still be admitted into: available − reserve − promised (negative: below the reserve).
# TYPE sandstorm_memory_headroom_bytes gauge
sandstorm_memory_headroom_bytes 2.4159191040e+09
# HELP sandstorm_gateway_requests_in_flight Gateway connections forwarding an HTTP request, or being set up (the sandbox woken, dialled, first bytes not yet seen): what a checkpoint's drain waits for.
# TYPE sandstorm_gateway_requests_in_flight gauge
sandstorm_gateway_requests_in_flight 2
# HELP sandstorm_node_scrape_errors_total Scrapes that could not read part of the node's state (its store, /proc/meminfo, the disk); what could not be read is left out of that scrape.
# TYPE sandstorm_node_scrape_errors_total counter
sandstorm_node_scrape_errors_total 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "sandstorm_sandboxes", "sandstorm_warm_pool_sandboxes",
		"sandstorm_memory_headroom_bytes", "sandstorm_gateway_requests_in_flight", "sandstorm_node_scrape_errors_total"); err != nil {
		t.Error(err)
	}
	// /proc/meminfo and the store unreadable: no memory, headroom or
	// sandbox series (not zeros), the rest as before, the error counted.
	fail = errors.New("meminfo: permission denied")
	state.MemAvailable, state.Sandboxes = -1, nil
	if n := testutil.CollectAndCount(c, "sandstorm_memory_available_bytes", "sandstorm_memory_headroom_bytes", "sandstorm_sandboxes"); n != 0 {
		t.Errorf("%d memory and sandbox series sent with neither read, want none", n)
	}
	if n := testutil.CollectAndCount(c, "sandstorm_disk_free_bytes", "sandstorm_gateway_connections"); n != 2 {
		t.Errorf("%d disk and gateway series, want both", n)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP sandstorm_node_scrape_errors_total Scrapes that could not read part of the node's state (its store, /proc/meminfo, the disk); what could not be read is left out of that scrape.
# TYPE sandstorm_node_scrape_errors_total counter
sandstorm_node_scrape_errors_total 3
`), "sandstorm_node_scrape_errors_total"); err != nil {
		t.Error(err) // three scrapes failed: the two counts above and this one
	}
}

// wakeLes are the wake histogram's bucket bounds as the text format
// writes them, spelled out here so that a change to WakeBuckets shows.
var wakeLes = []string{"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "+Inf"}

// wakeSeries is the expected text of the wake histogram from one tier
// after at most one wake: every bucket from le on counts it (le "": no
// wake), and sum is its time.
func wakeSeries(from, le, sum string) string {
	var b strings.Builder
	n := 0
	for _, l := range wakeLes {
		if l == le {
			n = 1
		}
		fmt.Fprintf(&b, "sandstorm_wake_duration_seconds_bucket{from=%q,le=%q} %d\n", from, l, n)
	}
	fmt.Fprintf(&b, "sandstorm_wake_duration_seconds_sum{from=%q} %s\n", from, sum)
	fmt.Fprintf(&b, "sandstorm_wake_duration_seconds_count{from=%q} %d\n", from, n)
	return b.String()
}

func clone(m map[[2]string]int) map[[2]string]int {
	if m == nil {
		return nil
	}
	out := map[[2]string]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestNodeHealthCollector: up is 1 unless lost; the report age is sent
// only for a node heard from, and is the time since.
func TestNodeHealthCollector(t *testing.T) {
	heard := time.Now().Add(-1500 * time.Millisecond)
	c := NodeHealthCollector(func() []NodeHealth {
		return []NodeHealth{{Name: "local"}, {Name: "n1", LastReport: heard}, {Name: "n2", Lost: true, LastReport: heard.Add(-time.Minute)}, {Name: "n3", Lost: true}}
	})
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP sandstorm_master_node_up 1 if the master hears the node (its report stream open, a report within the last 3 s; the node in the master's own process too, over a stream in the process), 0 if it is lost.
# TYPE sandstorm_master_node_up gauge
sandstorm_master_node_up{node="local"} 1
sandstorm_master_node_up{node="n1"} 1
sandstorm_master_node_up{node="n2"} 0
sandstorm_master_node_up{node="n3"} 0
`), "sandstorm_master_node_up"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "sandstorm_master_node_report_age_seconds"); n != 2 {
		t.Errorf("%d report ages, want 2 (n1, n2: the others were never heard)", n)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sandstorm_master_node_report_age_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			age := m.GetGauge().GetValue()
			if m.GetLabel()[0].GetValue() == "n1" && (age < 1.5 || age > 10) {
				t.Errorf("n1's report age %v s, want about 1.5", age)
			}
		}
	}
}

// TestListenServesOnlyMetrics: the listener answers /metrics with the
// registry's text and nothing else.
func TestListenServesOnlyMetrics(t *testing.T) {
	reg := NewRegistry()
	NewNode(reg).Create("cold", OK)
	srv, addr, err := Listen("127.0.0.1:0", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, `sandstorm_creates_total{outcome="ok",start="cold"} 1`) || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics: %d %.300s", code, body)
	}
	for _, p := range []string{"/", "/debug/pprof/", "/metrics/x"} {
		if code, _ := get(p); code != http.StatusNotFound {
			t.Errorf("%s: HTTP %d, want 404", p, code)
		}
	}
	if _, _, err := Listen(addr.String(), reg, nil); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("a second listener on the same address: %v", err)
	}
}

// TestInstrumentCountsCutAnswers: a request whose client left mid-answer
// (ReverseProxy panics with http.ErrAbortHandler) is counted with the
// status it was answered, and the panic still reaches net/http (which
// drops the connection); any other panic passes unchanged.
func TestInstrumentCountsCutAnswers(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMaster(reg)
	var raise any = http.ErrAbortHandler
	h := m.Instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		panic(raise)
	}), func(*http.Request) string { return "GET /e2b/traffic" })
	serve := func() (p any) {
		defer func() { p = recover() }()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil))
		return nil
	}
	if p := serve(); p != http.ErrAbortHandler {
		t.Errorf("the panic that reached net/http: %v, want http.ErrAbortHandler", p)
	}
	want := `
# HELP sandstorm_api_requests_total Requests to the master's API listener, by route (the pattern that serves it, method included, e.g. "GET /v1/sandboxes/{id}"; "other" when none does) and status code.
# TYPE sandstorm_api_requests_total counter
sandstorm_api_requests_total{code="200",route="GET /e2b/traffic"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sandstorm_api_requests_total"); err != nil {
		t.Error(err)
	}
	raise = "a bug"
	if p := serve(); p != "a bug" {
		t.Errorf("another panic: %v, want it unchanged", p)
	}
}
