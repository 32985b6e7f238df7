// Package metrics is sandstormd's own Prometheus metrics: the node's (its
// sandboxes and their tiers, transitions, wakes, refusals, headroom, runsc
// and the gateway) and the master's (its nodes and its API, master.go).
// The boundaries' metrics are internal/sam/boundary's (sam_box_*), on the same
// registry and listener (Serve).
//
// Names and labels follow the Prometheus conventions
// (https://prometheus.io/docs/practices/naming/): the unit in the name,
// base units (seconds, bytes), _total on counters, and only labels of a
// closed set — a tier, a verb, a reason, a template or node name, an API
// route pattern — never a sandbox's ID or name, which are unbounded (issue
// 18: "no sandbox IDs as labels"). Every series of a closed set is made at
// zero up front, so a rate or an alert sees it before its first event
// (https://prometheus.io/docs/practices/instrumentation/#avoid-missing-metrics).
//
// Every counter moves where the thing happens, synchronously, not from the
// events hub: the hub drops events for a slow watcher, and a counter must
// move by exactly what happened (TestMetricsThroughEveryTier). The
// console's chart is drawn from these counters too (Node.TransitionsTo, in
// GET /v1/nodes).
//
// A nil *Node or *Master records nothing, so a node or master built
// without metrics (unit tests) calls them at no cost.
package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Outcomes of a transition or a create: the outcome label.
const (
	// OK: it reached the tier asked for.
	OK = "ok"
	// Failed: it did not, or (a wake from snapshot whose restore failed)
	// came back as a cold start with its memory lost.
	Failed = "failed"
	// Refused: admission turned it away before anything was done
	// (sandstorm_admission_refusals_total says why).
	Refused = "refused"
)

// Tiers, as the tier labels spell them (api.Tier's values; this package
// imports nothing of the API).
const (
	Hot      = "hot"
	Frozen   = "frozen"
	Snapshot = "snapshot"
	Detached = "detached"
)

// Tiers is every tier, hottest first.
var Tiers = []string{Hot, Frozen, Snapshot, Detached}

// Moves are the transitions a node makes, [from, to]: one tier down or
// more (the idle timers, memory and disk pressure, the API), and a wake
// from any tier to hot.
var Moves = [][2]string{
	{Hot, Frozen}, {Hot, Snapshot}, {Hot, Detached},
	{Frozen, Snapshot}, {Frozen, Detached}, {Snapshot, Detached},
	{Frozen, Hot}, {Snapshot, Hot}, {Detached, Hot},
}

// Starts are how a create started its sandbox: the start label.
var Starts = []string{"cold", "warm", "pooled", "clone"}

// Refusal reasons (the reason label) and what was refused (the op label).
const (
	ReasonMemory = "memory" // below --memory-reserve (admission.ErrNoMemory)
	ReasonDisk   = "disk"   // below --disk-reserve (admission.ErrNoDisk)
	ReasonFDs    = "fds"    // near the descriptor limit (admission.ErrNoFDs)
	ReasonFull   = "full"   // no address slot or gateway port (node.ErrFull)
	ReasonBusy   = "busy"   // no wake or start slot in time, or the sandbox held by another transition (node.ErrRefused)
)

var (
	Reasons    = []string{ReasonMemory, ReasonDisk, ReasonFDs, ReasonFull, ReasonBusy}
	RefusedOps = []string{"create", "wake", "snapshot"}
)

// RunscVerbs are the runsc subcommands the gVisor backend runs.
var RunscVerbs = []string{"run", "restore", "checkpoint", "pause", "resume", "state", "delete", "kill", "exec"}

// WakeBuckets are the wake latency buckets: a resume is a few ms, a
// restore 100–700 ms, a cold start of an interpreter seconds, a restore
// of a 1 GiB heap 3.6 s (README, "Latency and cost").
var WakeBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// RunscBuckets are the runsc command duration buckets: state and kill take
// ms, run and checkpoint hundreds of ms, a large restore seconds, and the
// deadlines go to minutes (sandbox/gvisor/deadline.go).
var RunscBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 150}

// Node is one node's metrics: the counters and histograms the node moves
// as things happen. What a scrape reads from the node at that moment is
// NodeCollector's.
type Node struct {
	transitions *prometheus.CounterVec
	wakes       *prometheus.HistogramVec
	creates     *prometheus.CounterVec
	deletes     prometheus.Counter
	refusals    *prometheus.CounterVec
	runsc       *prometheus.HistogramVec
	runscFails  *prometheus.CounterVec
}

