package metrics

import "github.com/prometheus/client_golang/prometheus"

// Ingress is a node's ingress's metrics (internal/ingress): what became
// of each request and each DNS answer, and the routes it serves from.
type Ingress struct {
	requests *prometheus.CounterVec
	dns      *prometheus.CounterVec
}

var (
	routesDesc  = prometheus.NewDesc("sandstorm_ingress_routes", "Sandboxes of the fleet in this node's route table, as its master last pushed them.", nil, nil)
	versionDesc = prometheus.NewDesc("sandstorm_ingress_routes_version", "The version of this node's route table (0: its master has pushed none since it started).", nil, nil)
)

// NewIngress registers a node's ingress metrics in reg, with its route
// table's size and version read by stat.
func NewIngress(reg prometheus.Registerer, stat func() (version int64, routes int)) *Ingress {
	m := &Ingress{requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandstorm_ingress_requests_total",
		Help: "Requests to this node's ingress, by outcome: passed (a connection handed unread to the ingress of the node holding its sandbox, counted once per connection; its requests are counted there), local (served by this node), forwarded (to the node holding the sandbox), retried (a stale route, followed to the sandbox's new node), gone (no such sandbox), refused (a token missing or wrong, paused), failed (its node did not answer).",
	}, []string{"outcome"}), dns: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandstorm_ingress_dns_answers_total",
		Help: "Answers of this node's DNS for the fleet (--ingress-dns), by outcome: sent, slipped (over --ingress-dns-rate: sent empty and truncated, so a real client asks again over TCP), dropped (over the rate: not sent).",
	}, []string{"outcome"})}
	reg.MustRegister(m.requests, m.dns, tableCollector(stat))
	return m
}

// DNSAnswer counts what became of a DNS answer (m nil: not counted).
func (m *Ingress) DNSAnswer(outcome string) {
	if m != nil {
		m.dns.WithLabelValues(outcome).Inc()
	}
}

// Request counts a request's outcome (m nil: not counted).
func (m *Ingress) Request(outcome string) {
	if m != nil {
		m.requests.WithLabelValues(outcome).Inc()
	}
}

type tableCollector func() (int64, int)

func (c tableCollector) Describe(ch chan<- *prometheus.Desc) { ch <- routesDesc; ch <- versionDesc }

func (c tableCollector) Collect(ch chan<- prometheus.Metric) {
	v, n := c()
	ch <- prometheus.MustNewConstMetric(routesDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(versionDesc, prometheus.GaugeValue, float64(v))
}
