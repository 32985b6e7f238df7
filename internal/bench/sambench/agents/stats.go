package agents

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"sandstorm/internal/bench"
	"sandstorm/internal/bench/sambench"
)

// The pure half of sam-bench agents: what one push of many agents at once
// (each its own principal, a few requests in flight each) comes to, in the
// figures the SAM seed reports for its thousand-agent run ("What they can
// push"): the aggregate rate and wall time, every agent's own rate (median,
// minimum, maximum: "no principal was starved"), the client's time to
// first byte at p50/p95/p99/max, and the failures by kind.

// Call is one request of one agent in a push. Times are µs; StartUs is
// from the start of the push (the moment every agent was let go).
type Call struct {
	Agent   int    `json:"agent"`
	Seq     int    `json:"i"`
	StartUs int64  `json:"start_us"`
	TTFBUs  int64  `json:"ttfb_us"`
	TotalUs int64  `json:"total_us"`
	Status  int    `json:"status,omitempty"`
	Kind    string `json:"kind"` // sambench.KindOK, or the failure's class
}

// end is when the call's body was read, from the start of the push.
func (c Call) end() int64 { return c.StartUs + c.TotalUs }

// AgentRate is one agent's share of a push.
type AgentRate struct {
	Agent string `json:"agent"`
	OK    int    `json:"ok"`
	// Failed counts its requests that were not served 2xx in full.
	Failed int `json:"failed"`
	// Seconds runs from the start of its first request to the end of its
	// last one: its own wall time, so an agent let go late is not counted
	// slow for it.
	Seconds float64 `json:"seconds"`
	// PerSecond is OK / Seconds.
	PerSecond float64 `json:"per_second"`
}

// Push is what one push came to.
type Push struct {
	// Route is sambench.RouteBoundary (each agent through its own boundary's
	// SOCKS5 socket) or sambench.RouteBaseline (straight to the node's socket).
	Route    string         `json:"route"`
	Round    int            `json:"round"`
	Agents   int            `json:"agents"`
	Requests int            `json:"requests"`
	OK       int            `json:"ok"`
	Failed   int            `json:"failed"`
	Failures map[string]int `json:"failures,omitempty"`
	// WallSeconds runs from the push's start to the end of its last
	// request; PerSecond is OK / WallSeconds.
	WallSeconds float64 `json:"wall_seconds"`
	PerSecond   float64 `json:"per_second"`
	// AgentMedian, AgentMin and AgentMax are over the agents' own rates
	// (req/s), by nearest rank; Starved counts agents that were served
	// nothing, had any request fail, or ran below half the median rate.
	AgentMedian float64 `json:"agent_median_per_second"`
	AgentMin    float64 `json:"agent_min_per_second"`
	AgentMax    float64 `json:"agent_max_per_second"`
	Starved     int     `json:"starved"`
	// TTFB and Total are over the served requests, in ms, nearest rank.
	TTFB  Percentiles `json:"ttfb_ms"`
	Total Percentiles `json:"total_ms"`
	// CPU is what each process spent over the push, in CPU-seconds.
	CPU map[string]float64 `json:"cpu_seconds,omitempty"`
	// Counters are the servers' own counts over the push, against the
	// client's.
	Counters []CounterCheck `json:"counters,omitempty"`
}

