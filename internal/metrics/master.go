package metrics

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// NodeHealth is what the master knows of one of its nodes at a scrape.
type NodeHealth struct {
	Name string
	// Lost: no report stream open, or none heard within the silence
	// limit (what GET /v1/nodes shows as "lost").
	Lost bool
	// SinceReport is the time since its last report (negative: none
	// heard yet). The node in the master's own process reports nothing
	// and has none.
	SinceReport time.Duration
}

var (
	nodeUpDesc  = prometheus.NewDesc("sandstorm_master_node_up", "1 if the master hears the node (a report stream open and a report within the silence limit), 0 if it is lost.", []string{"node"}, nil)
	nodeLagDesc = prometheus.NewDesc("sandstorm_master_node_report_age_seconds", "Time since the node's last report reached the master (absent until one has).", []string{"node"}, nil)
)

// Master is the master's metrics.
type Master struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMaster makes the master's metrics and registers them, and a
// collector that calls nodes at every scrape, with reg.
func NewMaster(reg prometheus.Registerer, nodes func() []NodeHealth) *Master {
	m := &Master{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_api_requests_total",
			Help: "API requests, by route (the pattern that served it, or \"other\") and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandstorm_api_request_duration_seconds",
			Help:    "Time to answer an API request, by route (to the end of its body: a followed log or event stream counts its whole life).",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration)
		if nodes != nil {
			reg.MustRegister(&masterCollector{nodes: nodes})
		}
	}
	return m
}

type masterCollector struct{ nodes func() []NodeHealth }

func (c *masterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- nodeUpDesc; ch <- nodeLagDesc }

func (c *masterCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.nodes() {
		up := 1.0
		if n.Lost {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(nodeUpDesc, prometheus.GaugeValue, up, n.Name)
		if n.SinceReport >= 0 {
			ch <- prometheus.MustNewConstMetric(nodeLagDesc, prometheus.GaugeValue, n.SinceReport.Seconds(), n.Name)
		}
	}
}

// Instrument counts every request h serves by route and status. route
// names the pattern that will serve r ("" for none: counted as "other"),
// so that a path with an ID in it is one series, never one per sandbox.
func (m *Master) Instrument(h http.Handler, route func(*http.Request) string) http.Handler {
	if m == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt := route(r)
		if rt == "" {
			rt = "other"
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		code := sw.code
		if code == 0 {
			code = http.StatusOK // nothing written: net/http sends 200
		}
		m.requests.WithLabelValues(rt, strconv.Itoa(code)).Inc()
		m.duration.WithLabelValues(rt).Observe(time.Since(start).Seconds())
	})
}

// statusWriter records the status a handler sent. It passes Flush and
// Hijack through (the console's event stream asserts http.Flusher, the
// node tunnel http.Hijacker) and unwraps for http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() { _ = http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if s.code == 0 {
		s.code = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(s.ResponseWriter).Hijack()
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
