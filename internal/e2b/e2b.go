// Package e2b is the E2B REST API on the master, so that agent frameworks
// built on the E2B SDKs move to Sandstorm by pointing the SDK at it (E2B_API_URL
// = https://<master>/e2b, E2B_SANDBOX_URL = https://<master>, an API key
// from sandstormd api-key create). Its paths and bodies are E2B's
// (e2b-dev/E2B spec/openapi.yml); its meaning is this product's tiers:
//
//   - a sandbox the SDK pauses is snapshotted (its memory on disk); one it
//     connects to is woken from whatever tier it is in — 200 if it was
//     running, 201 if this call resumed it;
//   - a sandbox's timeout is its lifetime: at its end it is killed, or,
//     with autoPause, snapshotted (Run);
//   - idle tiering is invisible: a sandbox frozen or snapshotted because it
//     was idle is still "running" to E2B, and wakes on its next call; only a
//     client's pause makes it "paused".
//
// Errors are E2B's: a JSON body {"code": <status>, "message"} — the SDK
// decides "not found" and "already paused" from the body, not the status.
package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/sandboxtraffic"
	"sandstorm/internal/store"
	"sandstorm/internal/templates"
)

// Config is what the E2B API serves from.
type Config struct {
	Store *store.Store
	Fleet *fleet.Fleet
	// Sandboxes is the sandbox service /v1 shares (nil: one of its own,
	// over Store and Fleet; a master gives both APIs the same one, whose
	// locks they then share).
	Sandboxes *sandboxes.Service
	// Domain is the sandboxes' domain as the SDK is told it (its hosts
	// are <port>-<sandboxID>.<domain>).
	Domain string
	// TokenKey makes each sandbox's envd access token (AccessToken): an
	// HMAC of its ID, so the master keeps none and can give it again at
	// every connect. The daemon derives it from the API token, which the
	// masters of one database share and which is kept 0600.
	TokenKey []byte
	// RoutesChanged, if set, is told when what a node's ingress knows of
	// a sandbox changed (a pause, a resume): internal/routes pushes it.
	RoutesChanged func()
	// DefaultTemplate is the template of a create that names none (the
	// SDK's default is "base").
	DefaultTemplate string
	// Templates builds the templates of E2B's template builder
	// (templates.go; nil: none are built).
	Templates *templates.Service
	// MaxUpload bounds one upload of a build's files (0:
	// DefaultMaxUpload).
	MaxUpload int64
	Log       *slog.Logger
}

// Service is the E2B API.
type Service struct {
	cfg    Config
	sbx    *sandboxes.Service // shared with /v1: creates, owners, who sees what
	builds builds             // E2B's template builds (builds.go)
}

// one serves h holding the lock of the request's sandbox.
func (s *Service) one(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		defer s.sbx.Lock(r.PathValue("id"))()
		h(w, r)
	}
}

// New returns the service for cfg.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "base"
	}
	sbx := cfg.Sandboxes
	if sbx == nil {
		sbx = &sandboxes.Service{Store: cfg.Store, Fleet: cfg.Fleet}
	}
	return &Service{cfg: cfg, sbx: sbx}
}

// ClientID is what E2B's required, deprecated clientID says.
const ClientID = "sandstorm"

// DefaultTimeout is a sandbox's lifetime when a create, a connect or a
// fork gives none: 5 minutes, what E2B's SDKs have always given
// (DEFAULT_SANDBOX_TIMEOUT_MS, 300_000, in js-sdk's connectionConfig.ts,
// which e2b 2.45 sends with every create and connect). e2b 2.51 sends
// none and leaves it to the server; E2B's spec still says 15 s for a
// create without one, which would end an SDK user's sandbox 15 s in (a
// newcomer's trial, 12-07), so the SDKs' figure is the one kept.
const DefaultTimeout = 5 * time.Minute

// MaxTimeout bounds a lifetime (E2B's own cap on its paid plan is 24 h).
const MaxTimeout = 24 * time.Hour

