package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
)

// Traffic serves what the SDK sends to a sandbox, addressed by the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers (E2B_SANDBOX_URL) or by a
// Host of <port>-<id>.<domain>: its envd (port 49983), checked by the
// sandbox's own access token (X-Access-Token, or a signed URL's
// signature; every sandbox has one — E2B's secure: false is not
// honoured: an envd anyone who knows an ID could drive is not offered),
// and its code interpreter's /execute (interpreterOpen) alike,
// or any other port of it, open to whoever has its name (E2B's public
// traffic) unless it was made with allowPublicTraffic false, when its
// traffic access token is asked. Neither token is forwarded into the
// sandbox. The call wakes the sandbox from any tier, as traffic does; a
// sandbox that is gone answers 502, which the SDK reads as "not found".
func (s *Service) Traffic() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
		if id == "" {
			port, id, _ = api.SandboxHost(r.Host, s.cfg.Domain)
		}
		p := api.EnvdPort
		if port != "" {
			var err error
			if p, err = strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
				fail(w, errdefs.New(errdefs.ErrBadInput, "port %q of sandbox %s: want 1-65535", port, id))
				return
			}
		}
		if (p == api.EnvdPort || p == api.CodeInterpreterPort && !interpreterOpen(r.URL.Path)) && !s.envdAllowed(w, r, id) {
			return
		}
		n, sb, m, ok := s.trafficTo(w, r, id, p)
		if !ok {
			return
		}
		for _, h := range []string{"X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Api-Key", api.EnvdEnvHeader, TrafficTokenHeader} {
			r.Header.Del(h)
		}
		var err error
		if p == api.EnvdPort {
			if len(m.Env) > 0 {
				r.Header.Set(api.EnvdEnvHeader, api.EncodeEnv(m.Env))
			}
			err = n.ServeEnvd(w, r, sb.ID, r.URL.Path)
		} else {
			if p == api.CodeInterpreterPort && len(m.Env) > 0 {
				// The code interpreter's kernels get the sandbox's
				// environment as envd's commands do.
				r.Header.Set(api.EnvdEnvHeader, api.EncodeEnv(m.Env))
			}
			if m.MaskHost != "" {
				// E2B's maskRequestHost: the Host the sandbox's server
				// sees, ${PORT} its port.
				r.Host = strings.ReplaceAll(m.MaskHost, "${PORT}", strconv.Itoa(p))
			}
			err = n.ServePort(w, r, sb.ID, p)
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			gone(w, id)
		} else if err != nil {
			fail(w, err)
		}
	})
}

// interpreterOpen says whether a call to the code interpreter's port
// needs no envd token. Its /execute runs code as envd does, and the port
// is in the sandbox's public name (49999-<id>.<domain>, the ID also in
// every public port's), so it takes envd's token, which the SDK sends
// there; its calls on contexts, which the SDK sends without it (E2B's
// server checks none), and /health are open as any public port is.
// Anything else needs the token (fail closed).
func interpreterOpen(p string) bool {
	if path.Clean(p) != p { // no /contexts/../execute
		return false
	}
	return p == "/health" || p == "/contexts" || strings.HasPrefix(p, "/contexts/")
}

// TrafficTokenHeader carries a sandbox's traffic access token (E2B's
// allowPublicTraffic: false).
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// envdAllowed checks a call for sandbox id's envd: its access token, or
// a signed URL's signature (signature.go). If not, it has answered.
func (s *Service) envdAllowed(w http.ResponseWriter, r *http.Request, id string) bool {
	got := r.Header.Get("X-Access-Token")
	switch {
	case got == "" && r.URL.Query().Has("signature"):
		if why := signedFor(r.Method, r.URL.Path, r.URL.Query(), s.AccessToken(id), time.Now()); why != "" {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": why})
			return false
		}
	case got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.AccessToken(id))) != 1:
		fail(w, errdefs.New(errdefs.ErrUnauthorized, "sandbox %s: missing or wrong X-Access-Token (the envdAccessToken its create or connect answered)", id))
		return false
	}
	return true
}

