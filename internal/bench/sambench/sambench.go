// Package sambench is the load generator behind sam-bench: it issues the
// same HTTP request many times, the way an agent reaches the mesh (through
// its boundary's SOCKS5 socket, the target name passed on unresolved) or,
// for the baseline, straight to the node's Unix socket; it records every
// request, summarizes the ones that met the expectation by nearest rank,
// reads the servers' own counters before and after, and renders many runs
// as one Markdown table.
//
// Latencies are client-side, in microseconds, from just before the request
// is handed to the HTTP client to the end of reading the body (total) or to
// the first byte of the response (ttfb). Failed requests are kept in the raw
// samples but never enter a distribution: a mesh that refuses quickly must
// not look like a mesh that answers quickly. With ExpectDeny the roles swap:
// a refused flow is the expected outcome (and is what is timed), and a
// request that was served is a leak.
package sambench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/internal/bench"
)

// Tool is the name recorded in every observations file.
const Tool = "sam-bench"

// FormatVersion is the version of the observations file format.
const FormatVersion = 1

// Default names of the boundary's metrics (internal/sam/boundary) that a run
// derives figures from: its admission histogram (Classify, decide, open),
// and its count of what it turned away (flows denied by policy, mesh
// requests to paths agents may not use).
const (
	DefaultAdmissionMetric = "sam_box_admission_seconds"
	DefaultRefusalMetric   = "sam_box_refusals_total"
)

// Header is one request header, in the order given.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Config is one run's parameters. It is recorded whole in the observations
// (with credential headers redacted).
type Config struct {
	// Socket is the boundary's SOCKS5 Unix socket. Exactly one of Socket
	// and TargetUnix is set.
	Socket string `json:"socket,omitempty"`
	// TargetUnix is the node's Unix socket, dialled directly: the baseline
	// with no boundary in the path.
	TargetUnix string `json:"target_unix,omitempty"`
	// Target is the URL requested. Through a boundary its host is handed
	// to the proxy as a name, unresolved.
	Target string `json:"target"`
	Method string `json:"method"`
	// Body is sent with every request (empty: none).
	Body    string   `json:"body,omitempty"`
	Headers []Header `json:"headers,omitempty"`

	Requests    int `json:"requests"`
	Concurrency int `json:"concurrency"`
	Warmup      int `json:"warmup"`
	// NewFlow opens a new connection (a new SOCKS5 handshake and policy
	// decision) for every request; otherwise flows are kept alive and
	// reused, up to Concurrency idle ones.
	NewFlow bool `json:"new_flow"`
	// ExpectDeny makes a refusal the expected outcome: a SOCKS5 reply
	// "connection not allowed by ruleset", or an HTTP status in DenyStatus.
	ExpectDeny bool  `json:"expect_deny"`
	DenyStatus []int `json:"deny_status,omitempty"`
	// Timeout bounds each request, body included.
	Timeout time.Duration `json:"timeout_ns"`

	// Scrape are Prometheus text endpoints read just before and just
	// after the main phase.
	Scrape []string `json:"scrape,omitempty"`
	// AdmissionMetric is the histogram whose sum/count deltas give the
	// boundary's own mean admission time; RefusalMetric the counter
	// (name, or name{label="value",…} selecting some of its series) of
	// the flows it refused.
	AdmissionMetric string `json:"admission_metric,omitempty"`
	RefusalMetric   string `json:"refusal_metric,omitempty"`

	// RSSPids and RSSProcessName choose processes whose resident memory,
	// file descriptors and threads are recorded before and after the run.
	RSSPids        []int  `json:"rss_pids,omitempty"`
	RSSProcessName string `json:"rss_process_name,omitempty"`

	// Labels name the run (e.g. step=8), for the report.
	Labels map[string]string `json:"labels,omitempty"`

	// RepoDir is the git work tree whose commit and dirty state are
	// recorded; SourceIgnore are paths in it (the results) that do not
	// make it dirty.
	RepoDir      string   `json:"repo_dir,omitempty"`
	SourceIgnore []string `json:"-"`
}