// NewNode makes a node's metrics, every series at zero, and registers
// them with reg (nil: none, for tests that only count).
func NewNode(reg prometheus.Registerer) *Node {
	m := &Node{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_transitions_total",
			Help: "Tier transitions of sandboxes, by tier from and to and outcome (ok; failed; refused by admission). A wake is a transition to hot.",
		}, []string{"from", "to", "outcome"}),
		wakes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandstorm_wake_duration_seconds",
			Help:    "Time of a successful wake to hot on the node (the resume, restore or cold start), by the tier it woke from.",
			Buckets: WakeBuckets,
		}, []string{"from"}),
		creates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_creates_total",
			Help: "Sandboxes created, by how they started (cold, warm: restored from the template's image, pooled: taken from its warm pool, clone: a clone's child) and outcome (ok, failed, refused).",
		}, []string{"start", "outcome"}),
		deletes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandstorm_deletes_total",
			Help: "Sandboxes deleted.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_admission_refusals_total",
			Help: "Creates, wakes and snapshots the node's admission refused, by reason (memory, disk, fds, full, busy) and what was refused (op).",
		}, []string{"reason", "op"}),
		runsc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandstorm_runsc_duration_seconds",
			Help:    "Duration of runsc commands, by verb (runsc's subcommand), whatever their outcome.",
			Buckets: RunscBuckets,
		}, []string{"verb"}),
		runscFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_runsc_failures_total",
			Help: "runsc commands that exited non-zero or were cut short by their deadline, by verb.",
		}, []string{"verb"}),
	}
	for _, mv := range Moves {
		for _, o := range []string{OK, Failed, Refused} {
			m.transitions.WithLabelValues(mv[0], mv[1], o)
		}
		if mv[1] == Hot {
			m.wakes.WithLabelValues(mv[0])
		}
	}
	for _, s := range Starts {
		for _, o := range []string{OK, Failed, Refused} {
			m.creates.WithLabelValues(s, o)
		}
	}
	for _, r := range Reasons {
		for _, op := range RefusedOps {
			m.refusals.WithLabelValues(r, op)
		}
	}
	for _, v := range RunscVerbs {
		m.runsc.WithLabelValues(v)
		m.runscFails.WithLabelValues(v)
	}
	if reg != nil {
		reg.MustRegister(m.transitions, m.wakes, m.creates, m.deletes, m.refusals, m.runsc, m.runscFails)
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
	m.transitions.WithLabelValues(from, Hot, outcome).Inc()
	if outcome == OK {
		m.wakes.WithLabelValues(from).Observe(took.Seconds())
	}
}

// Create counts a create (or a clone's child) by how it started and its
// outcome.
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

// Refusal counts an admission refusal of op (create, wake, snapshot).
func (m *Node) Refusal(reason, op string) {
	if m == nil {
		return
	}
	m.refusals.WithLabelValues(reason, op).Inc()
}

// Runsc observes one runsc command: the gVisor backend's Observe hook
// (gvisor.Observer), so that package needs nothing of this one.
func (m *Node) Runsc(verb string, took time.Duration, err error) {
	if m == nil {
		return
	}
	m.runsc.WithLabelValues(verb).Observe(took.Seconds())
	if err != nil {
		m.runscFails.WithLabelValues(verb).Inc()
	}
}

// TransitionsTo is how many transitions have ended in each tier, those
// that reached it (outcome ok) summed over the tiers they came from: what
// the node reports in its status (api.NodeStatus.Transitions) and the
// console charts the rates of. It reads the counters themselves, so the
// chart and a scrape cannot disagree. Nil for a nil *Node.
func (m *Node) TransitionsTo() map[string]uint64 {
	if m == nil {
		return nil
	}
	out := make(map[string]uint64, len(Tiers))
	for _, t := range Tiers {
		out[t] = 0
	}
	for _, mv := range Moves {
		var d dto.Metric
		if err := m.transitions.WithLabelValues(mv[0], mv[1], OK).Write(&d); err == nil {
			out[mv[1]] += uint64(d.GetCounter().GetValue())
		}
	}
	return out
}

// NodeState is what a scrape reads from the node at that moment (a
// gauge's worth of state, not events).
type NodeState struct {
	// Sandboxes counts the node's sandboxes by [tier, template]; every
	// tier of each template in Templates is sent, at zero if it has none.
	Sandboxes map[[2]string]int
	Templates []string
	// Pooled is each warm template's pool (restored and paused ahead of
	// demand; not in Sandboxes).
	Pooled map[string]int
	// Memory and disk in bytes: MemAvailable (MemAvailable of
	// /proc/meminfo), the reserves admission keeps free, Promised (what
	// admitted sandboxes still starting have yet to take), Headroom (what
	// a new sandbox may still be admitted into: available − reserve −
	// promised − the room kept above the reserve for a checkpoint),
	// DiskFree (under the data dir).
	MemAvailable, MemReserve, Promised, Headroom, DiskFree, DiskReserve int64
	// Gateway connections open, and those in flight (gateway.Stats).
	Conns, InFlight int
	// Wakes and Starts running now.
	Wakes, Starts int
}

