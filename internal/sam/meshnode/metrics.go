package meshnode

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Routes, the closed set of the "route" label.
const (
	routeModels      = "models"
	routeChat        = "chat_completions"
	routeCompletions = "completions"
	routeMCP         = "mcp"
	routeMCPServer   = "mcp_server"
	routeOther       = "other"
)

// metrics are the node's own counters, on a registry of its own so that
// several nodes in one process (tests, an all-in-one binary) do not collide.
// Every label value comes from a closed set: routes and outcomes are
// constants, provider, model and MCP server names come from the config.
// Principals, tool names and anything an agent sent never become labels.
type metrics struct {
	reg              *prometheus.Registry
	requests         *prometheus.CounterVec   // route, code
	duration         *prometheus.HistogramVec // route
	providerAttempts *prometheus.CounterVec   // provider, outcome
	modelRequests    *prometheus.CounterVec   // model (configured only), outcome
	toolCalls        *prometheus.CounterVec   // server (configured only), outcome
	mcpConnected     *prometheus.GaugeVec     // server
	mcpRedials       *prometheus.CounterVec   // server
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m.requests = counterVec("sam_node_requests_total", "Agent requests by route and HTTP status code.", "route", "code")
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sam_node_request_duration_seconds",
		Help:    "Time to answer an agent request (to the end of the body, streams included), by route.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"route"})
	m.providerAttempts = counterVec("sam_node_provider_attempts_total", "Attempts to reach an upstream provider, by provider and outcome (ok, client_error, server_error, connect_error, canceled).", "provider", "outcome")
	m.modelRequests = counterVec("sam_node_model_requests_total", "Inference requests for configured models, by model and outcome (served, denied, unavailable). Models no provider serves are counted under model=\"\".", "model", "outcome")
	m.toolCalls = counterVec("sam_node_mcp_tool_calls_total", "MCP tool calls by upstream server and outcome (ok, tool_error, denied, unavailable, upstream_error; mesh_ok, mesh_tool_error for calls served by another member). Calls naming no configured server, and calls to servers of other members, count under server=\"\".", "server", "outcome")
	m.mcpConnected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sam_node_mcp_upstream_connected",
		Help: "1 while the node holds a live session with the upstream MCP server.",
	}, []string{"server"})
	m.mcpRedials = counterVec("sam_node_mcp_upstream_dials_total", "Attempts to open a session with an upstream MCP server, by server and outcome (ok, error).", "server", "outcome")
	m.reg.MustRegister(m.requests, m.duration, m.providerAttempts, m.modelRequests, m.toolCalls, m.mcpConnected, m.mcpRedials,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) request(route string, code int, seconds float64) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(route).Observe(seconds)
}