// AccessToken is sandbox id's envd access token.
func (s *Service) AccessToken(id string) string {
	m := hmac.New(sha256.New, s.cfg.TokenKey)
	m.Write([]byte("envd-access-token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// TrafficToken is sandbox id's traffic access token, which its own ports
// ask for when it was made with allowPublicTraffic false: an HMAC as
// AccessToken's, of another purpose, so neither token opens the other's
// door.
func (s *Service) TrafficToken(id string) string {
	m := hmac.New(sha256.New, s.cfg.TokenKey)
	m.Write([]byte("traffic-access-token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// API is the REST API, under the master's authentication: the caller
// (operator or team) is in the request's context.
func (s *Service) API() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.create)
	mux.HandleFunc("POST /v2/sandboxes", s.create) // the SDK from 2.50 on
	mux.HandleFunc("GET /sandboxes", s.listV1)
	mux.HandleFunc("GET /v2/sandboxes", s.listV2)
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.one(s.kill))
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.one(s.pause))
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.one(s.connect))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.one(s.connect)) // the SDK from 2.50 on
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.one(s.connect))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.one(s.setTimeout))
	mux.HandleFunc("PUT /sandboxes/{id}/network", s.one(s.updateNetwork))
	mux.HandleFunc("POST /sandboxes/{id}/fork", s.fork)
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	mux.HandleFunc("GET /snapshots", s.listSnapshots)
	mux.HandleFunc("DELETE /templates/{id}", s.deleteSnapshot)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	// E2B's template builder (templates.go, builds.go, uploads.go).
	mux.HandleFunc("POST /v3/templates", s.requestBuild)
	mux.HandleFunc("GET /templates/{templateID}/files/{hash}", s.fileLink)
	mux.HandleFunc("POST /v2/templates/{templateID}/builds/{buildID}", s.startBuild)
	mux.HandleFunc("GET /templates/{templateID}/builds/{buildID}/status", s.buildStatus)
	mux.HandleFunc("GET /templates/{a}/{b}", s.templatesGet)
	mux.HandleFunc("POST /templates/tags", s.assignTags)
	mux.HandleFunc("DELETE /templates/tags", s.removeTags)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, errdefs.New(errdefs.ErrNotFound, "%s %s: not part of the E2B API served here", r.Method, r.URL.Path))
	})
	return mux
}

// fail answers err as E2B does: {"code": status, "message"}, the status
// from the one error table (errdefs).
// routesChanged tells the routes' publisher, if any.
func (s *Service) routesChanged() {
	if s.cfg.RoutesChanged != nil {
		s.cfg.RoutesChanged()
	}
}

func fail(w http.ResponseWriter, err error) { sandboxtraffic.Fail(w, err) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decodeOptional is decode of a body that may be left out (the SDK sends
// none for a pause or a snapshot without options): with none, v stays
// as it is.
func decodeOptional(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decode(w, r, v)
}

func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, 1<<20)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			return errdefs.Mark(errdefs.ErrTooLarge, err)
		}
		return errdefs.New(errdefs.ErrBadInput, "malformed JSON body: %v", err)
	}
	return nil
}

// newSandbox is E2B's NewSandbox (the fields this API acts on; what of
// the others it cannot honour, such as iam or an egress proxy, is
// refused when set, rather than silently ignored). mcp is taken and
// needs nothing here: the SDK starts the gateway in the sandbox itself
// (mcp-gateway, internal/mcpgateway).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	AutoPause           bool              `json:"autoPause,omitempty"`
	Secure              *bool             `json:"secure,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	Network             json.RawMessage   `json:"network,omitempty"`
	AutoResume          *struct {
		Enabled *bool `json:"enabled"`
	} `json:"autoResume,omitempty"`
	AutoPauseMemory *bool           `json:"autoPauseMemory,omitempty"`
	VolumeMounts    json.RawMessage `json:"volumeMounts,omitempty"`
	IAM             json.RawMessage `json:"iam,omitempty"`
}

func set(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "{}" && s != "[]"
}

// sandbox is E2B's Sandbox (what create and connect answer).
type sandbox struct {
	TemplateID      string  `json:"templateID"`
	SandboxID       string  `json:"sandboxID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
	Alias           string  `json:"alias,omitempty"`
	// TrafficAccessToken opens a private sandbox's own ports.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// detail is E2B's SandboxDetail and, without the token and domain, its
