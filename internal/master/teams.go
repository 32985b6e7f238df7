package master

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// Teams: an API key is its team's (internal/apikey). A team sees and
// touches only its own sandboxes — another team's answers 404, exactly as
// one that does not exist, so that IDs do not leak — and uses the
// operator's templates; everything else (templates, nodes, keys) needs
// the operator's token.

// keyOf is the API key a request carries: the E2B SDK's X-API-KEY, or
// Authorization: Bearer e2b_….
func keyOf(r *http.Request) string {
	if k := r.Header.Get("X-API-KEY"); k != "" {
		return k
	}
	if k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && strings.HasPrefix(k, apikey.Prefix) {
		return k
	}
	return ""
}

func (s *server) teamOf(r *http.Request, key string) (apikey.Caller, error) {
	if !apikey.Valid(key) {
		return apikey.Caller{}, errdefs.New(errdefs.ErrUnauthorized, "API key: not the shape of one (e2b_ and 40 hex digits)")
	}
	k, err := s.cfg.Store.Teams().APIKeyByHash(r.Context(), apikey.Hash(key))
	if errors.Is(err, errdefs.ErrNotFound) {
		return apikey.Caller{}, errdefs.New(errdefs.ErrUnauthorized, "API key: unknown or revoked")
	}
	if err != nil {
		return apikey.Caller{}, err
	}
	return apikey.Caller{Team: k.Team}, nil
}

// teamMay reports whether a team's key may make request r at all.
func teamMay(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case p == "/v1/snapshots", strings.HasPrefix(p, "/v1/snapshots/"), p == "/v1/secrets", strings.HasPrefix(p, "/v1/secrets/"):
		return true // its own (sandboxes.Service)
	case strings.HasPrefix(p, "/e2b/"), p == "/v1/sandboxes", strings.HasPrefix(p, "/v1/sandboxes/"):
		return !strings.HasSuffix(p, "/move") // a move is the operator's (nodes)
	case p == "/v1/templates", strings.HasPrefix(p, "/v1/templates/"):
		return r.Method == http.MethodGet
	}
	return false
}

// settings checks what a create asks beyond its template (env, labels, a
// lifetime) and is what the master keeps of it, for sandbox id once made.
func settings(req api.SandboxRequest) (store.SandboxMeta, error) {
	m := store.SandboxMeta{Env: req.Env, Metadata: req.Labels}
	if err := sandboxes.CheckSettings(req.Env, req.Labels); err != nil {
		return m, err
	}
	if _, err := (tier.Timers{}).With(req.Idle); err != nil {
		return m, badRequest("%v", err)
	}
	if e := req.Egress; e != nil {
		if err := egress.AllowAlone(e.AllowOut, e.DenyOut); err != nil {
			return m, badRequest("egress: %v", err)
		}
	}
	d, autoPause, err := sandboxes.CheckLifetime(req.Lifetime, req.OnTimeout)
	if err != nil {
		return m, err
	}
	m.AutoPause = autoPause
	if req.Lifetime != "" {
		m.EndAt = time.Now().Add(d)
	}
	return m, nil
}

// decorate adds what the master keeps of each sandbox (labels, lifetime,
// team) to what its node reports.
func (s *server) decorate(ctx context.Context, sbs []api.Sandbox) []api.Sandbox {
	byID := map[string]store.SandboxMeta{}
	if len(sbs) == 1 {
		// One sandbox (a get, a create): its own row, not every row.
		if m, err := s.cfg.Store.Teams().GetSandboxMeta(ctx, sbs[0].ID); err == nil {
			byID[m.ID] = m
		}
	} else if metas, err := s.cfg.Store.Teams().SandboxMetas(ctx); err == nil {
		for _, m := range metas {
			byID[m.ID] = m
		}
	}
	for i := range sbs {
		if m, ok := byID[sbs[i].ID]; ok {
			sbs[i] = withMeta(sbs[i], m)
		}
	}
	return sbs
}

