// Package sandboxtraffic is E2B's rules for traffic to a sandbox — its
// envd, its code interpreter, its own ports — as two places apply them
// alike: the master's /e2b proxy (internal/e2b, traffic.go) and every
// node's ingress (internal/ingress), which checks them without asking the
// master. Who is asking for which sandbox and port (Target), whether the
// request may pass (Check), what is stripped before it goes in (Strip),
// and the answers E2B's proxy gives when it may not (Gone, PausedAnswer).
package sandboxtraffic

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
)

// TrafficTokenHeader carries a sandbox's traffic access token (E2B's
// allowPublicTraffic: false).
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// Target is the sandbox and port a request is for: E2b-Sandbox-Id and
// E2b-Sandbox-Port (E2B_SANDBOX_URL), or a Host of <port>-<id>.<domain>;
// no port is envd's.
func Target(r *http.Request, domain string) (id string, port int, err error) {
	id, p := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if id == "" {
		p, id, _ = api.SandboxHost(r.Host, domain)
	}
	port = api.EnvdPort
	if p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return id, 0, errdefs.New(errdefs.ErrBadInput, "port %q of sandbox %s: want 1-65535", p, id)
		}
	}
	return id, port, nil
}

// Tokens are what a sandbox's traffic is checked against.
type Tokens struct {
	Access  string // its envd access token
	Traffic string // its traffic access token
	Private bool   // its ports take its traffic token only
}

// Check says whether r may go to port of sandbox id, whose tokens are
// tok; if not, it has answered. Envd (and the code interpreter's
// /execute) take the sandbox's access token (X-Access-Token) or a
// signed URL's signature; every sandbox has one (E2B's secure: false is
// not honoured: an envd anyone who knows an ID could drive is not
// offered). Any other port is open to whoever has its name (E2B's public
// traffic) unless the sandbox is Private, when its traffic token is
// asked.
func Check(w http.ResponseWriter, r *http.Request, id string, port int, tok Tokens) bool {
	if (port == api.EnvdPort || port == api.CodeInterpreterPort && !InterpreterOpen(r.URL.Path)) && !envdAllowed(w, r, id, tok.Access) {
		return false
	}
	if port != api.EnvdPort && tok.Private && !tokenIs(r.Header.Get(TrafficTokenHeader), tok.Traffic) {
		Fail(w, errdefs.New(errdefs.ErrForbidden, "sandbox %s takes traffic with its traffic access token only (%s)", id, TrafficTokenHeader))
		return false
	}
	return true
}

// envdAllowed checks a call for sandbox id's envd: its access token, or
// a signed URL's signature (signature.go). If not, it has answered.
func envdAllowed(w http.ResponseWriter, r *http.Request, id, token string) bool {
	got := r.Header.Get("X-Access-Token")
	switch {
	case got == "" && r.URL.Query().Has("signature"):
		if why := signedFor(r.Method, r.URL.Path, r.URL.Query(), token, time.Now()); why != "" {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": why})
			return false
		}
	case !tokenIs(got, token):
		Fail(w, errdefs.New(errdefs.ErrUnauthorized, "sandbox %s: missing or wrong X-Access-Token (the envdAccessToken its create or connect answered)", id))
		return false
	}
	return true
}

func tokenIs(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// InterpreterOpen says whether a call to the code interpreter's port
// needs no envd token. Its /execute runs code as envd does, and the port
// is in the sandbox's public name (49999-<id>.<domain>, the ID also in
// every public port's), so it takes envd's token, which the SDK sends
// there; its calls on contexts, which the SDK sends without it (E2B's
// server checks none), and /health are open as any public port is.
// Anything else needs the token (fail closed).
func InterpreterOpen(p string) bool {
	if path.Clean(p) != p { // no /contexts/../execute
		return false
	}
	return p == "/health" || p == "/contexts" || strings.HasPrefix(p, "/contexts/")
}

// Strip removes from r what is for the proxy and not for the sandbox:
// the tokens, the addressing headers, a caller's own environment header
// (the proxy sets the sandbox's), the API key and a route's generation.
func Strip(h http.Header) {
	for _, k := range []string{"X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Api-Key", api.EnvdEnvHeader, TrafficTokenHeader, nodeapi.RouteGenerationHeader} {
		h.Del(k)
	}
}

// Gone is the answer for a sandbox that is not there: 502, as E2B's proxy
// gives and the SDK expects (js-sdk src/envd/api.ts, handleEnvdApiError).
func Gone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "The sandbox was not found", "sandboxId": id})
}

// PausedAnswer is the answer for a sandbox a client paused: E2B's paused
// is the user's state, and only a connect ends it. Its proxy answers
// 502, which the SDK's isRunning reads as not running (idle tiers, the
// product's own, are not this: traffic wakes them).
func PausedAnswer(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "The sandbox is paused: connect to it to resume it", "sandboxId": id})
}

// Fail answers err in E2B's error body, its status from errdefs.Table.
func Fail(w http.ResponseWriter, err error) {
	status, body := errdefs.ToWire(err)
	if d := errdefs.RetryAfter(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(d.Round(time.Second)/time.Second)))
	}
	writeJSON(w, status, map[string]any{"code": status, "message": body.Message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