// ListedSandbox.
type detail struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	Alias           string            `json:"alias,omitempty"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	State           string            `json:"state"`
	Lifecycle       *lifecycle        `json:"lifecycle,omitempty"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func (s *Service) create(w http.ResponseWriter, r *http.Request) {
	var req newSandbox
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	// What this API cannot honour is refused, not ignored: a network or
	// IAM rule silently dropped would leave a sandbox other than asked.
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		why  string
	}{
		{"volumeMounts", req.VolumeMounts, "a sandbox's filesystem is its volume"},
		{"iam", req.IAM, "credentials come from the mesh's policy"},
	} {
		if set(f.raw) {
			fail(w, errdefs.New(errdefs.ErrNotSupported, "%s: not supported here; %s", f.name, f.why))
			return
		}
	}
	ingress, err := parseNetwork(req.Network)
	if err != nil {
		fail(w, err)
		return
	}
	// allow_internet_access true is the SDK's default (2.45 sends it):
	// no restriction beyond the policy. false is denyOut all (below).
	// A pause keeps its memory: asking otherwise is refused. (secure:
	// false is not: every sandbox has its envd access token, which asks
	// more of a caller, not less.)
	autoResume := req.AutoResume != nil && req.AutoResume.Enabled != nil && *req.AutoResume.Enabled
	dropsMemory := req.AutoPauseMemory != nil && !*req.AutoPauseMemory
	if dropsMemory && autoResume {
		// A filesystem-only pause is resumed by a connect (the SDK
		// refuses this too).
		fail(w, errdefs.New(errdefs.ErrBadInput, "autoResume with autoPauseMemory false: a filesystem-only pause is resumed by connect only"))
		return
	}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		// E2B: the same as denyOut ["0.0.0.0/0"].
		if ingress.egress == nil {
			ingress.egress = &api.Egress{}
		}
		ingress.egress.DenyOut = append(ingress.egress.DenyOut, egress.AllTraffic)
	}
	timeout := DefaultTimeout
	if req.Timeout != nil {
		if *req.Timeout < 0 || time.Duration(*req.Timeout)*time.Second > MaxTimeout {
			fail(w, errdefs.New(errdefs.ErrBadInput, "timeout %d s: want 0 to %d", *req.Timeout, int(MaxTimeout.Seconds())))
			return
		}
		timeout = time.Duration(*req.Timeout) * time.Second
	}
	name := req.TemplateID
	if name == "" {
		name = s.cfg.DefaultTemplate
	}
	if name == mcpTemplate {
		// The SDK's template for a create with mcp: any template serves,
		// since every sandbox has the gateway (envd's mcp-gateway).
		if _, err := s.sbx.Template(r.Context(), name); errors.Is(err, errdefs.ErrNotFound) {
			name = s.cfg.DefaultTemplate
		}
	}
	now := time.Now()
	want := store.SandboxMeta{Metadata: req.Metadata, Env: req.EnvVars, StartedAt: now, EndAt: now.Add(timeout), AutoPause: req.AutoPause,
		Private: ingress.private, MaskHost: ingress.maskHost, AutoResume: autoResume, PauseDropsMemory: dropsMemory}
	var sb api.Sandbox
	var meta store.SandboxMeta
	if !s.sbx.IsSnapshot(r.Context(), name) {
		// A team's own template by name[:tag] or ID: its build's.
		if name, err = s.resolveTemplate(r.Context(), name); err != nil {
			fail(w, err)
			return
		}
	}
	if s.sbx.IsSnapshot(r.Context(), name) && (ingress.egress != nil || len(ingress.rules) > 0) {
		// Its sandboxes keep the snapshot's rules: new ones are refused,
		// not dropped (a sandbox must never run with less than it asked).
		err = errdefs.New(errdefs.ErrNotSupported, "network egress rules with a snapshot: a sandbox from a snapshot keeps the snapshot's own rules")
	} else if s.sbx.IsSnapshot(r.Context(), name) {
		// E2B's Sandbox.create(snapshotID): from the snapshot, with its
		// memory.
		sb, meta, err = s.sbx.FromSnapshot(r.Context(), name, want)
	} else {
		sb, meta, err = s.sbx.Create(r.Context(), sandboxes.CreateRequest{Template: name, Meta: want, Egress: ingress.egress, Rules: ingress.rules})
	}
	if err != nil {
		fail(w, err)
		return
	}
	s.cfg.Log.Info("e2b sandbox created", "id", sb.ID, "template", name, "team", meta.Team, "timeout_s", timeout.Seconds(), "auto_pause", req.AutoPause)
	writeJSON(w, http.StatusCreated, s.wireOf(sb, meta, s.domainFor(r)))
}

