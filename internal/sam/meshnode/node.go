package meshnode

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/sam/refusals"
)

// Headers a boundary sets on every request it forwards to the node.
const (
	// HeaderPrincipal names the agent: who its sandbox is.
	HeaderPrincipal = "X-Sam-Principal"
	// HeaderService optionally narrows a request to one mesh service:
	// "inference://<model>" or "mcp://<server>".
	HeaderService = "X-Sam-Service"
)

// ToolSeparator joins a server name and a tool name on /mcp.
const ToolSeparator = "__"

// DefaultMaxBodyBytes bounds request bodies unless Config.MaxBodyBytes says
// otherwise.
const DefaultMaxBodyBytes = 8 << 20

const maxPrincipalLen = 256

// Node is the local part of sam-node: the OpenAI-compatible facade and the
// MCP aggregator, answering each principal by its policy.
type Node struct {
	log       *slog.Logger
	policy    PolicySource
	watcher   *policy.Watcher // owned: started by New, stopped by Close
	maxBody   int64
	providers []*provider
	byModel   map[string][]*provider // ranked
	models    []string               // every served model, sorted
	upstream  *http.Client
	m         *metrics
	hub       *mcpHub
	remote    *remote // nil: no mesh beyond this node
	sv        served  // what this machine's sandboxes serve (served.go)
	refusals  *refusals.Table
	member    string
	agent     http.Handler
	admin     *http.ServeMux

	ctx       context.Context
	cancel    context.CancelFunc
	streams   context.Context // ends long-lived MCP notification streams
	drain     context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type provider struct {
	Provider
	key   string // never logged
	order int
}

// New builds a node: reads the providers' API keys (refusing key files
// that are too open), loads the policy, and starts dialling the upstream
// MCP servers in the background (Ready and WaitReady say when they are
// all connected). Close releases everything.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	n := &Node{
		log:      log,
		maxBody:  cfg.MaxBodyBytes,
		byModel:  map[string][]*provider{},
		m:        newMetrics(),
		member:   cfg.Member,
		refusals: refusals.NewTable(refusals.MaxRows),
	}
	if n.maxBody <= 0 {
		n.maxBody = DefaultMaxBodyBytes
	}
	if err := n.addProviders(cfg.Providers); err != nil {
		return nil, err
	}

	if err := n.setPolicy(cfg); err != nil {
		return nil, err
	}

	n.upstream = &http.Client{Transport: &http.Transport{
		// Never an environment proxy: upstreams are named by the config.
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}}

	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.streams, n.drain = context.WithCancel(context.Background())
	n.hub = newHub(n, cfg.MCPServers)
	if n.watcher != nil {
		n.watcher.OnChange = func(*policy.Policy) { n.hub.syncAll() }
		iv := cfg.PolicyInterval
		if iv <= 0 {
			iv = 2 * time.Second
		}
		n.watcher.Start(iv)
	}
	n.hub.start()
	if cfg.Mesh != nil {
		n.remote = newRemote(n, cfg.Mesh)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.remote.run(n.ctx)
		}()
	}

	n.agent = http.HandlerFunc(n.serveAgent)
	n.admin = n.adminMux()
	return n, nil
}

// addProviders takes the configured providers, each model's in order of
// rank (then of the config), reading their API keys.
func (n *Node) addProviders(providers []Provider) error {
	for i, p := range providers {
		pr := &provider{Provider: p, order: i}
		pr.URL = strings.TrimRight(p.URL, "/")
		if p.APIKeyFile != "" {
			key, err := readKeyFile(p.APIKeyFile)
			if err != nil {
				return fmt.Errorf("provider %q: api_key_file: %w", p.Name, err)
			}
			pr.key = key
		}
		n.providers = append(n.providers, pr)
		seen := map[string]bool{}
		for _, model := range p.Models {
			if seen[model] {
				continue
			}
			seen[model] = true
			n.byModel[model] = append(n.byModel[model], pr)
		}
	}
	for model, ps := range n.byModel {
		sort.SliceStable(ps, func(i, j int) bool {
			if ps[i].Rank != ps[j].Rank {
				return ps[i].Rank < ps[j].Rank
			}
			return ps[i].order < ps[j].order
		})
		n.models = append(n.models, model)
		for _, p := range ps {
			// Pre-create the label sets so that a scrape shows every
			// provider from the start.
			n.m.providerAttempts.WithLabelValues(p.Name, "ok")
		}
	}
	sort.Strings(n.models)
	return nil
}