// trafficTo finds the sandbox traffic is for, with what is kept of it;
// a private one's traffic must carry its token; a paused one answers 502
// until a connect, unless it was made with autoResume, when traffic
// resumes it. If it cannot be served, it has answered.
func (s *Service) trafficTo(w http.ResponseWriter, r *http.Request, id string, port int) (nodeapi.Node, api.Sandbox, store.SandboxMeta, bool) {
	n, sb, err := s.cfg.Fleet.Find(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		gone(w, id)
		return nil, sb, store.SandboxMeta{}, false
	}
	if err != nil {
		fail(w, err) // its node lost: 503, Retry-After
		return nil, sb, store.SandboxMeta{}, false
	}
	m, err := s.cfg.Store.Teams().GetSandboxMeta(r.Context(), sb.ID)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		fail(w, err)
		return nil, sb, m, false
	}
	if m.Private && port != api.EnvdPort && !s.trafficAllowed(r, sb.ID) {
		fail(w, errdefs.New(errdefs.ErrForbidden, "sandbox %s takes traffic with its traffic access token only (%s)", id, TrafficTokenHeader))
		return nil, sb, m, false
	}
	if m.Paused && !m.AutoResume {
		// E2B's paused is the user's state: only a connect ends it.
		// Its proxy answers 502, which the SDK's isRunning reads as not
		// running (idle tiers, the product's own, are not this: traffic
		// wakes them).
		writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "The sandbox is paused: connect to it to resume it", "sandboxId": id})
		return nil, sb, m, false
	}
	if m.Paused {
		// autoResume: running again, with E2B's default lifetime from
		// now, as a connect without one gives.
		m.Paused, m.EndAt = false, time.Now().Add(DefaultTimeout)
		if err := s.cfg.Store.Teams().PutSandboxMeta(r.Context(), m); err != nil {
			fail(w, err)
			return nil, sb, m, false
		}
	}
	return n, sb, m, true
}

// trafficAllowed: r carries sandbox id's traffic access token.
func (s *Service) trafficAllowed(r *http.Request, id string) bool {
	got := r.Header.Get(TrafficTokenHeader)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.TrafficToken(id))) == 1
}

// gone is the answer for a sandbox that is not there: 502, as E2B's proxy
// gives and the SDK expects (js-sdk src/envd/api.ts, handleEnvdApiError).
func gone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "The sandbox was not found", "sandboxId": id})
}

// Run ends sandboxes whose lifetime is over until ctx ends: each is killed,
// or with autoPause snapshotted (and listed paused until a connect). It
// looks four times a second, so a sandbox ends within about a quarter of
// a second of its time. A failure is logged and tried again 5 s later.
func (s *Service) Run(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	retry := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due, err := s.cfg.Store.Teams().DueSandboxMetas(ctx, now)
			if err != nil {
				continue
			}
			for _, m := range due {
				if now.Before(retry[m.ID]) {
					continue
				}
				if err := s.end(ctx, m); err != nil {
					s.cfg.Log.Warn("e2b: ending a sandbox at its timeout failed; trying again in 5 s", "id", m.ID, "err", err)
					retry[m.ID] = now.Add(5 * time.Second)
					continue
				}
				delete(retry, m.ID)
			}
		}
	}
}

func (s *Service) end(ctx context.Context, due store.SandboxMeta) error {
	defer s.sbx.Lock(due.ID)()
	// Read again under the lock: a connect or timeout may have moved
	// its end, or a pause or kill come first.
	m, err := s.cfg.Store.Teams().GetSandboxMeta(ctx, due.ID)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && (m.Paused || m.EndAt.IsZero() || m.EndAt.After(time.Now())) {
		return nil
	}
	if err != nil {
		return err
	}
	n, sb, err := s.cfg.Fleet.Find(ctx, m.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return s.cfg.Store.Teams().DeleteSandboxMeta(ctx, m.ID)
	}
	if err != nil {
		return err
	}
	if m.AutoPause {
		if err := sandboxes.PauseTo(ctx, n, sb, !m.PauseDropsMemory); err != nil {
			return err
		}
		m.Paused, m.EndAt = true, time.Time{}
		s.cfg.Log.Info("e2b sandbox paused at its timeout", "id", sb.ID)
		return s.cfg.Store.Teams().PutSandboxMeta(ctx, m)
	}
	if err := s.cfg.Fleet.Delete(ctx, n, sb); err != nil {
		return err
	}
	s.cfg.Log.Info("e2b sandbox killed at its timeout", "id", sb.ID)
	return s.cfg.Store.Teams().DeleteSandboxMeta(ctx, m.ID)
}
