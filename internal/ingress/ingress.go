package ingress

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/metrics"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/sandboxtraffic"
)

// Config is an ingress's.
type Config struct {
	// Self is this node's name; Local its own side, which serves its
	// sandboxes.
	Self  string
	Local nodeapi.Node
	// Domain is the sandboxes' domain (<port>-<id>.<domain>).
	Domain string
	Table  *Table
	// Peer is the node name at address, over the nodes' mutual TLS
	// (enrol.Peers: a client per node, kept).
	Peer func(name, address string) (nodeapi.Node, error)
	Log  *slog.Logger
	// Metrics counts the requests' outcomes (nil: not counted).
	Metrics *metrics.Ingress
	// ResumeWait overrides resumeWait, StaleWait staleWait (tests).
	ResumeWait, StaleWait time.Duration
}

// staleWait bounds how long a request that found a route stale (the
// holder has no copy of its generation, or its copy is leaving: a move)
// waits for the master's next push before it goes by the route it has
// then (the same, if the move was undone).
const staleWait = 5 * time.Second

// resumeWait bounds how long traffic to a sandbox paused with autoResume
// waits for the master to resume it (Config.ResumeWait, if set).
const resumeWait = 5 * time.Second

// Handler serves E2B's traffic to the fleet's sandboxes, as the master's
// /e2b traffic does (internal/e2b, traffic.go), from the table alone.
func Handler(cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Counted also when the answer is cut short: a client that leaves
		// mid-answer (E2B's SDK and connect-go close a stream once its
		// command's end came, before the stream's own end) makes
		// ReverseProxy panic with http.ErrAbortHandler, and the request
		// counts as what it had become by then.
		var outcome string
		defer func() { cfg.Metrics.Request(cmp.Or(outcome, "failed")) }()
		outcome = cfg.handle(w, r, &outcome)
	})
}

// handle serves r and says what became of it (metrics.Ingress); what it
// is about to become is in *pending while it is served.
func (cfg Config) handle(w http.ResponseWriter, r *http.Request, pending *string) string {
	id, port, err := sandboxtraffic.Target(r, cfg.Domain)
	if err != nil {
		sandboxtraffic.Fail(w, err)
		return "refused"
	}
	rt, known := cfg.Table.Get(id)
	if !known {
		// No route: no sandbox of that ID in the fleet (or not yet
		// recorded). E2B's proxy says so as it does for a sandbox
		// deleted, which the SDK reads as "not found"; IDs are not
		// secrets (every public port's name holds one).
		sandboxtraffic.Gone(w, id)
		return "gone"
	}
	if !sandboxtraffic.Check(w, r, id, port, tokens(rt)) {
		return "refused"
	}
	if rt.Paused {
		var outcome string
		if rt, outcome = cfg.unpause(w, r, rt, port); outcome != "" {
			return outcome
		}
	}
	sandboxtraffic.Strip(r.Header)
	prepare(r, rt, port)
	// The holder checks the route before it reads a byte of the body,
	// and a peer is sent the body only once it said so (serve): a
	// request a stale route sent to the wrong copy is still whole, and
	// goes again by the new route.
	body := &trackedBody{rc: r.Body}
	r.Body = body
	outcome := "forwarded"
	if rt.Node == cfg.Self {
		outcome = "local"
	}
	*pending = outcome
	err = cfg.serve(w, r, rt, port)
	if errors.Is(err, errdefs.ErrNotFound) && !body.read {
		// The holder has no copy of this generation, or it is leaving: a
		// move landed (or is landing) and the master's push is on its way.
		ctx, cancel := context.WithTimeout(r.Context(), cmp.Or(cfg.StaleWait, staleWait))
		next, ok := cfg.Table.Next(ctx, id, rt.Generation)
		cancel()
		// The same generation still, once the wait is over: a move that
		// was undone, whose sandbox the holder serves again.
		if ok && !next.Paused && r.Context().Err() == nil {
			outcome, *pending = "retried", "retried"
			err = cfg.serve(w, r, next, port)
		}
	}
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		sandboxtraffic.Gone(w, id)
		return "gone"
	case err != nil:
		// Said in the log too: which hop failed is not in the answer
		// (a failure seen once in CI's TestIngress right after a move).
		if cfg.Log != nil {
			cfg.Log.Warn("ingress: a request failed", "id", id, "node", rt.Node, "generation", rt.Generation, "err", err)
		}
		sandboxtraffic.Fail(w, err)
		return "failed"
	}
	return outcome
}

