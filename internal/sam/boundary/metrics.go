package boundary

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sandstorm/internal/sam/dialguard"
)

// route is what kind of destination a flow had; a closed set, so it can be
// a label (destination names never are).
type route int

const (
	routeMesh route = iota
	routeService
	routeExternal
	routeTransparentUnknown
	nRoutes
)

var routeNames = [nRoutes]string{"mesh", "service", "external", "transparent_unknown"}

// outcome is how a flow's admission ended.
type outcome int

const (
	// outAllowed: policy allowed it and the upstream is open.
	outAllowed outcome = iota
	// outDenied: policy refused the name; nothing was dialled.
	outDenied
	// outUnreachable: allowed, but the name does not resolve, no route, a
	// timeout, or the mesh is down.
	outUnreachable
	// outRefused: allowed, but the destination refused the connection; or
	// a transparent flow to an address that is no synthetic name.
	outRefused
	// outError: allowed, but opening it failed otherwise.
	outError
	nOutcomes
)

var outcomeNames = [nOutcomes]string{"allowed", "denied", "unreachable", "refused", "error"}

type dnsAnswer int

const (
	dnsSynthetic dnsAnswer = iota
	dnsRefused
	dnsNXDomain
	nDNSAnswers
)

var dnsNames = [nDNSAnswers]string{"synthetic", "refused", "nxdomain"}

// Metrics are the Prometheus metrics of every boundary of a process. There
// is deliberately no principal or destination label: both are unbounded.
type Metrics struct {
	flows           [nRoutes][nOutcomes]prometheus.Counter
	admission       prometheus.Histogram
	active          prometheus.Gauge
	refusals        prometheus.Counter
	handshakeErrors prometheus.Counter
	dns             [nDNSAnswers]prometheus.Counter
	mesh            [3]prometheus.Counter // forwarded, refused, error
	addrRefusals    [dialguard.NumClasses]prometheus.Counter
	foreignConns    prometheus.Counter
}

// AdmissionBuckets are the buckets of sam_box_admission_seconds: 5 µs to
// 100 ms.
var AdmissionBuckets = []float64{5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered). Call it once per registry and share the result among the
// boundaries of the process.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	flows := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sam_box_flows_total",
		Help: "Flows by route (mesh, service, external, transparent_unknown) and outcome (allowed, denied, unreachable, refused, error).",
	}, []string{"route", "outcome"})
	for r := route(0); r < nRoutes; r++ {
		for o := outcome(0); o < nOutcomes; o++ {
			m.flows[r][o] = flows.WithLabelValues(routeNames[r], outcomeNames[o])
		}
	}
	m.admission = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sam_box_admission_seconds",
		Help:    "Time to classify a flow's destination, decide it under policy and open its upstream, on the boundary's own clock.",
		Buckets: AdmissionBuckets,
	})
	m.active = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sam_box_active_flows",
		Help: "Flows open now.",
	})
	m.refusals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sam_box_refusals_total",
		Help: "What the boundaries turned away: flows denied by policy, transparent flows to unknown addresses, mesh requests to paths agents may not use.",
	})
	m.handshakeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sam_box_handshake_errors_total",
		Help: "Connections that never named a destination: malformed or timed-out handshakes, failed authentication, unsupported commands.",
	})
	dns := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sam_box_dns_queries_total",
		Help: "DNS queries by answer: synthetic (a granted name), refused, nxdomain.",
	}, []string{"answer"})
	for a := dnsAnswer(0); a < nDNSAnswers; a++ {
		m.dns[a] = dns.WithLabelValues(dnsNames[a])
	}
	mesh := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sam_box_mesh_requests_total",
		Help: "HTTP requests on mesh flows: forwarded to the node, refused (a path agents may not use), error (the node could not be reached).",
	}, []string{"outcome"})
	for i, o := range []string{"forwarded", "refused", "error"} {
		m.mesh[i] = mesh.WithLabelValues(o)
	}
	addr := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sam_box_address_refusals_total",
		Help: "Addresses an allowed external name resolved to that were not dialled, by class (loopback, link_local, private, node, sandbox, local_network, …): DNS rebinding, or a policy naming something internal.",
	}, []string{"class"})
	for _, c := range dialguard.Classes() {
		if !c.Allowed() {
			m.addrRefusals[c] = addr.WithLabelValues(c.String())
		}
	}
	m.foreignConns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sam_box_foreign_connections_total",
		Help: "Connections and DNS datagrams on a boundary's sandbox-facing listeners from a source other than its sandbox, all reset or dropped.",
	})
	if reg != nil {
		reg.MustRegister(flows, m.admission, m.active, m.refusals, m.handshakeErrors, dns, mesh, addr, m.foreignConns)
	}
	return m
}

// The methods below accept a nil receiver: a boundary without metrics.

func (m *Metrics) flow(r route, o outcome) {
	if m != nil {
		m.flows[r][o].Inc()
	}
}

func (m *Metrics) observeAdmission(d time.Duration) {
	if m != nil {
		m.admission.Observe(d.Seconds())
	}
}

func (m *Metrics) activeAdd(n float64) {
	if m != nil {
		m.active.Add(n)
	}
}

func (m *Metrics) refusal() {
	if m != nil {
		m.refusals.Inc()
	}
}

func (m *Metrics) handshakeError() {
	if m != nil {
		m.handshakeErrors.Inc()
	}
}

func (m *Metrics) addrRefusal(c dialguard.Class) {
	if m != nil && c >= 0 && c < dialguard.NumClasses && m.addrRefusals[c] != nil {
		m.addrRefusals[c].Inc()
	}
}

func (m *Metrics) foreign() {
	if m != nil {
		m.foreignConns.Inc()
	}
}

func (m *Metrics) dnsAnswer(a dnsAnswer) {
	if m != nil {
		m.dns[a].Inc()
	}
}

const (
	meshForwarded = iota
	meshRefused
	meshError
)

func (m *Metrics) meshRequest(i int) {
	if m != nil {
		m.mesh[i].Inc()
	}
}