// mcpTemplate is the template E2B's SDK creates from when a create has
// mcp and names none (its defaultMcpTemplate).
const mcpTemplate = "mcp-gateway"

// ingress is what of E2B's network settings this API honours: who may
// reach a sandbox's own ports, and the Host they see; and its egress
// rules (allowOut, denyOut), which its boundary applies.
type ingress struct {
	private  bool
	maskHost string
	egress   *api.Egress
	rules    []inject.Binding // network.rules (rules.go)
}

// parseNetwork reads a create's network: allowPublicTraffic,
// maskRequestHost, allowOut and denyOut are honoured (the last two as the
// sandbox's egress rules, which only narrow its boundary's policy), and
// rules (header transforms, rules.go); an egress proxy is refused, not
// ignored.
func parseNetwork(raw json.RawMessage) (ingress, error) {
	var in ingress
	if !set(raw) {
		return in, nil
	}
	var n map[string]json.RawMessage
	if err := json.Unmarshal(raw, &n); err != nil {
		return in, errdefs.New(errdefs.ErrBadInput, "network: %v", err)
	}
	for k, v := range n {
		switch k {
		case "allowPublicTraffic":
			var public *bool
			if err := json.Unmarshal(v, &public); err != nil {
				return in, errdefs.New(errdefs.ErrBadInput, "network.allowPublicTraffic: %v", err)
			}
			in.private = public != nil && !*public
		case "maskRequestHost":
			var mask *string
			if err := json.Unmarshal(v, &mask); err != nil {
				return in, errdefs.New(errdefs.ErrBadInput, "network.maskRequestHost: %v", err)
			}
			if mask != nil {
				in.maskHost = *mask
			}
		case "rules":
			if !set(v) {
				continue
			}
			rules, err := parseRules(v)
			if err != nil {
				return in, err
			}
			in.rules = rules
		case "allowOut", "denyOut":
			var list []string
			if err := json.Unmarshal(v, &list); err != nil {
				return in, errdefs.New(errdefs.ErrBadInput, "network.%s: want a list of strings: %v", k, err)
			}
			if in.egress == nil {
				in.egress = &api.Egress{}
			}
			if k == "allowOut" {
				in.egress.AllowOut = list
			} else {
				in.egress.DenyOut = list
			}
		case "egressProxy":
			// E2B's, refused rather than ignored: a sandbox's way out is
			// its boundary.
			if set(v) {
				return in, errdefs.New(errdefs.ErrNotSupported, "network.%s: not supported here; what a sandbox may reach is its boundary's policy (sandstormd serve --policy)", k)
			}
		default:
			// Not E2B's (SandboxNetworkConfig in its OpenAPI): a typo, said
			// so, not "not supported".
			if set(v) {
				return in, errdefs.New(errdefs.ErrBadInput, "network.%s: not a field of E2B's network settings (%s)%s", k, networkFields, spelledSnake(k))
			}
		}
	}
	if strings.ContainsAny(in.maskHost, " /\r\n\x00") {
		return in, errdefs.New(errdefs.ErrBadInput, "network.maskRequestHost %q: want a host[:port], ${PORT} for the port", in.maskHost)
	}
	return in, nil
}

// networkFields are E2B's network settings (SandboxNetworkConfig).
const networkFields = "allowOut, denyOut, allowPublicTraffic, maskRequestHost, rules, egressProxy"

// spelledSnake points a camelCase allowInternetAccess, which E2B's SDK
// takes but its API spells allow_internet_access (beside network at a
// create, in the body of an update), to that spelling.
func spelledSnake(k string) string {
	if k == "allowInternetAccess" {
		return "; E2B's API spells it allow_internet_access (a create's goes beside network)"
	}
	return ""
}

// domainFor is the sandboxes' domain as the client of r is told it: the
// one it reached the API by, port and all, when it came by
// api.<domain> (E2B's own layout, the SDK's default URL); else the
// configured one.
func (s *Service) domainFor(r *http.Request) string {
	if d, ok := api.APIHostDomain(r.Host, s.cfg.Domain); ok {
		return d
	}
	return s.cfg.Domain
}

