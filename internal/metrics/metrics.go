// Package metrics is sandstormd's own Prometheus metrics: the node's (its
// sandboxes and their tiers, transitions, wakes, refusals, headroom, runsc
// and the gateway) and the master's (its nodes and its API). The
// boundaries' metrics are internal/boundary's, on the same registry.
//
// Names and labels follow the Prometheus conventions
// (https://prometheus.io/docs/practices/naming/): the unit in the name,
// base units (seconds, bytes), _total on counters, and only labels of a
// closed set — a tier, a verb, a reason, a template or node name, an API
// route pattern — never a sandbox's ID or name, which are unbounded (issue
// 18: "no sandbox IDs as labels").
//
// Every counter moves where the thing happens, synchronously, not from the
// events hub: the hub drops events for a slow watcher, and a counter must
// move by exactly what happened (TestNodeMetrics).
//
// A nil *Node or *Master records nothing, so a node or master built
// without metrics (unit tests) calls them at no cost.
package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a transition or a create.
const (
	OK      = "ok"
	Failed  = "failed"
	Refused = "refused"
)

// WakeBuckets are the wake latency buckets: a resume is a few ms, a
// restore 100–700 ms, a cold start of an interpreter seconds (the tiers
// benchmark, bench/results).
var WakeBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// RunscBuckets are the runsc command duration buckets: state and kill take
// ms, run and checkpoint hundreds of ms, a large restore seconds.
var RunscBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Node is one node's metrics.
type Node struct {
	transitions *prometheus.CounterVec
	wakes       *prometheus.HistogramVec
	creates     *prometheus.CounterVec
	deletes     prometheus.Counter
	refusals    *prometheus.CounterVec
	runsc       *prometheus.HistogramVec
	runscFails  *prometheus.CounterVec
}

// NodeState is what a scrape reads from the node at that moment (a
// gauge's worth of state, not events).
type NodeState struct {
	// Sandboxes counts the node's sandboxes by tier and template.
	Sandboxes map[[2]string]int
	// MemAvailable and DiskFree are bytes; Promised what admitted
	// sandboxes still starting have yet to take; the reserves are what
	// admission keeps free.
	MemAvailable, MemReserve, Promised, DiskFree, DiskReserve int64
	// Gateway connections open, and those busy (being set up or
	// forwarding a request).
	Conns, Busy int
	// Wakes and Starts running now.
	Wakes, Starts int
}

// NewNode makes a node's metrics and registers them, and a collector
// that calls state at every scrape, with reg.
func NewNode(reg prometheus.Registerer, state func() (NodeState, error)) *Node {
	m := &Node{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_transitions_total",
			Help: "Tier transitions of sandboxes, by tier from and to and outcome (ok, failed, refused). A wake is a transition to hot.",
		}, []string{"from", "to", "outcome"}),
		wakes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandstorm_wake_duration_seconds",
			Help:    "Time of a successful wake to hot, by the tier it woke from (on the node, from the start of the resume, restore or cold start).",
			Buckets: WakeBuckets,
		}, []string{"from"}),
		creates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_creates_total",
			Help: "Sandbox creates and clones, by how they started (cold, warm, pooled, clone) and outcome (ok, failed, refused).",
		}, []string{"start", "outcome"}),
		deletes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandstorm_deletes_total",
			Help: "Sandboxes deleted.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_admission_refusals_total",
			Help: "Creates and wakes refused by admission, by reason (memory, disk, fds, full, busy) and what was refused (create, wake).",
		}, []string{"reason", "op"}),
		runsc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandstorm_runsc_duration_seconds",
			Help:    "Duration of runsc commands, by verb, whatever their outcome.",
			Buckets: RunscBuckets,
		}, []string{"verb"}),
		runscFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_runsc_failures_total",
			Help: "runsc commands that failed or were cut short, by verb.",
		}, []string{"verb"}),
	}
	if reg != nil {
		reg.MustRegister(m.transitions, m.wakes, m.creates, m.deletes, m.refusals, m.runsc, m.runscFails)
		if state != nil {
			reg.MustRegister(&nodeCollector{state: state})
		}
	}
	return m
}

// Transition counts a transition from → to with its outcome.
func (m *Node) Transition(from, to, outcome string) {
	if m == nil {
		return
	}
	m.transitions.WithLabelValues(from, to, outcome).Inc()
}