// unpause serves traffic to a paused sandbox by E2B's rules: answered
// "paused", or, made with autoResume, resumed first. Only the master
// records a resume (its lifetime, its state), so the node asks it on its
// report stream (Table.AskResume) and waits for the push that says the
// sandbox runs; the tokens were checked already, so only traffic that
// may reach the sandbox asks. It returns the route to serve by, or the
// outcome it answered with.
func (cfg Config) unpause(w http.ResponseWriter, r *http.Request, rt nodeapi.Route, port int) (nodeapi.Route, string) {
	if !rt.AutoResume {
		sandboxtraffic.PausedAnswer(w, rt.ID)
		return rt, "refused"
	}
	next, known := rt, false
	until := time.Now().Add(cmp.Or(cfg.ResumeWait, resumeWait))
	if cfg.Table.AskResume(rt.ID, until) {
		ctx, cancel := context.WithDeadline(r.Context(), until)
		next, known = cfg.Table.Until(ctx, rt.ID, func(x nodeapi.Route, ok bool) bool { return !ok || !x.Paused })
		cancel()
	}
	switch {
	case !known && !next.Paused: // deleted meanwhile
		sandboxtraffic.Gone(w, rt.ID)
		return next, "gone"
	case next.Paused || !known:
		sandboxtraffic.Fail(w, errdefs.New(errdefs.ErrUnavailable, "sandbox %s is paused and its master has not resumed it (is the master up?): try again, or connect to it through the master's API (api.%s)", rt.ID, cfg.Domain))
		return next, "failed"
	case !sandboxtraffic.Check(w, r, next.ID, port, tokens(next)):
		return next, "refused" // its tokens changed meanwhile
	}
	return next, ""
}

// tokens are what rt's traffic is checked against.
func tokens(rt nodeapi.Route) sandboxtraffic.Tokens {
	return sandboxtraffic.Tokens{Access: rt.AccessToken, Traffic: rt.TrafficToken, Private: rt.Private}
}

// prepare sets what the sandbox is to see, as the master's proxy does:
// its environment for envd's commands and the code interpreter's
// kernels, E2B's maskRequestHost for its own ports.
func prepare(r *http.Request, rt nodeapi.Route, port int) {
	if (port == api.EnvdPort || port == api.CodeInterpreterPort) && len(rt.Env) > 0 {
		r.Header.Set(api.EnvdEnvHeader, api.EncodeEnv(rt.Env))
	}
	if port != api.EnvdPort && rt.MaskHost != "" {
		r.Host = strings.ReplaceAll(rt.MaskHost, "${PORT}", strconv.Itoa(port))
	}
}

// serve sends r to rt's holder: this node, or its peer.
func (cfg Config) serve(w http.ResponseWriter, r *http.Request, rt nodeapi.Route, port int) error {
	n := cfg.Local
	// A peer is sent a body only once it said so (100 Continue): one
	// that finds no copy of rt's generation refuses it unread. This
	// node's own side checks before it reads, and envd in the sandbox
	// is not asked to say it.
	r.Header.Del("Expect")
	if rt.Node != cfg.Self && r.ContentLength != 0 {
		r.Header.Set("Expect", "100-continue")
	}
	if rt.Node != cfg.Self {
		if rt.Address == "" {
			return errdefs.New(errdefs.ErrUnavailable, "sandbox %s is on node %s, which no other node can reach (the master's own, or behind NAT): use the master's API (api.%s)", rt.ID, rt.Node, cfg.Domain)
		}
		var err error
		if n, err = cfg.Peer(rt.Node, rt.Address); err != nil {
			return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", rt.Node, err))
		}
	}
	r.Header.Set(nodeapi.RouteGenerationHeader, strconv.FormatInt(rt.Generation, 10))
	if port == api.EnvdPort {
		return n.ServeEnvd(w, r, rt.ID, r.URL.Path)
	}
	return n.ServePort(w, r, rt.ID, port)
}

// trackedBody is a request's body that says whether any of it was read,
// and that the transport's close leaves open (the server closes it).
type trackedBody struct {
	rc   io.ReadCloser
	read bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read = true
	return b.rc.Read(p)
}

func (b *trackedBody) Close() error { return nil }