// setPolicy is where the node's policy comes from: given (the mesh's),
// a file watched for changes, or none (nothing granted).
func (n *Node) setPolicy(cfg Config) error {
	switch {
	case cfg.Policy != nil:
		n.policy = cfg.Policy
	case cfg.PolicyFile != "":
		w, err := policy.NewWatcher(cfg.PolicyFile, n.log)
		if err != nil {
			return fmt.Errorf("policy: %w", err)
		}
		n.watcher = w
		n.policy = w
		accepted := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sam_node_policy_reloads_total", Help: "Policy file changes accepted.",
		}, func() float64 { a, _ := w.Counts(); return float64(a) })
		rejected := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sam_node_policy_rejected_total", Help: "Policy file changes rejected (the previous policy stayed in force).",
		}, func() float64 { _, r := w.Counts(); return float64(r) })
		n.m.reg.MustRegister(accepted, rejected)
	default:
		n.policy = staticPolicy{policy.Empty()}
		n.log.Warn("meshnode: no policy: nothing is granted to anyone")
	}

	return nil
}

// adminMux is the admin listener's routes: /healthz, /readyz, /metrics.
func (n *Node) adminMux() *http.ServeMux {
	admin := http.NewServeMux()
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	admin.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		down := n.hub.notConnected()
		if len(down) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: MCP servers not connected: %s\n", strings.Join(down, ", "))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	admin.Handle("GET /metrics", promhttp.HandlerFor(n.m.reg, promhttp.HandlerOpts{}))
	return admin
}

// servePolicy gives the policy document in force, for the boundaries of
// this machine (PolicyDocument). Its version is the ETag; If-None-Match
// with it answers 304, so a poll of an unchanged policy costs a header.
func (n *Node) servePolicy(w http.ResponseWriter, r *http.Request) {
	pd, ok := n.policy.(PolicyDocument)
	if !ok {
		refuse(w, errdefs.ErrNotFound, "no_policy_document",
			"this sam-node's policy is a file (--policy): give sandstormd --policy the same file")
		return
	}
	version, doc, ok := pd.Document()
	if !ok {
		refuse(w, errdefs.ErrUnavailable, "no_policy_yet",
			"no policy from the control plane yet; try again shortly")
		return
	}
	etag := fmt.Sprintf(`"%d"`, version)
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.Write(doc)
}

type staticPolicy struct{ p *policy.Policy }

func (s staticPolicy) Current() *policy.Policy { return s.p }

// Handler is the agent API: what boundaries forward agents' requests to.
func (n *Node) Handler() http.Handler { return n.agent }

// AdminHandler serves /healthz, /readyz and /metrics, and what
// HandleAdmin adds. Serve it on a listener no sandbox can reach.
func (n *Node) AdminHandler() http.Handler { return n.admin }

// HandleAdmin adds a route to the admin listener (sam-node's GET /mesh:
// the member's view of the mesh, which this package does not know).
func (n *Node) HandleAdmin(pattern string, h http.Handler) { n.admin.Handle(pattern, h) }

// RegisterMetrics adds collectors to the node's registry (/metrics).
func (n *Node) RegisterMetrics(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := n.m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Ready reports whether every upstream MCP server is connected.
func (n *Node) Ready() bool { return len(n.hub.notConnected()) == 0 }

// WaitReady waits until Ready or ctx ends; the error then names the MCP
// servers still not connected.
func (n *Node) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		down := n.hub.notConnected()
		if len(down) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("MCP servers not connected: %s: %w", strings.Join(down, ", "), ctx.Err())
		case <-t.C:
		}
	}
}

// Drain ends the long-lived MCP notification streams (GET /mcp) now and
// from now on, so that an http.Server's Shutdown need not wait for them;
// requests in flight are not touched. Clients re-open their streams with
// whichever node serves next.
func (n *Node) Drain() { n.drain() }

// Close stops the policy watcher, closes the upstream MCP sessions (stdio
// servers are stopped) and idle provider connections. Requests in flight
// should be drained first (http.Server.Shutdown).
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		if n.watcher != nil {
			n.watcher.Stop()
		}
		n.drain()
		n.cancel()
		n.wg.Wait()
		n.hub.close()
		n.upstream.CloseIdleConnections()
	})
	return nil
}

// service is what X-Sam-Service narrowed a request to.
type service struct{ kind, name string }

func parseService(h string) (service, error) {
	if h == "" {
		return service{}, nil
	}
	kind, name, ok := strings.Cut(h, "://")
	if !ok || name == "" || (kind != "inference" && kind != "mcp") {
		return service{}, fmt.Errorf("%s %q: want inference://<model> or mcp://<server>", HeaderService, h)
	}
	return service{kind, name}, nil
}

