package agents

import (
	"compress/gzip"
	"context"
	"encoding/csv"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/bench/sambench/sambenchtest"
)

func TestPercentilesNearestRank(t *testing.T) {
	var hundred []float64
	for i := 100; i >= 1; i-- { // unsorted on purpose
		hundred = append(hundred, float64(i))
	}
	if p := percentiles(hundred); p != (Percentiles{N: 100, P50: 50, P95: 95, P99: 99, Max: 100}) {
		t.Errorf("1..100: %+v", p)
	}
	if hundred[0] != 100 {
		t.Error("percentiles sorted its input in place")
	}
	// With 10 samples p95 and p99 are both the 10th (ceil(9.5), ceil(9.9)).
	if p := percentiles([]float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}); p != (Percentiles{N: 10, P50: 5, P95: 10, P99: 10, Max: 10}) {
		t.Errorf("1..10: %+v", p)
	}
	if p := percentiles(nil); p != (Percentiles{}) {
		t.Errorf("none: %+v", p)
	}
}

func TestSummarizePush(t *testing.T) {
	ok := func(agent, seq int, start, ttfb, total int64) Call {
		return Call{Agent: agent, Seq: seq, StartUs: start, TTFBUs: ttfb, TotalUs: total, Status: 200, Kind: sambench.KindOK}
	}
	names := []string{"a", "b", "c"}
	calls := [][]Call{
		// a: 4 served from 0 to 2,000 µs: 2,000 req/s.
		{ok(0, 0, 0, 100, 500), ok(0, 1, 0, 200, 600), ok(0, 2, 500, 300, 1000), ok(0, 3, 600, 400, 1400)},
		// b: let go late (at 1,000 µs), 2 served by 2,000 µs: 2,000 req/s
		// over its own time, not 1,000 over the push's.
		{ok(1, 0, 1000, 500, 500), ok(1, 1, 1500, 600, 500)},
		// c: one served, one failed; its last ends at 4,000 µs, the push's end.
		{ok(2, 0, 0, 700, 1000), {Agent: 2, Seq: 1, StartUs: 1000, TotalUs: 3000, Kind: "http 503", Status: 503}},
	}
	p, rates := summarizePush(sambench.RouteBoundary, 2, names, calls)
	if p.Route != sambench.RouteBoundary || p.Round != 2 || p.Agents != 3 || p.Requests != 8 || p.OK != 7 || p.Failed != 1 {
		t.Fatalf("counts: %+v", p)
	}
	if len(p.Failures) != 1 || p.Failures["http 503"] != 1 {
		t.Errorf("failures %v", p.Failures)
	}
	if p.WallSeconds != 0.004 || p.PerSecond != 7/0.004 {
		t.Errorf("wall %v s, %v/s; want 0.004 s, 1750/s", p.WallSeconds, p.PerSecond)
	}
	want := []AgentRate{
		{Agent: "a", OK: 4, Seconds: 0.002, PerSecond: 2000},
		{Agent: "b", OK: 2, Seconds: 0.001, PerSecond: 2000},
		{Agent: "c", OK: 1, Failed: 1, Seconds: 0.004, PerSecond: 250},
	}
	for i, w := range want {
		if rates[i] != w {
			t.Errorf("agent %d: %+v, want %+v", i, rates[i], w)
		}
	}
	// Rates 250, 2000, 2000: the median is the 2nd by nearest rank.
	if p.AgentMedian != 2000 || p.AgentMin != 250 || p.AgentMax != 2000 {
		t.Errorf("per agent median %v min %v max %v", p.AgentMedian, p.AgentMin, p.AgentMax)
	}
	// c is starved twice over: below half the median, and a failure.
	if p.Starved != 1 {
		t.Errorf("starved %d, want 1", p.Starved)
	}
	// TTFB of the 7 served, in ms: .1 .2 .3 .4 .5 .6 .7; the failure's
	// 3 ms is in none of them.
	if p.TTFB != (Percentiles{N: 7, P50: 0.4, P95: 0.7, P99: 0.7, Max: 0.7}) {
		t.Errorf("ttfb %+v", p.TTFB)
	}
	if p.Total.N != 7 || p.Total.Max != 1.4 {
		t.Errorf("total %+v", p.Total)
	}

	// An agent that made no request at all has no rate and is starved.
	p, rates = summarizePush(sambench.RouteBaseline, 1, []string{"a", "idle"}, [][]Call{calls[0], nil})
	if rates[1].PerSecond != 0 || p.AgentMin != 0 || p.Starved != 1 || p.Failures != nil {
		t.Errorf("idle agent: %+v %+v", p, rates[1])
	}
}

