package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NodeHealth is what the master knows of one of its nodes at a scrape.
type NodeHealth struct {
	Name string
	// Lost: the node's report stream is not open, or nothing came on it
	// within nodeapi.SilenceLimit (what GET /v1/nodes shows as "lost").
	Lost bool
	// LastReport is when its last report arrived (zero: none yet).
	LastReport time.Time
}

var (
	nodeUpDesc  = prometheus.NewDesc("sandstorm_master_node_up", "1 if the master hears the node (its report stream open, a report within the last 3 s; the node in the master's own process too, over a stream in the process), 0 if it is lost.", []string{"node"}, nil)
	nodeAgeDesc = prometheus.NewDesc("sandstorm_master_node_report_age_seconds", "Time since the node's last report reached the master: about 1 s or less while it reports (a heartbeat a second). Absent for a node not heard yet.", []string{"node"}, nil)
)

// Master is the master's metrics: its API's requests here, its nodes'
// health from a collector (NodeHealthCollector).
type Master struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMaster makes the master's API metrics and registers them with reg.
func NewMaster(reg prometheus.Registerer) *Master {
	m := &Master{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandstorm_api_requests_total",
			Help: "Requests to the master's API listener, by route (the pattern that serves it, method included, e.g. \"GET /v1/sandboxes/{id}\"; \"other\" when none does) and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandstorm_api_request_duration_seconds",
			Help:    "Time to answer an API request, by route, to the end of its body (a followed log or event stream, or a node's tunnel, counts its whole life).",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration)
	}
	return m
}

// NodeHealthCollector returns a collector that asks nodes, at each
// scrape, what the master knows of each node (it reads what the master
// has; it calls no node).
func NodeHealthCollector(nodes func() []NodeHealth) prometheus.Collector {
	return &healthCollector{nodes: nodes}
}

type healthCollector struct{ nodes func() []NodeHealth }

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- nodeUpDesc; ch <- nodeAgeDesc }

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, n := range c.nodes() {
		up := 1.0
		if n.Lost {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(nodeUpDesc, prometheus.GaugeValue, up, n.Name)
		if !n.LastReport.IsZero() {
			ch <- prometheus.MustNewConstMetric(nodeAgeDesc, prometheus.GaugeValue, now.Sub(n.LastReport).Seconds(), n.Name)
		}
	}
}

type routeKey struct{}

// Instrument counts every request h serves by route and status, and times
// it. route names the pattern that will serve r ("" for none: "other"),
// so a path with an ID in it is one series, never one per sandbox. The
// counting is promhttp's, whose ResponseWriter passes Flush, Hijack and
// http.ResponseController through (the event stream, a node's tunnel).
func (m *Master) Instrument(h http.Handler, route func(*http.Request) string) http.Handler {
	if m == nil {
		return h
	}
	routeOf := promhttp.WithLabelFromCtx("route", func(ctx context.Context) string {
		rt, _ := ctx.Value(routeKey{}).(string)
		return rt
	})
	counted := promhttp.InstrumentHandlerDuration(m.duration,
		promhttp.InstrumentHandlerCounter(m.requests, abortCounted(h), routeOf), routeOf)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt := route(r)
		if rt == "" {
			rt = "other"
		}
		aborted := new(bool)
		ctx := context.WithValue(context.WithValue(r.Context(), routeKey{}, rt), abortKey{}, aborted)
		counted.ServeHTTP(w, r.WithContext(ctx))
		if *aborted {
			panic(http.ErrAbortHandler)
		}
	})
}

type abortKey struct{}

// abortCounted lets promhttp count a request whose answer was cut short:
// a client that left mid-answer makes ReverseProxy panic with
// http.ErrAbortHandler (as net/http asks), which promhttp's counters,
// counting after the handler returns, would skip. The panic is held
// until they counted, then raised again (Instrument) so that net/http
// still drops the connection. Any other panic passes as it came.
func abortCounted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				aborted, ok := r.Context().Value(abortKey{}).(*bool)
				if p != http.ErrAbortHandler || !ok {
					panic(p)
				}
				*aborted = true
			}
		}()
		h.ServeHTTP(w, r)
	})
}
