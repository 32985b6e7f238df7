package sambench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/internal/bench/sambench/sambenchtest"
)

const (
	meshURL = "http://mesh.sam.alt/v1/models"
)

// checkPhase checks the invariants every phase keeps: counts add up, every
// request has a sample, and exactly the OK samples are in the distribution.
func checkPhase(t *testing.T, name string, p *Phase, n int) {
	t.Helper()
	if p == nil {
		t.Fatalf("%s: no phase", name)
	}
	if p.Requests != n || len(p.Samples) != n || p.OK+p.Failed != n {
		t.Errorf("%s: requests %d, samples %d, ok %d + failed %d; want %d", name, p.Requests, len(p.Samples), p.OK, p.Failed, n)
	}
	failures := 0
	for _, c := range p.Failures {
		failures += c
	}
	if failures != p.Failed {
		t.Errorf("%s: failures by kind %v add up to %d, failed %d", name, p.Failures, failures, p.Failed)
	}
	okSamples := 0
	seqs := map[int]bool{}
	for _, s := range p.Samples {
		seqs[s.Seq] = true
		if s.OK {
			okSamples++
		}
		if s.TotalUs < 0 || s.Kind == "" {
			t.Errorf("%s: bad sample %+v", name, s)
		}
	}
	if len(seqs) != n {
		t.Errorf("%s: %d distinct sequence numbers, want %d", name, len(seqs), n)
	}
	if okSamples != p.OK {
		t.Errorf("%s: %d samples marked ok, OK = %d", name, okSamples, p.OK)
	}
	switch {
	case p.OK == 0 && p.LatencyUs != nil:
		t.Errorf("%s: a distribution with no ok request: %+v", name, p.LatencyUs)
	case p.OK > 0 && (p.LatencyUs == nil || p.LatencyUs.N != p.OK):
		t.Errorf("%s: distribution %+v, want n = %d (ok only)", name, p.LatencyUs, p.OK)
	}
	if l := p.LatencyUs; l != nil && !(l.Min <= l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Errorf("%s: percentiles out of order: %+v", name, l)
	}
	if p.OK > 0 && p.OKPerSecond <= 0 {
		t.Errorf("%s: OKPerSecond = %v", name, p.OKPerSecond)
	}
}