func TestCheckCounter(t *testing.T) {
	beforeText := `# TYPE sam_node_requests_total counter
sam_node_requests_total{route="models",code="200"} 100
sam_node_requests_total{route="models",code="403"} 1
`
	s, err := sambench.ScrapeOfText(beforeText, `# TYPE sam_node_requests_total counter
sam_node_requests_total{route="models",code="200"} 140
sam_node_requests_total{route="models",code="403"} 2
sam_node_requests_total{route="chat",code="200"} 5
`)
	if err != nil {
		t.Fatal(err)
	}
	if c := checkCounter(s, nodeModelsOK, 40); !c.Agree || c.Delta != 40 || c.Missing {
		t.Errorf("agreeing: %+v", c)
	}
	if c := checkCounter(s, nodeModelsOK, 41); c.Agree || c.Delta != 40 {
		t.Errorf("one request the node did not count: %+v", c)
	}
	// A series first seen after the start counts from 0.
	if c := checkCounter(s, `sam_node_requests_total{route="chat"}`, 5); !c.Agree {
		t.Errorf("new series: %+v", c)
	}
	// Every code of a route, summed.
	if c := checkCounter(s, `sam_node_requests_total{route="models"}`, 41); !c.Agree {
		t.Errorf("summed over codes: %+v", c)
	}
	if c := checkCounter(s, `sam_absent_total`, 0); c.Agree || !c.Missing {
		t.Errorf("absent series agreed: %+v", c)
	}
	if c := checkCounter(nil, nodeModelsOK, 0); c.Agree || !c.Missing {
		t.Errorf("no scrape agreed: %+v", c)
	}
	failed, err := sambench.ScrapeOfText(beforeText, "")
	if err != nil {
		t.Fatal(err)
	}
	if c := checkCounter(failed, nodeModelsOK, 0); c.Agree {
		t.Errorf("a scrape that failed after the push agreed: %+v", c)
	}
}

func TestHostReadings(t *testing.T) {
	if n := parseLoadavgTasks("1.46 2.38 2.20 3/105 14868\n"); n != 105 {
		t.Errorf("tasks %d, want 105", n)
	}
	for _, bad := range []string{"", "1 2 3", "1 2 3 4 5"} {
		if n := parseLoadavgTasks(bad); n != 0 {
			t.Errorf("%q: %d", bad, n)
		}
	}
	busy, total, err := parseProcStat("cpu  100 5 50 1000 20 3 2 1 7 0\ncpu0 1 2 3 4\n")
	if err != nil {
		t.Fatal(err)
	}
	// busy: user+nice+system+irq+softirq+steal = 161 ticks; total adds
	// idle and iowait; guest (7, already in user) is not added again.
	if busy != 1610*time.Millisecond || total != 11810*time.Millisecond {
		t.Errorf("busy %v total %v", busy, total)
	}
	if _, _, err := parseProcStat("intr 1 2 3\n"); err == nil {
		t.Error("a /proc/stat without its cpu line was read")
	}
	// The real files of this machine read.
	if hostTasks() < 1 || kernelTaskLimit() < 1 {
		t.Errorf("tasks %d, limit %d", hostTasks(), kernelTaskLimit())
	}
	r0 := readCPU(map[string]int{"self": os.Getpid()})
	r1 := readCPU(map[string]int{"self": os.Getpid()})
	if d := r1.since(r0); d["machine capacity"] < 0 || d["client"] < 0 {
		t.Errorf("cpu since: %v", d)
	}
}