// Route is "boundary" (through SOCKS5) or "baseline" (the node's socket).
func (c *Config) Route() string {
	if c.TargetUnix != "" {
		return RouteBaseline
	}
	return RouteBoundary
}

// Flow is "new" (a connection per request) or "reused".
func (c *Config) Flow() string {
	if c.NewFlow {
		return FlowNew
	}
	return FlowReused
}

const (
	RouteBoundary = "boundary"
	RouteBaseline = "baseline"
	FlowReused    = "reused"
	FlowNew       = "new"
	ModeAllow     = "allow"
	ModeDeny      = "deny"
)

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	switch {
	case c.Socket == "" && c.TargetUnix == "":
		return errors.New("one of --socket (through a boundary) or --target-unix (baseline) is required")
	case c.Socket != "" && c.TargetUnix != "":
		return errors.New("--socket and --target-unix are exclusive: one run measures one route")
	case c.Target == "":
		return errors.New("--target is required")
	case c.Requests < 1:
		return fmt.Errorf("--requests must be at least 1, not %d", c.Requests)
	case c.Concurrency < 1:
		return fmt.Errorf("--concurrency must be at least 1, not %d", c.Concurrency)
	case c.Warmup < 0:
		return fmt.Errorf("--warmup must not be negative")
	}
	u, err := url.Parse(c.Target)
	if err != nil {
		return fmt.Errorf("--target: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("--target %q: scheme must be http or https", c.Target)
	}
	if u.Host == "" {
		return fmt.Errorf("--target %q has no host", c.Target)
	}
	if c.Method == "" {
		c.Method = http.MethodGet
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.ExpectDeny && len(c.DenyStatus) == 0 {
		c.DenyStatus = []int{http.StatusForbidden}
	}
	if c.AdmissionMetric == "" {
		c.AdmissionMetric = DefaultAdmissionMetric
	}
	if c.RefusalMetric == "" {
		c.RefusalMetric = DefaultRefusalMetric
	}
	if _, err := parseSelector(c.RefusalMetric); err != nil {
		return fmt.Errorf("--refusal-metric: %w", err)
	}
	for k := range c.Labels {
		if k == "" || strings.ContainsAny(k, ",=") {
			return fmt.Errorf("label name %q: must be non-empty, without ',' or '='", k)
		}
	}
	return nil
}

// Observations is one run, as written to its JSON file.
type Observations struct {
	Tool     string        `json:"tool"`
	Format   int           `json:"format"`
	Started  time.Time     `json:"started"`
	Finished time.Time     `json:"finished"`
	Machine  bench.Machine `json:"machine"`
	Source   bench.Source  `json:"source"`

	// Label is the canonical text of Labels ("k=v,k=v", sorted by name).
	Label  string            `json:"label"`
	Labels map[string]string `json:"labels,omitempty"`
	Route  string            `json:"route"`
	Flow   string            `json:"flow"`
	Mode   string            `json:"mode"`
	Params Config            `json:"params"`

	// Warmup is issued first and reported apart; Main is the measurement.
	Warmup *Phase `json:"warmup,omitempty"`
	Main   *Phase `json:"main"`

	// Scrapes hold, per endpoint, the change of every sam_ counter and
	// histogram/summary sum and count over the main phase.
	Scrapes []*Scrape `json:"scrapes,omitempty"`
	// Derived are figures computed from the scrapes.
	Derived Derived `json:"derived"`

	// ProcessesBefore are read before the warmup, Processes after the run.
	ProcessesBefore []Proc `json:"processes_before,omitempty"`
	Processes       []Proc `json:"processes,omitempty"`

	Notes []string `json:"notes,omitempty"`
}

// Derived figures, nil when their metric was not scraped or did not move.
type Derived struct {
	// AdmissionMeanUs is the boundary's own mean admission time over the
	// main phase: Δsum/Δcount of AdmissionMetric, in µs.
	AdmissionMeanUs *float64 `json:"admission_mean_us,omitempty"`
	AdmissionCount  *float64 `json:"admission_count,omitempty"`
	// BoundaryRefusals is the Δ of RefusalMetric over the main phase.
	BoundaryRefusals *float64 `json:"boundary_refusals,omitempty"`
}

// Phase is one batch of requests (the warmup or the main run).
type Phase struct {
	Requests int `json:"requests"`
	// OK counts requests that met the expectation: served (2xx), or with
	// expect-deny, refused. Only they enter the distributions.
	OK     int `json:"ok"`
	Failed int `json:"failed"`
	// Failures counts the failed requests by kind ("http 500",
	// "socks: host unreachable", "dial: connection refused", "timeout",
	// "leaked" …).
	Failures map[string]int `json:"failures"`
	// Refused counts flows refused by policy, in either mode.
	Refused int `json:"refused"`
	// Leaked counts, with expect-deny, requests that were served.
	Leaked int `json:"leaked"`

	// Flows counts the connections the client opened in the phase (each a
	// SOCKS5 handshake and policy decision through a boundary). With new
	// flows it equals Requests; with reused flows it is about
	// Concurrency, plus any the HTTP client opened while an idle one was
	// on its way back to the pool.
	Flows int64 `json:"flows"`

	WallSeconds float64 `json:"wall_seconds"`
	// OKPerSecond is OK / WallSeconds: the throughput, or with
	// expect-deny, refusals per second.
	OKPerSecond float64 `json:"ok_per_second"`

	// LatencyUs is the distribution of the OK requests' total time (to
	// the end of the body, or to the refusal); TTFBUs of their time to
	// the first response byte (absent for refusals made before any HTTP).
	LatencyUs *bench.Distribution `json:"latency_us,omitempty"`
	TTFBUs    *bench.Distribution `json:"ttfb_us,omitempty"`

	Samples []Sample `json:"samples"`
}

// Sample is one request. Times are µs; AtUs is its start relative to the
// start of its phase.
type Sample struct {
	Seq     int   `json:"i"`
	AtUs    int64 `json:"at_us"`
	TotalUs int64 `json:"total_us"`
	TTFBUs  int64 `json:"ttfb_us,omitempty"`
	Status  int   `json:"status,omitempty"`
	Bytes   int64 `json:"bytes,omitempty"`
	// Kind is "ok" for a 2xx served in full, "refused: …" for a refusal,
	// otherwise the failure's class.
	Kind  string `json:"kind"`
	Error string `json:"error,omitempty"`
	// OK: met the expectation of the run (and so is in the distribution).
	OK bool `json:"ok"`
}

// Run measures per cfg. It returns an error only when the run could not be
// made (bad configuration, an unreachable metrics endpoint before the start);
// failed requests are results, not errors. logf, if not nil, reports
// progress.
func Run(ctx context.Context, cfg Config, logf func(string, ...any)) (*Observations, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, err := newRunner(&cfg)
	if err != nil {
		return nil, err
	}
	defer r.close()

	obs := &Observations{
		Tool:    Tool,
		Format:  FormatVersion,
		Started: time.Now().UTC(),
		Labels:  cfg.Labels,
		Label:   LabelText(cfg.Labels),
		Route:   cfg.Route(),
		Flow:    cfg.Flow(),
		Mode:    ModeAllow,
		Params:  redacted(cfg),
	}
	if cfg.ExpectDeny {
		obs.Mode = ModeDeny
	}
	obs.Machine = bench.CollectMachine(ctx)
	repo := cfg.RepoDir
	if repo == "" {
		repo = "."
	}
	obs.Source = bench.CollectSource(ctx, repo, cfg.SourceIgnore...)

	procs, err := findProcs(cfg.RSSPids, cfg.RSSProcessName)
	if err != nil {
		return nil, err
	}
	obs.ProcessesBefore = ReadProcs(procs)

	if cfg.Warmup > 0 {
		logf("warmup: %d requests, concurrency %d", cfg.Warmup, cfg.Concurrency)
		obs.Warmup = r.phase(ctx, cfg.Warmup)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	scrapes := make([]*Scrape, len(cfg.Scrape))
	for i, u := range cfg.Scrape {
		s, err := r.scrapeBefore(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("scrape %s before the run: %w", u, err)
		}
		scrapes[i] = s
	}

	logf("main: %d requests, concurrency %d, %s route, %s flows", cfg.Requests, cfg.Concurrency, obs.Route, obs.Flow)
	obs.Main = r.phase(ctx, cfg.Requests)
	if obs.Main.Requests < cfg.Requests {
		obs.Notes = append(obs.Notes, fmt.Sprintf("interrupted: %d of %d requests issued", obs.Main.Requests, cfg.Requests))
	}

	// Counters are read after the run even if it was interrupted, with a
	// context of their own.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, s := range scrapes {
		r.scrapeAfter(sctx, s)
		if s.Error != "" {
			obs.Notes = append(obs.Notes, fmt.Sprintf("scrape %s after the run: %s", s.URL, s.Error))
		}
		obs.Notes = append(obs.Notes, s.notes...)
	}
	obs.Scrapes = scrapes
	obs.Derived = derive(scrapes, cfg.AdmissionMetric, cfg.RefusalMetric)
	obs.Processes = ReadProcs(procs)
	obs.Finished = time.Now().UTC()
	return obs, nil
}

// phase issues n requests from cfg.Concurrency workers and summarizes them.
func (r *runner) phase(ctx context.Context, n int) *Phase {
	samples := make([]Sample, n)
	done := make([]bool, n)
	var next atomic.Int64
	dials0 := r.dials.Load()
	start := time.Now()
	var wg sync.WaitGroup
	for range min(r.cfg.Concurrency, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				samples[i] = r.one(ctx, i, start)
				done[i] = true
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)

	p := &Phase{Failures: map[string]int{}, WallSeconds: wall.Seconds(), Samples: []Sample{}, Flows: r.dials.Load() - dials0}
	var lat, ttfb []float64
	for i, s := range samples {
		if !done[i] {
			continue
		}
		p.Samples = append(p.Samples, s)
		p.Requests++
		refused := strings.HasPrefix(s.Kind, KindRefusedPrefix)
		if refused {
			p.Refused++
		}
		if s.OK {
			p.OK++
			lat = append(lat, float64(s.TotalUs))
			if s.TTFBUs > 0 {
				ttfb = append(ttfb, float64(s.TTFBUs))
			}
			continue
		}
		p.Failed++
		kind := s.Kind
		if r.cfg.ExpectDeny && s.Kind == KindOK {
			p.Leaked++
			kind = KindLeaked
		}
		p.Failures[kind]++
	}
	if wall > 0 {
		p.OKPerSecond = float64(p.OK) / wall.Seconds()
	}
	if d, err := bench.Distribute(lat); err == nil {
		p.LatencyUs = &d
	}
	if d, err := bench.Distribute(ttfb); err == nil {
		p.TTFBUs = &d
	}
	return p
}

// LabelText is the canonical text of labels: "k=v" pairs sorted by name,
// joined by commas; "" for none.
func LabelText(labels map[string]string) string {
	keys := slices.Sorted(maps.Keys(labels))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ",")
}

// redacted is cfg as recorded: credential-bearing header values replaced.
func redacted(cfg Config) Config {
	cfg.Headers = slices.Clone(cfg.Headers)
	for i, h := range cfg.Headers {
		switch strings.ToLower(h.Name) {
		case "authorization", "proxy-authorization", "cookie", "x-api-key", "api-key":
			cfg.Headers[i].Value = "<redacted>"
		}
	}
	cfg.SourceIgnore = nil
	return cfg
}