// wireOf is sb as create and connect answer it; a private sandbox's
// answer holds its traffic access token.
func (s *Service) wireOf(sb api.Sandbox, m store.SandboxMeta, d string) sandbox {
	out := sandbox{TemplateID: sb.Template, SandboxID: sb.ID, ClientID: ClientID, EnvdVersion: api.EnvdVersion, EnvdAccessToken: s.AccessToken(sb.ID), Domain: &d, Alias: sb.Template}
	if m.Private {
		out.TrafficAccessToken = s.TrafficToken(sb.ID)
	}
	return out
}

// find is sandbox id if the caller may see it; another team's is not
// found, exactly as a missing one (IDs do not leak).
func (s *Service) find(r *http.Request) (nodeapi.Node, api.Sandbox, store.SandboxMeta, error) {
	n, sb, m, err := s.sbx.Find(r.Context(), r.PathValue("id"))
	if err == nil && m.SnapshotOf != "" {
		// A snapshot is kept as a sandbox, but is not one to E2B.
		return nil, api.Sandbox{}, store.SandboxMeta{}, sandboxes.NotFound(r.PathValue("id"))
	}
	return n, sb, m, err
}

// findRunning is find for a call that copies the sandbox's memory (verb:
// fork, snapshot): a paused one is a conflict, since E2B copies only a
// running sandbox.
func (s *Service) findRunning(r *http.Request, verb string) (nodeapi.Node, api.Sandbox, store.SandboxMeta, error) {
	n, sb, m, err := s.find(r)
	if err == nil && m.Paused {
		err = errdefs.New(errdefs.ErrConflict, "sandbox %s is paused: connect to it, then %s it", sb.ID, verb)
	}
	return n, sb, m, err
}

func (s *Service) detail(sb api.Sandbox, m store.SandboxMeta, withToken bool, dom string) detail {
	state := "running"
	if m.Paused {
		state = "paused"
	}
	end := m.EndAt
	if end.IsZero() {
		end = m.StartedAt.Add(MaxTimeout)
	}
	d := detail{
		TemplateID: sb.Template, SandboxID: sb.ID, ClientID: ClientID, Alias: sb.Template,
		StartedAt: m.StartedAt, EndAt: end, EnvdVersion: api.EnvdVersion,
		CPUCount: 1, MemoryMB: sb.MemoryMiB, DiskSizeMB: 0, Metadata: m.Metadata, State: state,
	}
	if d.MemoryMB == 0 {
		d.MemoryMB = 1024
	}
	if withToken {
		d.EnvdAccessToken, d.Domain = s.AccessToken(sb.ID), &dom
		on := "kill"
		if m.AutoPause {
			on = "pause"
		}
		d.Lifecycle = &lifecycle{AutoResume: m.AutoResume, OnTimeout: on}
	}
	return d
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	_, sb, m, err := s.find(r)
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.detail(sb, m, true, s.domainFor(r)))
}