func TestAgentsConfigValidate(t *testing.T) {
	good := AgentsConfig{NodeBin: "sam-node", Max: 3, Pushers: 2, Requests: 20, InFlight: 2, Rounds: 1, MemoryMiB: 64, Parallel: 4,
		FillFor: time.Minute, Timeout: time.Second, IdleFor: time.Second}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*AgentsConfig){
		"no sam-node":           func(c *AgentsConfig) { c.NodeBin = "" },
		"more pushers than max": func(c *AgentsConfig) { c.Pushers = 4 },
		"no requests":           func(c *AgentsConfig) { c.Requests = 0 },
		"no flight":             func(c *AgentsConfig) { c.InFlight = 0 },
		"too little memory":     func(c *AgentsConfig) { c.MemoryMiB = 8 },
		"no fill time":          func(c *AgentsConfig) { c.FillFor = 0 },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestPushThroughABoundary drives the push the benchmark makes through a
// real boundary (internal/sam/boundary, as sandstormd runs one per sandbox) and
// straight to the node, and checks it against the boundary's own counters:
// every request forwarded, and no flow opened after the warmup (each agent
// keeps its connections).
func TestPushThroughABoundary(t *testing.T) {
	nd := sambenchtest.StartNode(t, "agent-a")
	bx := sambenchtest.StartBoundary(t, nd.Socket)
	const perAgent, inFlight = 15, 2
	var agents []*pushAgent
	for range 2 {
		a, err := boundaryAgent("agent-a", bx.Socket, inFlight)
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	agents = append(agents, baselineAgent("agent-a", nd.Socket, inFlight))
	names := []string{"via-boundary-1", "via-boundary-2", "baseline"}

	sc := sambench.NewScraper(&http.Client{Timeout: 5 * time.Second})
	var before *sambench.Scrape
	readyCalls := 0
	calls, warm := push(context.Background(), agents, perAgent, inFlight, 5*time.Second, func() {
		readyCalls++
		var err error
		if before, err = sc.Before(context.Background(), bx.MetricsURL); err != nil {
			t.Error(err)
		}
	})
	if readyCalls != 1 || before == nil {
		t.Fatalf("ready called %d times", readyCalls)
	}
	sc.After(context.Background(), before)

	w, _ := summarizePush(sambench.RouteBoundary, 1, names, warm)
	if w.Requests != 3*inFlight || w.OK != w.Requests {
		t.Errorf("warmup: %+v", w)
	}
	p, rates := summarizePush(sambench.RouteBoundary, 1, names, calls)
	if p.Requests != 3*perAgent || p.OK != p.Requests || p.Failed != 0 {
		t.Fatalf("push: %+v", p)
	}
	for i, cs := range calls {
		seen := map[int]bool{}
		for _, c := range cs {
			if c.Agent != i || c.Status != 200 || c.TTFBUs <= 0 || c.TTFBUs > c.TotalUs || c.StartUs < 0 {
				t.Errorf("call %+v", c)
			}
			seen[c.Seq] = true
		}
		if len(seen) != perAgent || rates[i].PerSecond <= 0 {
			t.Errorf("agent %d: %d distinct requests, rate %v", i, len(seen), rates[i].PerSecond)
		}
	}
	if c := checkCounter(before, boxForwarded, 2*perAgent); !c.Agree {
		t.Errorf("the boundary forwarded %v, the two agents through it sent %d", c.Delta, 2*perAgent)
	}
	if c := checkCounter(before, sambenchtest.AllowedMesh, 0); !c.Agree {
		t.Errorf("%v mesh flows opened during the push: the agents did not keep theirs", c.Delta)
	}
	if got := nd.Hits.Load(); got != int64(3*(perAgent+inFlight)) {
		t.Errorf("the node answered %d requests, want %d", got, 3*(perAgent+inFlight))
	}

	// The raw samples, as written to the results.
	path := filepath.Join(t.TempDir(), "push.csv.gz")
	if err := writeCalls(path, names, calls); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(zr).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1+3*perAgent || rows[0][0] != "agent" || rows[1][0] != "via-boundary-1" || rows[len(rows)-1][6] != sambench.KindOK {
		t.Errorf("%d rows; first %v, last %v", len(rows), rows[:2], rows[len(rows)-1])
	}
}

func TestPushedOff(t *testing.T) {
	sb := func(name string, tier, transition api.Tier) api.Sandbox {
		return api.Sandbox{Name: name, Tier: tier, Transition: transition}
	}
	// Hot, and being created (detached on its way to hot): none pushed.
	if n, _ := pushedOff([]api.Sandbox{sb("a", api.TierHot, ""), sb("b", api.TierDetached, api.TierHot)}); n != 0 {
		t.Errorf("a fill in progress counted %d pushed off", n)
	}
	n, first := pushedOff([]api.Sandbox{
		sb("a", api.TierHot, ""),
		sb("b", api.TierHot, api.TierSnapshot), // being checkpointed
		sb("c", api.TierSnapshot, ""),          // on disk
		sb("d", api.TierDetached, ""),          // detached under pressure
		sb("e", api.TierDetached, api.TierHot), // still being created
	})
	if n != 3 || first != "b hot→snapshot" {
		t.Errorf("%d pushed off, first %q; want 3, b hot→snapshot", n, first)
	}
	if _, first := pushedOff([]api.Sandbox{sb("c", api.TierSnapshot, "")}); first != "c snapshot" {
		t.Errorf("first %q", first)
	}
}

func TestReachedBoundary(t *testing.T) {
	p := Push{Requests: 400, Failures: map[string]int{"proxy dial: no such socket": 102, "connection reset": 2, "proxy dial: connection refused": 1}}
	if n := p.reachedBoundary(); n != 297 {
		t.Errorf("reached %d, want 297 (400 less the 103 never dialled)", n)
	}
}