// byLabels keeps the sandboxes that carry every label=value of q's
// "label" parameters.
func byLabels(sbs []api.Sandbox, labels []string) ([]api.Sandbox, error) {
	want := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, badRequest("label %q: want key=value", l)
		}
		want[k] = v
	}
	var out []api.Sandbox
next:
	for _, sb := range sbs {
		for k, v := range want {
			if got, ok := sb.Labels[k]; !ok || got != v {
				continue next
			}
		}
		out = append(out, sb)
	}
	return out, nil
}

// withEnv puts sandbox id's environment (E2B's envVars) on an envd call,
// replacing whatever the caller sent in that header.
func (s *server) withEnv(r *http.Request, id string) error {
	r.Header.Del(api.EnvdEnvHeader)
	m, err := s.cfg.Store.Teams().GetSandboxMeta(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && len(m.Env) == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	r.Header.Set(api.EnvdEnvHeader, api.EncodeEnv(m.Env))
	return nil
}

// isSandboxTraffic: what the E2B SDK sends to a sandbox rather than to
// the API (js-sdk src/sandbox/index.ts sets E2b-Sandbox-Id on every envd
// call; src/connectionConfig.ts getHost names <port>-<id>.<domain>).
func (s *server) isSandboxTraffic(r *http.Request) bool {
	if r.Header.Get("E2b-Sandbox-Id") != "" {
		return true
	}
	_, _, ok := api.SandboxHost(r.Host, s.cfg.SandboxDomain)
	return ok
}

// createKey serves POST /v1/api-keys {team}: a new key for team, shown
// this once.
func (s *server) createKey(w http.ResponseWriter, r *http.Request) {
	var req api.APIKeyRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if !api.ValidName(req.Team) {
		s.fail(w, r, badRequest("team %q: want 1-63 of a-z, 0-9 and '-'", req.Team))
		return
	}
	key, row := apikey.New(req.Team, time.Now())
	if err := s.cfg.Store.Teams().PutAPIKey(r.Context(), row); err != nil {
		s.fail(w, r, err)
		return
	}
	s.cfg.Log.Info("api key created", "id", row.ID, "team", row.Team)
	out := wireKey(row)
	out.Key = key
	writeJSON(w, http.StatusCreated, out)
}

func (s *server) listKeys(w http.ResponseWriter, r *http.Request) {
	rows, err := s.cfg.Store.Teams().APIKeys(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.List[api.APIKey]{Items: []api.APIKey{}}
	for _, k := range rows {
		out.Items = append(out.Items, wireKey(k))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) deleteKey(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Store.Teams().DeleteAPIKey(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	s.cfg.Log.Info("api key revoked", "id", r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
}

// putSecret serves POST /v1/secrets {name, value, hosts}: stored for the
// caller's team, answered without its value.
func (s *server) putSecret(w http.ResponseWriter, r *http.Request) {
	var req api.SecretRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	out, err := s.sbx.PutSecret(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *server) listSecrets(w http.ResponseWriter, r *http.Request) {
	out, err := s.sbx.ListSecrets(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.List[api.Secret]{Items: out})
}

func (s *server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.sbx.DeleteSecret(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func wireKey(k store.APIKey) api.APIKey {
	return api.APIKey{ID: k.ID, Team: k.Team, Last4: k.Last4, CreatedAt: k.CreatedAt}
}

// withMeta is sb with what the master keeps of it (labels, team, its end)
// as /v1 shows them.
func withMeta(sb api.Sandbox, m store.SandboxMeta) api.Sandbox {
	sb.Labels, sb.Team, sb.Paused = m.Metadata, m.Team, m.Paused
	if m.SnapshotOf != "" && sb.Note == "" {
		sb.Note = "the snapshot " + m.ID + " of sandbox " + m.SnapshotOf + " (sandstormd snapshot ls)"
	}
	if len(sb.Labels) == 0 {
		sb.Labels = nil
	}
	if !m.EndAt.IsZero() {
		end := m.EndAt
		sb.EndsAt = &end
		sb.OnTimeout = "delete"
		if m.AutoPause {
			sb.OnTimeout = "snapshot"
		}
	}
	return sb
}