// Wake counts a wake from from with its outcome, and observes its time
// when it succeeded.
func (m *Node) Wake(from, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.transitions.WithLabelValues(from, "hot", outcome).Inc()
	if outcome == OK {
		m.wakes.WithLabelValues(from).Observe(took.Seconds())
	}
}

// Create counts a create (or clone) by how it started and its outcome.
func (m *Node) Create(start, outcome string) {
	if m == nil {
		return
	}
	m.creates.WithLabelValues(start, outcome).Inc()
}

// Delete counts a delete.
func (m *Node) Delete() {
	if m == nil {
		return
	}
	m.deletes.Inc()
}

// Refusal counts an admission refusal of op ("create", "wake").
func (m *Node) Refusal(reason, op string) {
	if m == nil {
		return
	}
	m.refusals.WithLabelValues(reason, op).Inc()
}

// Runsc observes one runsc command (sandbox/gvisor's Observe hook).
func (m *Node) Runsc(verb string, took time.Duration, err error) {
	if m == nil {
		return
	}
	m.runsc.WithLabelValues(verb).Observe(took.Seconds())
	if err != nil {
		m.runscFails.WithLabelValues(verb).Inc()
	}
}

var (
	sandboxesDesc = prometheus.NewDesc("sandstorm_sandboxes", "Sandboxes on this node, by tier and template.", []string{"tier", "template"}, nil)
	memAvailDesc  = prometheus.NewDesc("sandstorm_memory_available_bytes", "Memory available on the node (MemAvailable), before what starting sandboxes are promised.", nil, nil)
	memResDesc    = prometheus.NewDesc("sandstorm_memory_reserve_bytes", "Memory admission keeps free (--mem-reserve).", nil, nil)
	promisedDesc  = prometheus.NewDesc("sandstorm_memory_promised_bytes", "Memory admitted sandboxes still starting have yet to take.", nil, nil)
	headroomDesc  = prometheus.NewDesc("sandstorm_memory_headroom_bytes", "Memory a new sandbox may still be admitted into: available − promised − reserve.", nil, nil)
	diskFreeDesc  = prometheus.NewDesc("sandstorm_disk_free_bytes", "Free disk under the data dir.", nil, nil)
	diskResDesc   = prometheus.NewDesc("sandstorm_disk_reserve_bytes", "Disk admission keeps free under the data dir (--disk-reserve).", nil, nil)
	connsDesc     = prometheus.NewDesc("sandstorm_gateway_connections", "Client connections the gateway holds open into sandboxes.", nil, nil)
	busyDesc      = prometheus.NewDesc("sandstorm_gateway_connections_busy", "Gateway connections being set up (woken, dialled) or forwarding an HTTP request: what a checkpoint's drain waits for.", nil, nil)
	wakingDesc    = prometheus.NewDesc("sandstorm_wakes_running", "Wakes (resumes, restores, cold starts) running now (at most --max-wakes).", nil, nil)
	startingDesc  = prometheus.NewDesc("sandstorm_starts_running", "Creates and clones starting their sandbox now (at most --max-starts).", nil, nil)
	scrapeErrDesc = prometheus.NewDesc("sandstorm_node_scrape_errors_total", "Scrapes that could not read the node's state (the store or /proc).", nil, nil)
)

// nodeCollector reads the node's state at each scrape.
type nodeCollector struct {
	state  func() (NodeState, error)
	errors atomic.Int64
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, memAvailDesc, memResDesc, promisedDesc, headroomDesc, diskFreeDesc, diskResDesc, connsDesc, busyDesc, wakingDesc, startingDesc, scrapeErrDesc} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.state()
	if err != nil {
		// What it could read is still sent (a zero is not sent for what
		// failed: an absent series is the honest answer).
		c.errors.Add(1)
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.CounterValue, float64(c.errors.Load()))
	if err != nil && s.Sandboxes == nil {
		return
	}
	for k, n := range s.Sandboxes {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	g := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	g(memAvailDesc, s.MemAvailable)
	g(memResDesc, s.MemReserve)
	g(promisedDesc, s.Promised)
	g(headroomDesc, s.MemAvailable-s.Promised-s.MemReserve)
	g(diskFreeDesc, s.DiskFree)
	g(diskResDesc, s.DiskReserve)
	g(connsDesc, int64(s.Conns))
	g(busyDesc, int64(s.Busy))
	g(wakingDesc, int64(s.Wakes))
	g(startingDesc, int64(s.Starts))
}