func (s *Service) kill(w http.ResponseWriter, r *http.Request) {
	n, sb, _, err := s.find(r)
	if err != nil {
		fail(w, err)
		return
	}
	if err := s.cfg.Fleet.Delete(r.Context(), n, sb); err != nil {
		fail(w, err)
		return
	}
	if err := s.cfg.Store.Teams().DeleteSandboxMeta(r.Context(), sb.ID); err != nil {
		s.cfg.Log.Warn("e2b: forget a killed sandbox's metadata", "id", sb.ID, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause is POST /sandboxes/{id}/pause {memory}: with its memory (the
// default) the snapshot tier, processes and all; with memory false its
// files only (the detached tier), and a connect cold-boots it. It is
// paused until a connect (or, made with autoResume, traffic).
func (s *Service) pause(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeOptional(w, r, &body); err != nil {
		fail(w, err)
		return
	}
	if _, _, _, err := s.find(r); err != nil {
		fail(w, err) // a snapshot is not a sandbox to E2B
		return
	}
	if _, err := s.sbx.Pause(r.Context(), r.PathValue("id"), body.Memory == nil || *body.Memory); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type timeoutBody struct {
	Timeout *int `json:"timeout"`
	// Memory false (the SDK's onResume "reboot") starts it again from
	// its volume, its memory dropped: a detach, then the wake.
	Memory *bool `json:"memory,omitempty"`
}

func (t timeoutBody) duration() (time.Duration, error) {
	if t.Timeout == nil {
		return 0, errdefs.New(errdefs.ErrBadInput, "timeout is required (seconds)")
	}
	d := time.Duration(*t.Timeout) * time.Second
	if d < 0 || d > MaxTimeout {
		return 0, errdefs.New(errdefs.ErrBadInput, "timeout %d s: want 0 to %d", *t.Timeout, int(MaxTimeout.Seconds()))
	}
	return d, nil
}

// connect wakes the sandbox (from any tier) and sets its lifetime from
// now: 201 if it was paused (this call resumed it), else 200.
func (s *Service) connect(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decode(w, r, &body); err != nil {
		fail(w, err)
		return
	}
	// e2b 2.51's connect sends no timeout unless asked (2.45's sent
	// DefaultTimeout's 300 s); a running sandbox's is only lengthened.
	d := DefaultTimeout
	if body.Timeout != nil {
		var err error
		if d, err = body.duration(); err != nil {
			fail(w, err)
			return
		}
	}
	if _, _, _, err := s.find(r); err != nil {
		fail(w, err)
		return
	}
	sb, resumed, err := s.sbx.Resume(r.Context(), r.PathValue("id"), sandboxes.ResumeOpts{
		DropMemory: body.Memory != nil && !*body.Memory, Until: time.Now().Add(d)})
	if err != nil {
		fail(w, err)
		return
	}
	m, _ := s.cfg.Store.Teams().GetSandboxMeta(r.Context(), sb.ID)
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.wireOf(sb, m, s.domainFor(r)))
}

// forkTimeout is a fork's lifetime when it names none (e2b 2.51 sends
// none unless told): as a create's.
const forkTimeout = DefaultTimeout

// fork is POST /sandboxes/{id}/fork {count, timeout}: count children of
// the sandbox, each from one checkpoint of it, with its memory, running
// (a clone: each its own address, boundary, principal and reseed), the
// sandbox itself running on; 201 with one entry per child, as E2B's.
func (s *Service) fork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Count   *int `json:"count"`
		Timeout *int `json:"timeout"`
	}
	if err := decode(w, r, &body); err != nil {
		fail(w, err)
		return
	}
	count, d := 1, forkTimeout
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > 100 {
		fail(w, errdefs.New(errdefs.ErrBadInput, "count %d: want 1 to 100", count))
		return
	}
	if body.Timeout != nil {
		var err error
		if d, err = (timeoutBody{Timeout: body.Timeout}).duration(); err != nil {
			fail(w, err)
			return
		}
	}
	n, sb, m, err := s.findRunning(r, "fork")
	if err != nil {
		fail(w, err)
		return
	}
	out, err := s.sbx.Clone(r.Context(), n, sb, api.CloneRequest{Count: count}, time.Now().Add(d))
	if err != nil && len(out.Children) == 0 {
		fail(w, err)
		return
	}
	dom := s.domainFor(r)
	type result struct {
		Sandbox *sandbox       `json:"sandbox,omitempty"`
		Error   map[string]any `json:"error,omitempty"`
	}
	res := make([]result, 0, count)
	for _, c := range out.Children {
		wire := s.wireOf(c, m, dom)
		res = append(res, result{Sandbox: &wire})
	}
	for len(res) < count {
		status, e := errdefs.ToWire(err)
		res = append(res, result{Error: map[string]any{"code": status, "message": e.Message}})
	}
	s.cfg.Log.Info("e2b sandbox forked", "id", sb.ID, "forks", len(out.Children), "asked", count)
	writeJSON(w, http.StatusCreated, res)
}

// updateNetwork serves PUT /sandboxes/{id}/network (the SDK's
// updateNetwork): the sandbox's egress rules replaced whole, a field left
// out cleared, as E2B documents; allow_internet_access false is denyOut
// all, as at create. Its boundary applies them to new flows at once.
func (s *Service) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var body map[string]json.RawMessage
	if err := decode(w, r, &body); err != nil {
		fail(w, err)
		return
	}
	e, err := networkUpdate(body)
	if err != nil {
		fail(w, err)
		return
	}
	n, sb, _, err := s.find(r)
	if err != nil {
		fail(w, err)
		return
	}
	if _, err := n.SetEgress(r.Context(), sb.ID, e); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// networkUpdate is an updateNetwork body as the rules it sets: create's
// network fields that are not egress (ingress is set at create only)
// are refused, as are an egress proxy (parseNetwork) and rules, which
// are set at create only.
func networkUpdate(body map[string]json.RawMessage) (api.Egress, error) {
	var allowInternet *bool
	if v, ok := body["allow_internet_access"]; ok {
		if err := json.Unmarshal(v, &allowInternet); err != nil {
			return api.Egress{}, errdefs.New(errdefs.ErrBadInput, "allow_internet_access: %v", err)
		}
		delete(body, "allow_internet_access")
	}
	for _, k := range []string{"allowPublicTraffic", "maskRequestHost"} {
		if set(body[k]) {
			return api.Egress{}, errdefs.New(errdefs.ErrBadInput, "network.%s: set at create only; an update sets egress (allowOut, denyOut, allow_internet_access)", k)
		}
	}
	raw, _ := json.Marshal(body)
	in, err := parseNetwork(raw)
	if err != nil {
		return api.Egress{}, err
	}
	if len(in.rules) > 0 {
		// The sandbox's CA was made for its rules' names at create.
		return api.Egress{}, errdefs.New(errdefs.ErrNotSupported, "network.rules: set at create only here; an update keeps the sandbox's rules")
	}
	var e api.Egress
	if in.egress != nil {
		e = *in.egress
	}
	if allowInternet != nil && !*allowInternet {
		e.DenyOut = append(e.DenyOut, egress.AllTraffic)
	}
	return e, nil
}

func (s *Service) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decode(w, r, &body); err != nil {
		fail(w, err)
		return
	}
	d, err := body.duration()
	if err != nil {
		fail(w, err)
		return
	}
	_, _, m, err := s.find(r)
	if err != nil {
		fail(w, err)
		return
	}
	m.EndAt = time.Now().Add(d)
	if err := s.cfg.Store.Teams().PutSandboxMeta(r.Context(), m); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// metrics answers one sample, now, of what the sandbox uses, as its
// node measures it from outside (api.Usage): reading it neither wakes
// the sandbox nor keeps it from idling. E2B keeps a series of samples;
// here each call is a sample of its own.
func (s *Service) metrics(w http.ResponseWriter, r *http.Request) {
	n, sb, _, err := s.find(r)
	if err != nil {
		fail(w, err)
		return
	}
	now := time.Now()
	// start and end (Unix seconds, both optional) bound the samples; the
	// one sample here is of now.
	for _, bound := range []struct {
		name  string
		after bool
	}{{"start", false}, {"end", true}} {
		v := r.URL.Query().Get(bound.name)
		if v == "" {
			continue
		}
		at, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			fail(w, errdefs.New(errdefs.ErrBadInput, "%s %q: want Unix seconds", bound.name, v))
			return
		}
		if bound.after && now.Unix() > at || !bound.after && now.Unix() < at {
			writeJSON(w, http.StatusOK, []map[string]any{})
			return
		}
	}
	u, err := n.Usage(r.Context(), sb.ID)
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, []map[string]any{{
		"timestamp": u.At.UTC(), "timestampUnix": u.At.Unix(), "cpuCount": u.CPUCount, "cpuUsedPct": u.CPUPct,
		"memUsed": u.MemBytes, "memTotal": u.MemLimitBytes, "memCache": u.MemCacheBytes,
		"diskUsed": u.DiskBytes, "diskTotal": u.DiskLimitBytes,
	}})
}

