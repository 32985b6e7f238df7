package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strconv"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/store"
)

// Traffic serves what the SDK sends to a sandbox: its envd, addressed by
// the E2b-Sandbox-Id and E2b-Sandbox-Port headers (E2B_SANDBOX_URL) or by
// a Host of 49983-<id>.<domain>. It is checked by the sandbox's own access
// token (X-Access-Token; every sandbox has one — E2B's secure: false is
// not honoured: an envd anyone who knows an ID could drive is not
// offered), which is not forwarded into the sandbox. The call wakes the
// sandbox from any tier, as traffic does; a sandbox that is gone answers
// 502, which the SDK reads as "not found".
func (s *Service) Traffic() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
		if id == "" {
			port, id, _ = api.SandboxHost(r.Host, s.cfg.Domain)
		}
		if port == "" {
			port = strconv.Itoa(api.EnvdPort)
		}
		if port != strconv.Itoa(api.EnvdPort) {
			fail(w, errdefs.New(errdefs.ErrNotSupported, "port %s of sandbox %s: only envd (port %d) is served here; a sandbox's own ports are at its endpoints (sandstormd sandbox get)", port, id, api.EnvdPort))
			return
		}
		got := r.Header.Get("X-Access-Token")
		switch {
		case got == "" && r.URL.Query().Has("signature"):
			// A signed URL (signature.go): its signature is its authority.
			if why := signedFor(r.Method, r.URL.Path, r.URL.Query(), s.AccessToken(id), time.Now()); why != "" {
				writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": why})
				return
			}
		case got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.AccessToken(id))) != 1:
			fail(w, errdefs.New(errdefs.ErrUnauthorized, "sandbox %s: missing or wrong X-Access-Token (the envdAccessToken its create or connect answered)", id))
			return
		}
		n, sb, err := s.cfg.Fleet.Find(r.Context(), id)
		if errors.Is(err, errdefs.ErrNotFound) {
			gone(w, id)
			return
		}
		if err != nil {
			fail(w, err) // its node lost: 503, Retry-After
			return
		}
		m, err := s.cfg.Store.Teams().GetSandboxMeta(r.Context(), sb.ID)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			fail(w, err)
			return
		}
		if m.Paused {
			// Traffic wakes a sandbox (the product's rule, and E2B's
			// autoResume): it is running again, with E2B's default
			// lifetime from now, as a connect without one gives.
			m.Paused, m.EndAt = false, time.Now().Add(DefaultTimeout)
			if err := s.cfg.Store.Teams().PutSandboxMeta(r.Context(), m); err != nil {
				fail(w, err)
				return
			}
		}
		for _, h := range []string{"X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Api-Key", api.EnvdEnvHeader} {
			r.Header.Del(h)
		}
		if len(m.Env) > 0 {
			r.Header.Set(api.EnvdEnvHeader, api.EncodeEnv(m.Env))
		}
		if err := n.ServeEnvd(w, r, sb.ID, r.URL.Path); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				gone(w, id)
				return
			}
			fail(w, err)
		}
	})
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

func (s *Service) end(ctx context.Context, m store.SandboxMeta) error {
	n, sb, err := s.cfg.Fleet.Find(ctx, m.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return s.cfg.Store.Teams().DeleteSandboxMeta(ctx, m.ID)
	}
	if err != nil {
		return err
	}
	if m.AutoPause {
		if sb.Tier != api.TierSnapshot {
			if _, err := n.Transition(ctx, sb.ID, nodeapi.Snapshot); err != nil {
				return err
			}
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
