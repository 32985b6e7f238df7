package master

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/e2b"
	"sandstorm/internal/envd"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/store"
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
	k, err := s.cfg.Store.APIKeyByHash(r.Context(), apikey.Hash(key))
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
	case strings.HasPrefix(p, "/e2b/"), p == "/v1/sandboxes", strings.HasPrefix(p, "/v1/sandboxes/"):
		return !strings.HasSuffix(p, "/move") // a move is the operator's (nodes)
	case p == "/v1/templates", strings.HasPrefix(p, "/v1/templates/"):
		return r.Method == http.MethodGet
	}
	return false
}

// owns reports whether the caller may see sandbox id: the operator sees
// all; a team the sandboxes it made (a sandbox no team made is the
// operator's).
func (s *server) owns(ctx context.Context, id string) bool {
	c := apikey.From(ctx)
	if c.Operator {
		return true
	}
	m, err := s.cfg.Store.GetSandboxMeta(ctx, id)
	return err == nil && c.Sees(m.Team)
}

func notYours(ref string) error {
	return errdefs.New(errdefs.ErrNotFound, "sandbox %q: not found", ref)
}

// visible is what of all the caller may see.
func (s *server) visible(ctx context.Context, all []api.Sandbox) []api.Sandbox {
	c := apikey.From(ctx)
	if c.Operator {
		return all
	}
	metas, err := s.cfg.Store.SandboxMetas(ctx)
	if err != nil {
		return nil
	}
	mine := map[string]bool{}
	for _, m := range metas {
		if c.Sees(m.Team) {
			mine[m.ID] = true
		}
	}
	var out []api.Sandbox
	for _, sb := range all {
		if mine[sb.ID] {
			out = append(out, sb)
		}
	}
	return out
}

// own records that the caller's team owns new sandbox id.
func (s *server) own(ctx context.Context, id string) error {
	return s.cfg.Store.PutSandboxMeta(ctx, store.SandboxMeta{ID: id, Team: apikey.From(ctx).Team, StartedAt: time.Now()})
}

// withEnv puts sandbox id's environment (E2B's envVars) on an envd call,
// replacing whatever the caller sent in that header.
func (s *server) withEnv(r *http.Request, id string) error {
	r.Header.Del(envd.EnvHeader)
	m, err := s.cfg.Store.GetSandboxMeta(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && len(m.Env) == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	r.Header.Set(envd.EnvHeader, envd.EncodeEnv(m.Env))
	return nil
}

// isSandboxTraffic: what the E2B SDK sends to a sandbox rather than to
// the API (js-sdk src/sandbox/index.ts sets E2b-Sandbox-Id on every envd
// call; src/connectionConfig.ts getHost names <port>-<id>.<domain>).
func (s *server) isSandboxTraffic(r *http.Request) bool {
	if r.Header.Get("E2b-Sandbox-Id") != "" {
		return true
	}
	_, _, ok := e2b.SandboxHost(r.Host, s.cfg.SandboxDomain)
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
	if err := s.cfg.Store.PutAPIKey(r.Context(), row); err != nil {
		s.fail(w, r, err)
		return
	}
	s.cfg.Log.Info("api key created", "id", row.ID, "team", row.Team)
	out := wireKey(row)
	out.Key = key
	writeJSON(w, http.StatusCreated, out)
}

func (s *server) listKeys(w http.ResponseWriter, r *http.Request) {
	rows, err := s.cfg.Store.APIKeys(r.Context())
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
	if err := s.cfg.Store.DeleteAPIKey(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	s.cfg.Log.Info("api key revoked", "id", r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
}

func wireKey(k store.APIKey) api.APIKey {
	return api.APIKey{ID: k.ID, Team: k.Team, Last4: k.Last4, CreatedAt: k.CreatedAt}
}
