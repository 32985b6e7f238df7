package e2b

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/sandboxtraffic"
	"sandstorm/internal/store"
)

// Traffic serves what the SDK sends to a sandbox (sandboxtraffic.Target:
// its envd, its code interpreter, its own ports), checked by E2B's rules
// (sandboxtraffic.Check), which every node's ingress applies alike
// (internal/ingress). Neither token is forwarded into the sandbox. The
// call wakes the sandbox from any tier, as traffic does; a sandbox that
// is gone answers 502, which the SDK reads as "not found".
func (s *Service) Traffic() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, p, err := sandboxtraffic.Target(r, s.cfg.Domain)
		if err != nil {
			fail(w, err)
			return
		}
		// The envd token first, before anything says whether the
		// sandbox exists; a private one's traffic token once it is known
		// to be (trafficTo).
		if !sandboxtraffic.Check(w, r, id, p, s.tokens(id, false)) {
			return
		}
		n, sb, m, ok := s.trafficTo(w, r, id, p)
		if !ok {
			return
		}
		sandboxtraffic.Strip(r.Header)
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
			sandboxtraffic.Gone(w, id)
		} else if err != nil {
			fail(w, err)
		}
	})
}

// tokens are sandbox id's, for sandboxtraffic.Check.
func (s *Service) tokens(id string, private bool) sandboxtraffic.Tokens {
	return sandboxtraffic.Tokens{Access: s.AccessToken(id), Traffic: s.TrafficToken(id), Private: private}
}

// trafficTo finds the sandbox traffic is for, with what is kept of it;
// a private one's traffic must carry its token; a paused one answers 502
// until a connect, unless it was made with autoResume, when traffic
// resumes it. If it cannot be served, it has answered.
func (s *Service) trafficTo(w http.ResponseWriter, r *http.Request, id string, port int) (nodeapi.Node, api.Sandbox, store.SandboxMeta, bool) {
	n, sb, err := s.cfg.Fleet.Find(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		sandboxtraffic.Gone(w, id)
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
	if port != api.EnvdPort && !sandboxtraffic.Check(w, r, sb.ID, port, s.tokens(sb.ID, m.Private)) {
		return nil, sb, m, false
	}
	if m.Paused && !m.AutoResume {
		sandboxtraffic.PausedAnswer(w, id)
		return nil, sb, m, false
	}
	if m.Paused {
		if err := s.resumeOnTraffic(r.Context(), &m); err != nil {
			fail(w, err)
			return nil, sb, m, false
		}
	}
	return n, sb, m, true
}

// resumeOnTraffic resumes m, paused with autoResume, because traffic
// reached it: running again, with E2B's default lifetime from now, as a
// connect without one gives; every ingress is pushed the change.
func (s *Service) resumeOnTraffic(ctx context.Context, m *store.SandboxMeta) error {
	m.Paused, m.EndAt = false, time.Now().Add(DefaultTimeout)
	if err := s.cfg.Store.Teams().PutSandboxMeta(ctx, *m); err != nil {
		return err
	}
	s.routesChanged()
	return nil
}

// ResumeAsked is a node's ask (fleet.Config.Resume) that sandbox id be
// resumed: its ingress had traffic for it, checked by its tokens there,
// while it was paused. Only a sandbox made with autoResume is, as its
// traffic through the master's proxy would resume it (trafficTo); one
// running already, or paused without autoResume, is left as it is.
func (s *Service) ResumeAsked(node, id string) {
	// Under its lock, read afresh: a pause or connect running now ends
	// first, and what it left is what is resumed (issue 31, item 7).
	defer s.sbx.Lock(id)()
	ctx, cancel := context.WithTimeout(context.Background(), resumeAskTimeout)
	defer cancel()
	m, err := s.cfg.Store.Teams().GetSandboxMeta(ctx, id)
	if err != nil || !m.Paused || !m.AutoResume {
		return
	}
	if err := s.resumeOnTraffic(ctx, &m); err != nil {
		s.cfg.Log.Warn("e2b: a resume asked by a node's ingress failed", "node", node, "id", id, "err", err)
		return
	}
	s.cfg.Log.Info("e2b: resumed by traffic at a node's ingress", "node", node, "id", id)
}

// resumeAskTimeout bounds the store's work for one node's ask: the
// ingress that asked waits about as long (ingress.resumeWait).
const resumeAskTimeout = 5 * time.Second

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
		defer s.routesChanged()
		return s.cfg.Store.Teams().PutSandboxMeta(ctx, m)
	}
	if err := s.cfg.Fleet.Delete(ctx, n, sb); err != nil {
		return err
	}
	s.cfg.Log.Info("e2b sandbox killed at its timeout", "id", sb.ID)
	return s.cfg.Store.Teams().DeleteSandboxMeta(ctx, m.ID)
}