// listed is every sandbox the caller may see, with what is kept of it,
// oldest first.
func (s *Service) listed(r *http.Request) ([]detail, error) {
	vis, err := s.sbx.List(r.Context())
	if err != nil {
		return nil, err
	}
	out := make([]detail, 0, len(vis))
	for _, v := range vis {
		if v.Meta.SnapshotOf != "" {
			continue // a snapshot: listed by GET /snapshots
		}
		out = append(out, s.detail(v.Sandbox, v.Meta, false, s.domainFor(r)))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.Before(out[j].StartedAt)
		}
		return out[i].SandboxID < out[j].SandboxID
	})
	return out, nil
}

// listV1 is GET /sandboxes: the running ones (E2B's v1 list), filtered by
// metadata.
func (s *Service) listV1(w http.ResponseWriter, r *http.Request) {
	all, err := s.listed(r)
	if err != nil {
		fail(w, err)
		return
	}
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		fail(w, err)
		return
	}
	f.states = map[string]bool{"running": true}
	out := []detail{}
	for _, d := range all {
		if f.match(d) {
			out = append(out, d)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// pageLimit is a list's limit query parameter: 1 to 1000, 100 if unset
// (E2B's).
func pageLimit(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return 100, nil
	}
	limit, err := strconv.Atoi(v)
	if err != nil || limit < 1 || limit > 1000 {
		return 0, errdefs.New(errdefs.ErrBadInput, "limit %q: want 1 to 1000", v)
	}
	return limit, nil
}

// listV2 is GET /v2/sandboxes: filters metadata, state, template and
// startedAfter; order by start (desc unless asc); limit; paging by an
// opaque nextToken, answered in the x-next-token header (the SDK's
// paginator reads it there) only when another page exists.
func (s *Service) listV2(w http.ResponseWriter, r *http.Request) {
	all, err := s.listed(r)
	if err != nil {
		fail(w, err)
		return
	}
	q := r.URL.Query()
	f, err := parseFilter(q)
	if err != nil {
		fail(w, err)
		return
	}
	limit, err := pageLimit(q)
	if err != nil {
		fail(w, err)
		return
	}
	desc := true // E2B's default
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		desc = false
	default:
		fail(w, errdefs.New(errdefs.ErrBadInput, "order %q: want asc or desc", o))
		return
	}
	out, next := page(all, f, desc, limit, q.Get("nextToken"))
	if next != "" {
		w.Header().Set("x-next-token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// page is one page of the sandboxes all (oldest first) that f keeps, in
// the order asked, after the token of the page before, and the token of
// the next page if there is one. The token is the page's last sandbox's
// start time and ID, the list's order: a sandbox made or deleted between
// two pages neither moves another across the cut nor is listed twice.
func page(all []detail, f filter, desc bool, limit int, after string) ([]detail, string) {
	beyond := func(d detail) bool { return after == "" || pageKey(d) > after }
	if desc {
		beyond = func(d detail) bool { return after == "" || pageKey(d) < after }
	}
	out := []detail{}
	for i := range all {
		d := all[i]
		if desc {
			d = all[len(all)-1-i]
		}
		if !f.match(d) || !beyond(d) {
			continue
		}
		if len(out) == limit {
			return out, pageKey(out[len(out)-1])
		}
		out = append(out, d)
	}
	return out, ""
}

func pageKey(d detail) string {
	return fmt.Sprintf("%016x.%s", d.StartedAt.UnixMilli(), d.SandboxID)
}

type filter struct {
	metadata     map[string]string
	states       map[string]bool
	template     string
	startedAfter time.Time
}

// parseFilter reads E2B's list filters. metadata is one query parameter
// holding a URL-encoded query string ("k1=v1&k2=v2"; js-sdk
// sandboxApi.ts list); state is "running", "paused", or both, as a
// comma list or repeated.
func parseFilter(q url.Values) (filter, error) {
	f := filter{metadata: map[string]string{}}
	if v := q.Get("metadata"); v != "" {
		md, err := url.ParseQuery(v)
		if err != nil {
			return f, errdefs.New(errdefs.ErrBadInput, "metadata %q: want key=value pairs joined by &: %v", v, err)
		}
		// The SDK encodes each key and value before it joins them, and
		// the whole once more as the query's value: one more unescape.
		for k := range md {
			key, kerr := url.QueryUnescape(k)
			val, verr := url.QueryUnescape(md.Get(k))
			if kerr != nil || verr != nil {
				return f, errdefs.New(errdefs.ErrBadInput, "metadata %q: %q is not URL-encoded", v, k)
			}
			f.metadata[key] = val
		}
	}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st = strings.TrimSpace(st); st != "running" && st != "paused" {
				return f, errdefs.New(errdefs.ErrBadInput, "state %q: want running or paused", st)
			}
			if f.states == nil {
				f.states = map[string]bool{}
			}
			f.states[strings.TrimSpace(st)] = true
		}
	}
	f.template = q.Get("template")
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, errdefs.New(errdefs.ErrBadInput, "startedAfter %q: want an RFC 3339 time", v)
		}
		f.startedAfter = t
	}
	return f, nil
}

func (f filter) match(d detail) bool {
	for k, v := range f.metadata {
		if d.Metadata[k] != v {
			return false
		}
	}
	if f.states != nil && !f.states[d.State] {
		return false
	}
	if f.template != "" && d.TemplateID != f.template {
		return false
	}
	// Inclusive, as E2B's.
	return !d.StartedAt.Before(f.startedAfter)
}