var (
	sandboxesDesc = prometheus.NewDesc("sandstorm_sandboxes", "Sandboxes on this node, by tier and template.", []string{"tier", "template"}, nil)
	pooledDesc    = prometheus.NewDesc("sandstorm_warm_pool_sandboxes", "Sandboxes in each warm template's pool: restored and paused ahead of demand, not in sandstorm_sandboxes.", []string{"template"}, nil)
	memAvailDesc  = prometheus.NewDesc("sandstorm_memory_available_bytes", "Memory available on the node (MemAvailable of /proc/meminfo).", nil, nil)
	memResDesc    = prometheus.NewDesc("sandstorm_memory_reserve_bytes", "Memory the node keeps free (--memory-reserve).", nil, nil)
	promisedDesc  = prometheus.NewDesc("sandstorm_memory_promised_bytes", "Memory admitted sandboxes still starting or waking have yet to take.", nil, nil)
	headroomDesc  = prometheus.NewDesc("sandstorm_memory_headroom_bytes", "Memory a new sandbox may still be admitted into: available − reserve − promised (negative: below the reserve).", nil, nil)
	diskFreeDesc  = prometheus.NewDesc("sandstorm_disk_free_bytes", "Free disk under the data dir (what unprivileged writers may use).", nil, nil)
	diskResDesc   = prometheus.NewDesc("sandstorm_disk_reserve_bytes", "Disk the node keeps free under the data dir (--disk-reserve).", nil, nil)
	connsDesc     = prometheus.NewDesc("sandstorm_gateway_connections", "Client connections the gateway holds open into sandboxes.", nil, nil)
	inFlightDesc  = prometheus.NewDesc("sandstorm_gateway_requests_in_flight", "Gateway connections forwarding an HTTP request, or being set up (the sandbox woken, dialled, first bytes not yet seen): what a checkpoint's drain waits for.", nil, nil)
	wakingDesc    = prometheus.NewDesc("sandstorm_wakes_in_progress", "Wakes (resumes, restores, cold starts) running now (at most --max-wakes).", nil, nil)
	startingDesc  = prometheus.NewDesc("sandstorm_starts_in_progress", "Creates and clones starting their sandbox now (at most --max-starts).", nil, nil)
	scrapeErrDesc = prometheus.NewDesc("sandstorm_node_scrape_errors_total", "Scrapes that could not read part of the node's state (its store, /proc/meminfo, the disk); what could not be read is left out of that scrape.", nil, nil)
)

// NodeCollector returns a collector that reads the node's state (state)
// at each scrape. state reports what it could not read in err; what it
// did read is still sent.
func NodeCollector(state func() (NodeState, error)) prometheus.Collector {
	return &nodeCollector{state: state}
}

type nodeCollector struct {
	state  func() (NodeState, error)
	errors atomic.Int64
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, pooledDesc, memAvailDesc, memResDesc, promisedDesc, headroomDesc, diskFreeDesc, diskResDesc, connsDesc, inFlightDesc, wakingDesc, startingDesc, scrapeErrDesc} {
		ch <- d
	}
}

// Collect sends the node's state. A part it could not read is left out
// (NodeState's fields at -1), not sent as a zero: an absent series is the
// honest answer, and a zero would read as "no memory left".
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.state()
	if err != nil {
		c.errors.Add(1)
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.CounterValue, float64(c.errors.Load()))
	if s.Sandboxes != nil {
		for _, t := range s.Templates {
			for _, tier := range Tiers {
				if _, ok := s.Sandboxes[[2]string{tier, t}]; !ok {
					s.Sandboxes[[2]string{tier, t}] = 0
				}
			}
		}
		for k, n := range s.Sandboxes {
			ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
		}
	}
	for t, n := range s.Pooled {
		ch <- prometheus.MustNewConstMetric(pooledDesc, prometheus.GaugeValue, float64(n), t)
	}
	g := func(d *prometheus.Desc, v int64, known bool) {
		if known {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
		}
	}
	memKnown := s.MemAvailable >= 0
	g(memAvailDesc, s.MemAvailable, memKnown)
	g(memResDesc, s.MemReserve, true)
	g(promisedDesc, s.Promised, true)
	g(headroomDesc, s.Headroom, memKnown)
	g(diskFreeDesc, s.DiskFree, s.DiskFree >= 0)
	g(diskResDesc, s.DiskReserve, true)
	g(connsDesc, int64(s.Conns), true)
	g(inFlightDesc, int64(s.InFlight), true)
	g(wakingDesc, int64(s.Wakes), true)
	g(startingDesc, int64(s.Starts), true)
}