func TestRunThroughBoundaryReusedFlows(t *testing.T) {
	// The node answers only agent-a: the identity the boundary sets, not
	// the one the client sends.
	nd := sambenchtest.StartNode(t, "agent-a")
	bx := sambenchtest.StartBoundary(t, nd.Socket)
	const n, c, warm = 40, 3, 6
	obs, err := Run(context.Background(), Config{
		Socket:      bx.Socket,
		Target:      meshURL,
		Requests:    n,
		Concurrency: c,
		Warmup:      warm,
		Headers:     []Header{{"X-Sam-Principal", "agent-b"}},
		Scrape:      []string{bx.MetricsURL},
		RSSPids:     []int{os.Getpid()},
		Labels:      map[string]string{"step": "1"},
	}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "main", obs.Main, n)
	checkPhase(t, "warmup", obs.Warmup, warm)
	if obs.Main.OK != n || obs.Warmup.OK != warm {
		t.Fatalf("ok: main %d/%d, warmup %d/%d; failures %v %v (%s)", obs.Main.OK, n, obs.Warmup.OK, warm,
			obs.Main.Failures, obs.Warmup.Failures, obs.Main.Samples[0].Error)
	}
	if got := nd.Hits.Load(); got != n+warm {
		t.Errorf("node served %d requests, want %d", got, n+warm)
	}
	if obs.Route != RouteBoundary || obs.Flow != FlowReused || obs.Mode != ModeAllow || obs.Label != "step=1" {
		t.Errorf("route %q flow %q mode %q label %q", obs.Route, obs.Flow, obs.Mode, obs.Label)
	}
	s := obs.Main.Samples[0]
	if s.Status != 200 || s.Bytes == 0 || s.TTFBUs <= 0 || s.TTFBUs > s.TotalUs {
		t.Errorf("sample %+v", s)
	}
	if obs.Main.TTFBUs == nil || obs.Main.TTFBUs.N != n {
		t.Errorf("ttfb distribution %+v", obs.Main.TTFBUs)
	}
	// Flows were reused: far fewer flows than requests, on either side;
	// and the boundary forwarded exactly the requests made.
	if len(obs.Scrapes) != 1 || obs.Scrapes[0].Error != "" {
		t.Fatalf("scrapes %+v", obs.Scrapes)
	}
	d := obs.Scrapes[0].Deltas
	if got := d[sambenchtest.AllowedMesh]; got >= n/2 {
		t.Errorf("reused flows: the boundary saw %v new flows for %d requests", got, n)
	}
	if obs.Main.Flows >= n/2 || obs.Warmup.Flows < 1 {
		t.Errorf("reused flows: the client opened %d flows for %d requests (warmup %d)", obs.Main.Flows, n, obs.Warmup.Flows)
	}
	if got := d[sambenchtest.ForwardedToNode]; got != n {
		t.Errorf("the boundary forwarded %v requests, want %d", got, n)
	}
	for k := range d {
		if !strings.HasPrefix(k, "sam_") {
			t.Errorf("non-sam_ metric recorded: %s", k)
		}
	}
	if _, ok := obs.Scrapes[0].GaugesAfter["sam_box_active_flows"]; !ok {
		t.Errorf("gauge not recorded: %+v", obs.Scrapes[0].GaugesAfter)
	}
	if obs.Derived.AdmissionCount == nil || *obs.Derived.AdmissionCount != d["sam_box_admission_seconds_count"] {
		t.Errorf("admission count %v, deltas %v", obs.Derived.AdmissionCount, d)
	}
	if obs.Derived.BoundaryRefusals == nil || *obs.Derived.BoundaryRefusals != 0 {
		t.Errorf("boundary refusals %v", obs.Derived.BoundaryRefusals)
	}
	// The machine, commit and every parameter are recorded.
	if obs.Machine.Cores == 0 || obs.Machine.GoVersion == "" || obs.Started.IsZero() || obs.Finished.Before(obs.Started) {
		t.Errorf("machine %+v, started %v finished %v", obs.Machine, obs.Started, obs.Finished)
	}
	if obs.Source.Commit == "" && obs.Source.Error == "" {
		t.Errorf("source neither read nor explained: %+v", obs.Source)
	}
	if p := obs.Params; p.Requests != n || p.Concurrency != c || p.Warmup != warm || p.Socket != bx.Socket || p.Target != meshURL || len(p.Scrape) != 1 {
		t.Errorf("params %+v", obs.Params)
	}
	if len(obs.Processes) != 1 || obs.Processes[0].RSSKiB <= 0 || obs.Processes[0].FDs <= 0 || obs.Processes[0].Threads <= 0 {
		t.Errorf("processes %+v", obs.Processes)
	}
	if len(obs.ProcessesBefore) != 1 {
		t.Errorf("processes before %+v", obs.ProcessesBefore)
	}
}