// Percentiles are the seed's four (it reports p50, p95, p99 and the
// worst request), by nearest rank.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// percentiles of samples; zero for none.
func percentiles(samples []float64) Percentiles {
	if len(samples) == 0 {
		return Percentiles{}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	at := func(p float64) float64 { return sorted[bench.Rank(len(sorted), p)-1] }
	return Percentiles{N: len(sorted), P50: at(50), P95: at(95), P99: at(99), Max: sorted[len(sorted)-1]}
}

// summarizePush aggregates the calls of a push, calls[i] being agent
// names[i]'s.
func summarizePush(route string, round int, names []string, calls [][]Call) (Push, []AgentRate) {
	p := Push{Route: route, Round: round, Agents: len(names), Failures: map[string]int{}}
	var ttfb, total, rates []float64
	var last int64
	agents := make([]AgentRate, len(names))
	for i, name := range names {
		a := AgentRate{Agent: name}
		first, end := int64(-1), int64(0)
		for _, c := range calls[i] {
			p.Requests++
			if first < 0 || c.StartUs < first {
				first = c.StartUs
			}
			end = max(end, c.end())
			if c.Kind != sambench.KindOK {
				a.Failed++
				p.Failures[c.Kind]++
				continue
			}
			a.OK++
			ttfb = append(ttfb, float64(c.TTFBUs)/1000)
			total = append(total, float64(c.TotalUs)/1000)
		}
		if first >= 0 && end > first {
			a.Seconds = float64(end-first) / 1e6
			a.PerSecond = float64(a.OK) / a.Seconds
		}
		last = max(last, end)
		p.OK += a.OK
		p.Failed += a.Failed
		rates = append(rates, a.PerSecond)
		agents[i] = a
	}
	if len(p.Failures) == 0 {
		p.Failures = nil
	}
	if last > 0 {
		p.WallSeconds = float64(last) / 1e6
		p.PerSecond = float64(p.OK) / p.WallSeconds
	}
	if len(rates) > 0 {
		r := percentiles(rates)
		p.AgentMedian, p.AgentMax = r.P50, r.Max
		p.AgentMin = slices.Min(rates)
		for _, a := range agents {
			if a.OK == 0 || a.Failed > 0 || a.PerSecond < p.AgentMedian/2 {
				p.Starved++
			}
		}
	}
	p.TTFB, p.Total = percentiles(ttfb), percentiles(total)
	return p, agents
}

// reachedBoundary is how many of the push's requests reached a boundary:
// all but those whose boundary's socket could not be dialled (a sandbox
// pushed off memory has its boundary closed; sambench.Classify names those
// "proxy dial: …").
func (p Push) reachedBoundary() int {
	n := p.Requests
	for k, c := range p.Failures {
		if strings.HasPrefix(k, "proxy dial: ") {
			n -= c
		}
	}
	return n
}

// CounterCheck is one server counter's change over a push beside what the
// client counted for it.
type CounterCheck struct {
	// Series names the counter and the labels that select it.
	Series string  `json:"series"`
	Delta  float64 `json:"delta"`
	Client int     `json:"client"`
	Agree  bool    `json:"agree"`
	// Missing: no scrape had such a series (the server counted nothing
	// under that name).
	Missing bool `json:"missing,omitempty"`
}

// checkCounter sums the change of the series sel picks over s and sets it
// beside want, what the client counted.
func checkCounter(s *sambench.Scrape, sel string, want int) CounterCheck {
	c := CounterCheck{Series: sel, Client: want}
	if s == nil {
		c.Missing = true
		return c
	}
	d, found, err := s.Delta(sel)
	if err != nil {
		c.Missing = true
		return c
	}
	c.Delta, c.Missing = d, !found
	c.Agree = found && d == float64(want)
	return c
}

// seedPush is the seed's row ("What they can push"): 200 of 1,000
// resident agents, 200 requests each, two in flight.
var seedPush = []string{"seed (boundary, 1,000 resident)", "1", "200", "40000", "0", "0.43", "≈ 92,000",
	"534 / 490 / 652", "0", "2.0 / 13 / 21 / 98"}

// pushTables renders the pushes: the seed's figures, each push's, the
// boundary against the baseline of the same round, the servers' counters
// against the client's count, and where the CPU went.
func pushTables(pushes, idle []Push, rates map[string][]AgentRate) []*bench.Table {
	if len(pushes) == 0 {
		return nil
	}
	main := &bench.Table{
		Title: "Many agents pushing at once",
		Description: "Every agent its own principal, its own HTTP client with its own kept-alive connections; GET /v1/models answered by sam-node itself. " +
			"boundary: through the agent's own boundary's SOCKS5 socket (agent.sock) in sandstormd; baseline: the same request straight to sam-node's socket with X-Sam-Principal set. " +
			"Per agent: its served requests over its own time, first request's start to last's end; starved: below half the median, or any failure. " +
			"TTFB: the client's time to the first response byte, over every served request, nearest rank.",
		Columns: []string{"route", "round", "agents", "requests", "failed", "wall s", "req/s", "per agent req/s p50 / min / max", "starved", "TTFB ms p50 / p95 / p99 / max"},
		Rows:    append([][]string{seedPush}, pushRows(pushes)...),
		Data:    map[string]any{"pushes": pushes, "agent_rates": rates},
	}
	ratio := &bench.Table{
		Title:       "Through the boundaries against the baseline, same round",
		Description: "boundary ÷ baseline of each round (the two pushes run back to back, their order alternating by round).",
		Columns:     []string{"round", "aggregate req/s", "per agent p50", "TTFB p50", "TTFB p99"},
	}
	byRound := map[int]map[string]Push{}
	for _, p := range pushes {
		if byRound[p.Round] == nil {
			byRound[p.Round] = map[string]Push{}
		}
		byRound[p.Round][p.Route] = p
	}
	div := func(a, b float64) string {
		if b == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	for _, r := range slices.Sorted(maps.Keys(byRound)) {
		b, okB := byRound[r][sambench.RouteBoundary]
		l, okL := byRound[r][sambench.RouteBaseline]
		if okB && okL {
			ratio.Rows = append(ratio.Rows, []string{fmt.Sprint(r), div(b.PerSecond, l.PerSecond), div(b.AgentMedian, l.AgentMedian),
				div(b.TTFB.P50, l.TTFB.P50), div(b.TTFB.P99, l.TTFB.P99)})
		}
	}
	counters := &bench.Table{
		Title: "The servers' own counters against the client's count",
		Description: "Δ over each push (scraped after the warmup, before the push, and after it): sam-node's admin /metrics, and sandstormd's --metrics-addr (its boundaries). " +
			"The client's count beside sam-node's is its served requests; beside the boundaries' forwarded requests, its requests that reached a boundary (all but those whose agent.sock could not be dialled). " +
			"sam_box_flows_total{route=\"mesh\",outcome=\"allowed\"} counts flows opened: 0 means every request rode the flows the warmup opened.",
		Columns: []string{"route", "round", "series", "server Δ", "client", "agree"},
	}
	cpu := &bench.Table{
		Title: "Where the CPU went during each push",
		Description: "CPU-seconds from /proc (utime+stime; the client's from getrusage); rest = the machine's busy time less the three, " +
			"mostly the sandboxes and the kernel; busy = the machine's busy share of cores × wall. The idle rows are --idle-cpu (10 s by default) with no push: " +
			"what the machine spends with no traffic (with the population resident: its idle sandboxes' own CPU, gVisor's and their servers' timers).",
		Columns: []string{"route", "round", "wall s", "client", "sandstormd", "sam-node", "rest", "busy"},
	}
	for _, p := range idle {
		cpu.Rows = append(cpu.Rows, cpuRow(p))
	}
	for _, p := range pushes {
		for _, c := range p.Counters {
			agree := "yes"
			switch {
			case c.Missing:
				agree = "no such series"
			case !c.Agree:
				agree = "NO"
			}
			counters.Rows = append(counters.Rows, []string{p.Route, fmt.Sprint(p.Round), c.Series, fmt.Sprintf("%.0f", c.Delta), fmt.Sprint(c.Client), agree})
		}
		cpu.Rows = append(cpu.Rows, cpuRow(p))
	}
	return []*bench.Table{main, ratio, counters, cpu}
}

// cpuRow is a push's (or an idle reading's) CPU: per process, the rest of
// the machine's busy time, and its busy share.
func cpuRow(p Push) []string {
	c := p.CPU
	rest := c["machine busy"] - c["client"] - c["sandstormd"] - c["sam-node"]
	busy := "—"
	if c["machine capacity"] > 0 {
		busy = fmt.Sprintf("%.0f %%", 100*c["machine busy"]/c["machine capacity"])
	}
	round := ""
	if p.Round > 0 {
		round = fmt.Sprint(p.Round)
	}
	return []string{p.Route, round, fmt.Sprintf("%.2f", p.WallSeconds),
		fmt.Sprintf("%.2f", c["client"]), fmt.Sprintf("%.2f", c["sandstormd"]), fmt.Sprintf("%.2f", c["sam-node"]), fmt.Sprintf("%.2f", rest), busy}
}

// populationTable renders the readings of the node and its population.
func populationTable(pop []population) *bench.Table {
	t := &bench.Table{
		Title: "The population, resident",
		Description: "sandboxes by tier (GET /v1/node), MemAvailable, sandstormd's and sam-node's RSS (/proc/PID/status) and fds, the host's tasks (threads; pid_max bounds them). " +
			"Per sandbox: the change from before the fill to the reading, over the sandboxes then.",
		Columns: []string{"when", "sandboxes", "tiers", "MemAvailable MiB", "per sandbox MiB", "sandstormd RSS MiB", "sandstormd fds", "sam-node RSS MiB", "tasks", "tasks per sandbox"},
		Data:    pop,
	}
	for i, p := range pop {
		perMem, perTask := "", ""
		if i > 0 && p.Sandboxes > 0 {
			n := float64(p.Sandboxes)
			perMem = fmt.Sprintf("%.1f", float64(pop[0].MemAvailableMiB-p.MemAvailableMiB)/n)
			perTask = fmt.Sprintf("%.1f", float64(p.Tasks-pop[0].Tasks)/n)
		}
		tiers := ""
		for _, k := range slices.Sorted(maps.Keys(p.Tiers)) {
			if p.Tiers[k] > 0 {
				tiers += fmt.Sprintf("%s %d ", k, p.Tiers[k])
			}
		}
		t.Rows = append(t.Rows, []string{p.Phase, fmt.Sprint(p.Sandboxes), strings.TrimSpace(tiers), fmt.Sprint(p.MemAvailableMiB), perMem,
			fmt.Sprintf("%.1f", float64(p.Sandstormd.RSSKiB)/1024), fmt.Sprint(p.Sandstormd.FDs),
			fmt.Sprintf("%.1f", float64(p.SamNode.RSSKiB)/1024), fmt.Sprint(p.Tasks), perTask})
	}
	return t
}

// pushRows renders pushes as the rows of the results' main table.
func pushRows(pushes []Push) [][]string {
	var rows [][]string
	for _, p := range pushes {
		fail := fmt.Sprint(p.Failed)
		for _, k := range slices.Sorted(maps.Keys(p.Failures)) {
			fail += fmt.Sprintf(" (%s ×%d)", k, p.Failures[k])
		}
		rows = append(rows, []string{
			p.Route, fmt.Sprint(p.Round), fmt.Sprint(p.Agents), fmt.Sprint(p.Requests), fail,
			fmt.Sprintf("%.2f", p.WallSeconds), fmt.Sprintf("%.0f", p.PerSecond),
			fmt.Sprintf("%.0f / %.0f / %.0f", p.AgentMedian, p.AgentMin, p.AgentMax), fmt.Sprint(p.Starved),
			fmt.Sprintf("%.2f / %.2f / %.2f / %.1f", p.TTFB.P50, p.TTFB.P95, p.TTFB.P99, p.TTFB.Max),
		})
	}
	return rows
}