func validPrincipal(p string) bool {
	if p == "" || len(p) > maxPrincipalLen {
		return false
	}
	for _, c := range p {
		if c < 0x21 || c == 0x7f {
			return false
		}
	}
	return true
}

func (n *Node) serveAgent(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	route := routeOther
	defer func() { n.m.request(route, sw.code(), time.Since(start).Seconds()) }()

	path := r.URL.Path
	switch {
	case path == "/v1/models" || strings.HasPrefix(path, "/v1/models/"):
		route = routeModels
	case path == "/v1/chat/completions":
		route = routeChat
	case path == "/v1/completions":
		route = routeCompletions
	case path == "/mcp":
		route = routeMCP
	case strings.HasPrefix(path, "/mcp/"):
		route = routeMCPServer
	}

	principal := r.Header.Get(HeaderPrincipal)
	if principal == "" && r.Header.Get(HeaderService) == "" {
		switch path {
		case PolicyPath:
			n.servePolicy(sw, r)
			return
		case ServedPath:
			n.serveServed(sw, r)
			return
		case RefusalsPath:
			n.serveRefusals(sw, r)
			return
		}
	} else if strings.HasPrefix(path, "/sam/") {
		// The node's own channel with its machine (the policy, what the
		// sandboxes serve, the boundaries' refusals) is never an agent's,
		// whatever a boundary would let through.
		refuse(sw, errdefs.ErrForbidden, "not_for_agents",
			"this path is for the node's own machine, on its socket; it is never served to an agent")
		return
	}
	if !validPrincipal(principal) {
		msg := "no principal: requests reach the mesh node only through a sandbox boundary, which names the agent in " + HeaderPrincipal
		if principal != "" {
			msg = "malformed " + HeaderPrincipal + " header"
		}
		refuse(sw, errdefs.ErrForbidden, "no_principal", msg)
		return
	}
	svc, err := parseService(r.Header.Get(HeaderService))
	if err != nil {
		refuse(sw, errdefs.ErrBadInput, "bad_service", err.Error())
		return
	}

	switch route {
	case routeModels:
		n.serveModels(sw, r, principal, svc)
	case routeChat:
		n.serveInference(sw, r, principal, svc, "/chat/completions")
	case routeCompletions:
		n.serveInference(sw, r, principal, svc, "/completions")
	case routeMCP, routeMCPServer:
		scope := strings.TrimPrefix(strings.TrimPrefix(path, "/mcp"), "/")
		n.hub.serve(sw, r, principal, svc, scope)
	default:
		refuse(sw, errdefs.ErrNotFound, "not_found",
			fmt.Sprintf("no such endpoint %q: the mesh serves /v1/models, /v1/chat/completions, /v1/completions and /mcp", path))
	}
}

// apiError is the OpenAI error object.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// writeUnavailable answers a request for something the principal is
// granted but no member of the mesh serves right now (issue 29): 503 with
// the Retry-After of errdefs' table for ErrUnavailable, the time the mesh
// takes to heal, and a message naming the service. Not 403, which would
// send the operator to the policy, nor 404, which says it does not exist.
func writeUnavailable(w http.ResponseWriter, code, msg string) {
	refuse(w, errdefs.ErrUnavailable, code, msg+"; "+unavailableRetry())
}

// unavailableRetry is what a tool result says to wait, as writeUnavailable.
func unavailableRetry() string {
	e, _ := errdefs.Lookup(errdefs.ErrUnavailable)
	return fmt.Sprintf("try again in %d s", int(e.Retry/time.Second))
}

// refuse answers an error of kind in the OpenAI error object: the body is
// the protocol's (its type follows from the status, as OpenAI's API does;
// code says what exactly), the status and a 503's Retry-After are ours,
// from errdefs.Table, as on sandstormd's API.
func refuse(w http.ResponseWriter, kind error, code, msg string) {
	status := http.StatusInternalServerError
	if e, ok := errdefs.Lookup(kind); ok {
		status = e.Status
		if e.Retry > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(e.Retry/time.Second)))
		}
	}
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, openAIType(status), code
	writeJSON(w, status, e)
}

// openAIType is the OpenAI error type of an HTTP status
// (https://platform.openai.com/docs/guides/error-codes).
func openAIType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusRequestEntityTooLarge:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	}
	return "api_error"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

// statusWriter records the status code for metrics and passes flushes
// through (http.ResponseController uses Unwrap).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

func (s *statusWriter) Flush() { _ = http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) code() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}