func TestRunThroughBoundaryNewFlowPerRequest(t *testing.T) {
	nd := sambenchtest.StartNode(t, "agent-a")
	bx := sambenchtest.StartBoundary(t, nd.Socket)
	const n = 30
	obs, err := Run(context.Background(), Config{
		Socket: bx.Socket, Target: meshURL, Requests: n, Concurrency: 2, Warmup: 2, NewFlow: true,
		Scrape: []string{bx.MetricsURL},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "main", obs.Main, n)
	if obs.Main.OK != n || obs.Flow != FlowNew {
		t.Fatalf("ok %d, flow %s, failures %v", obs.Main.OK, obs.Flow, obs.Main.Failures)
	}
	// One flow, one handshake, one admission per request: the boundary's
	// counters agree with the client's exactly.
	if got := obs.Scrapes[0].Deltas[sambenchtest.AllowedMesh]; got != n || obs.Main.Flows != n {
		t.Errorf("new flows in the main phase: boundary %v, client %d, want %d", got, obs.Main.Flows, n)
	}
	dv := obs.Derived
	if dv.AdmissionCount == nil || *dv.AdmissionCount != n || dv.AdmissionMeanUs == nil || *dv.AdmissionMeanUs <= 0 {
		t.Errorf("admission from the boundary's histogram: %+v", dv)
	}
}

func TestRunBaselineUnixSocket(t *testing.T) {
	nd := sambenchtest.StartNode(t, "agent-a")
	const n = 25
	obs, err := Run(context.Background(), Config{
		TargetUnix: nd.Socket, Target: "http://localhost/v1/models", Requests: n, Concurrency: 4, Warmup: 3,
		Headers: []Header{{"X-Sam-Principal", "agent-a"}, {"Authorization", "Bearer secret"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "main", obs.Main, n)
	checkPhase(t, "warmup", obs.Warmup, 3)
	if obs.Main.OK != n || obs.Warmup.OK != 3 || obs.Route != RouteBaseline {
		t.Errorf("ok %d route %s failures %v", obs.Main.OK, obs.Route, obs.Main.Failures)
	}
	if got := nd.Hits.Load(); got != n+3 {
		t.Errorf("node hits %d", got)
	}
	// Reused: far fewer connections than requests. Zero new ones is
	// possible too, when the warmup's connections are all the workers need.
	if obs.Main.Flows >= n/2 {
		t.Errorf("baseline reused connections: %d new ones for %d requests", obs.Main.Flows, n)
	}
	if h := obs.Params.Headers; len(h) != 2 || h[0].Value != "agent-a" || h[1].Value != "<redacted>" {
		t.Errorf("recorded headers %+v", h)
	}
	// Without the header the node refuses (403): failures, and nothing in
	// the distribution.
	obs, err = Run(context.Background(), Config{TargetUnix: nd.Socket, Target: "http://localhost/v1/models", Requests: 5, Concurrency: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "no principal", obs.Main, 5)
	if obs.Main.Failures["http 403"] != 5 {
		t.Errorf("failures %v", obs.Main.Failures)
	}
}

func TestFailuresStayOutOfTheDistribution(t *testing.T) {
	nd := sambenchtest.StartNode(t, "agent-a")
	bx := sambenchtest.StartBoundary(t, nd.Socket)
	nd.Mode.Store(sambenchtest.ModeFlaky)
	const n = 40
	obs, err := Run(context.Background(), Config{Socket: bx.Socket, Target: meshURL, Requests: n, Concurrency: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "flaky", obs.Main, n)
	if obs.Main.OK != n/2 || obs.Main.Failures["http 500"] != n/2 || obs.Main.LatencyUs.N != n/2 {
		t.Errorf("ok %d, failures %v, distribution %+v", obs.Main.OK, obs.Main.Failures, obs.Main.LatencyUs)
	}
	for _, s := range obs.Main.Samples {
		if (s.Status == 500) == s.OK || (s.Status == 500 && s.Kind != "http 500") {
			t.Errorf("sample %+v", s)
		}
	}

	nd.Mode.Store(sambenchtest.ModeFail)
	obs, err = Run(context.Background(), Config{Socket: bx.Socket, Target: meshURL, Requests: 10, Concurrency: 2, Warmup: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "fail", obs.Main, 10)
	if obs.Main.OK != 0 || obs.Main.Failures["http 500"] != 10 || obs.Main.LatencyUs != nil || obs.Main.TTFBUs != nil || obs.Warmup.Failures["http 500"] != 2 {
		t.Errorf("all-500: %+v", obs.Main)
	}

	// Transport failures are counted by class: a flow policy refused, a
	// boundary socket that is not there, a node socket that is not there.
	obs, err = Run(context.Background(), Config{Socket: bx.Socket, Target: "http://forbidden.example/", Requests: 5, Concurrency: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "refused", obs.Main, 5)
	if obs.Main.Failures[KindRefusedPrefix+"socks "+socksNotAllowed] != 5 || obs.Main.Refused != 5 {
		t.Errorf("refused flows in an allow run: %+v", obs.Main.Failures)
	}
	obs, err = Run(context.Background(), Config{Socket: filepath.Join(sambenchtest.ShortDir(t), "absent.sock"), Target: meshURL, Requests: 3, Concurrency: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "no socket", obs.Main, 3)
	if obs.Main.Failures["proxy dial: no such socket"] != 3 {
		t.Errorf("missing socket: %v (%s)", obs.Main.Failures, obs.Main.Samples[0].Error)
	}
	obs, err = Run(context.Background(), Config{TargetUnix: filepath.Join(sambenchtest.ShortDir(t), "absent.sock"), Target: meshURL, Requests: 2, Concurrency: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if obs.Main.Failures["dial: no such socket"] != 2 {
		t.Errorf("missing node socket: %v (%s)", obs.Main.Failures, obs.Main.Samples[0].Error)
	}
}

func TestExpectDenyCountsRefusals(t *testing.T) {
	nd := sambenchtest.StartNode(t, "agent-a")
	bx := sambenchtest.StartBoundary(t, nd.Socket)
	const n = 50
	obs, err := Run(context.Background(), Config{
		Socket: bx.Socket, Target: "http://forbidden.example/", Requests: n, Concurrency: 4, Warmup: 5, ExpectDeny: true,
		Scrape: []string{bx.MetricsURL},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "deny", obs.Main, n)
	m := obs.Main
	if obs.Mode != ModeDeny || m.OK != n || m.Refused != n || m.Leaked != 0 || m.Failed != 0 {
		t.Fatalf("deny run: ok %d refused %d leaked %d failures %v (%s)", m.OK, m.Refused, m.Leaked, m.Failures, m.Samples[0].Error)
	}
	if m.OKPerSecond <= 0 || m.LatencyUs == nil || m.LatencyUs.N != n || m.TTFBUs != nil {
		t.Errorf("refusal rate %v, refusal latency %+v, ttfb %+v", m.OKPerSecond, m.LatencyUs, m.TTFBUs)
	}
	if obs.Warmup.Refused != 5 {
		t.Errorf("warmup refused %d", obs.Warmup.Refused)
	}
	// The boundary's own counters agree with the client on the number
	// refused in the main phase (the warmup's are not in it).
	if obs.Derived.BoundaryRefusals == nil || *obs.Derived.BoundaryRefusals != n {
		t.Errorf("the boundary counted %v refusals, the client %d", obs.Derived.BoundaryRefusals, n)
	}
	if got := obs.Scrapes[0].Deltas[sambenchtest.DeniedExternal]; got != n {
		t.Errorf("denied external flows %v, want %d", got, n)
	}

	// A path agents may not use, through the mesh entrypoint: a 403 from
	// the boundary, counted as a refusal on both sides.
	obs, err = Run(context.Background(), Config{
		Socket: bx.Socket, Target: "http://mesh.sam.alt/metrics", Requests: 10, Concurrency: 2,
		ExpectDeny: true, Scrape: []string{bx.MetricsURL},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "admin path", obs.Main, 10)
	if obs.Main.OK != 10 || obs.Main.Refused != 10 || obs.Main.Samples[0].Kind != "refused: http 403" {
		t.Errorf("admin path: %+v", obs.Main.Failures)
	}
	if obs.Derived.BoundaryRefusals == nil || *obs.Derived.BoundaryRefusals != 10 {
		t.Errorf("admin path: the boundary counted %v refusals", obs.Derived.BoundaryRefusals)
	}
	if got := nd.Hits.Load(); got != 0 {
		t.Errorf("refused requests reached the node %d times", got)
	}

	// Expecting a refusal where policy allows: every request is a leak.
	obs, err = Run(context.Background(), Config{Socket: bx.Socket, Target: meshURL, Requests: 6, Concurrency: 2, ExpectDeny: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, "leak", obs.Main, 6)
	if obs.Main.Leaked != 6 || obs.Main.OK != 0 || obs.Main.Failures[KindLeaked] != 6 || obs.Main.LatencyUs != nil {
		t.Errorf("leaks: %+v", obs.Main)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{
		{Target: meshURL, Requests: 1, Concurrency: 1},
		{Socket: "a", TargetUnix: "b", Target: meshURL, Requests: 1, Concurrency: 1},
		{Socket: "a", Requests: 1, Concurrency: 1},
		{Socket: "a", Target: "ftp://x/", Requests: 1, Concurrency: 1},
		{Socket: "a", Target: meshURL, Requests: 0, Concurrency: 1},
		{Socket: "a", Target: meshURL, Requests: 1, Concurrency: 0},
		{Socket: "a", Target: meshURL, Requests: 1, Concurrency: 1, Warmup: -1},
		{Socket: "a", Target: meshURL, Requests: 1, Concurrency: 1, RefusalMetric: "bad metric{"},
		{Socket: "a", Target: meshURL, Requests: 1, Concurrency: 1, Labels: map[string]string{"a,b": "c"}},
	} {
		if _, err := Run(context.Background(), c, nil); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	// A metrics endpoint that cannot be read stops the run before it
	// starts (port 1 on loopback: nothing listens there).
	nd := sambenchtest.StartNode(t, "")
	_, err := Run(context.Background(), Config{TargetUnix: nd.Socket, Target: meshURL, Requests: 1, Concurrency: 1, Scrape: []string{"http://127.0.0.1:1/metrics"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "before the run") {
		t.Errorf("unreachable scrape: %v", err)
	}
	if nd.Hits.Load() != 0 {
		t.Errorf("requests issued despite the failed scrape")
	}
}

func TestParseMetricsAndSelectors(t *testing.T) {
	text := `# TYPE sam_box_flows_total counter
sam_box_flows_total{route="mesh",outcome="allowed"} 7
sam_box_flows_total{route="external",outcome="denied"} 3
sam_box_flows_total{route="mesh",outcome="denied"} 2
# TYPE sam_box_admission_seconds histogram
sam_box_admission_seconds_bucket{le="+Inf"} 10
sam_box_admission_seconds_sum 0.0002
sam_box_admission_seconds_count 10
# TYPE sam_x_summary summary
sam_x_summary{quantile="0.5"} 1
sam_x_summary_sum 4
sam_x_summary_count 2
# TYPE sam_box_active_flows gauge
sam_box_active_flows 2
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1e+07
`
	pts, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		`sam_box_flows_total{outcome="allowed",route="mesh"}`:    7,
		`sam_box_flows_total{outcome="denied",route="external"}`: 3,
		`sam_box_flows_total{outcome="denied",route="mesh"}`:     2,
		"sam_box_admission_seconds_sum":                          0.0002,
		"sam_box_admission_seconds_count":                        10,
		"sam_x_summary_sum":                                      4,
		"sam_x_summary_count":                                    2,
		"sam_box_active_flows":                                   2,
	}
	if len(pts) != len(want) {
		t.Errorf("parsed %d series, want %d: %v", len(pts), len(want), pts)
	}
	for k, v := range want {
		if p, ok := pts[k]; !ok || p.value != v {
			t.Errorf("%s = %+v, want %v", k, p, v)
		}
	}
	if pts["sam_box_active_flows"].counter || !pts["sam_x_summary_count"].counter {
		t.Errorf("counter/gauge classification wrong")
	}

	before := map[string]point{}
	for k, p := range pts {
		p.value = 0
		before[k] = p
	}
	scr := []*Scrape{{before: before, after: pts}}
	d := derive(scr, "sam_box_admission_seconds", `sam_box_flows_total{outcome="denied"}`)
	if d.AdmissionMeanUs == nil || *d.AdmissionMeanUs < 19.99 || *d.AdmissionMeanUs > 20.01 || *d.AdmissionCount != 10 {
		t.Errorf("admission %+v", d)
	}
	if d.BoundaryRefusals == nil || *d.BoundaryRefusals != 5 {
		t.Errorf("refusals over both routes = %v, want 5", d.BoundaryRefusals)
	}
	d = derive(scr, "absent_metric", `sam_box_flows_total{outcome="denied",route="mesh"}`)
	if d.AdmissionMeanUs != nil || d.AdmissionCount != nil || *d.BoundaryRefusals != 2 {
		t.Errorf("derive with absent metric: %+v", d)
	}
	if d := derive(scr, "", "sam_absent_total"); d.BoundaryRefusals != nil {
		t.Errorf("absent refusal metric gave %v", *d.BoundaryRefusals)
	}

	for _, bad := range []string{"", "1abc", `x{a=b}`, `x{a="b"`, `x{="b"}`} {
		if _, err := parseSelector(bad); err == nil {
			t.Errorf("selector %q accepted", bad)
		}
	}
	if sel, err := parseSelector(`x{ a = "b\"c", d="" }`); err != nil || sel.labels["a"] != `b"c` || len(sel.labels) != 2 {
		t.Errorf("selector: %+v, %v", sel, err)
	}
}

func TestProcs(t *testing.T) {
	rss, threads := parseStatus("Name:\tsam-box\nVmRSS:\t   18432 kB\nThreads:\t9\n")
	if rss != 18432 || threads != 9 {
		t.Errorf("parseStatus = %d, %d", rss, threads)
	}
	p := ReadProc(os.Getpid())
	if p.RSSKiB <= 0 || p.FDs <= 0 || p.Threads <= 0 || p.Error != "" {
		t.Errorf("ReadProc(self) = %+v", p)
	}
	if p := ReadProc(1 << 30); p.Error == "" {
		t.Errorf("ReadProc of no process: %+v", p)
	}
	if _, err := findProcs(nil, "no-such-process-name-here"); err == nil {
		t.Errorf("findProcs found a process that does not exist")
	}
}
