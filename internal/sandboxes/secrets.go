package sandboxes

import (
	"context"
	"fmt"
	"maps"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/secrets"
	"sandstorm/internal/store"
)

// Secrets are the caller's team's own (the operator's are team ""): a
// team never reads, uses or learns of another's, and nobody reads a
// value back. Values are sealed under the master's key, bound to their
// team and name (secrets.Box).

func secretAD(team, name string) string { return "secret/" + team + "/" + name }

// PutSecret stores a secret for the caller's team, replacing one of the
// same name.
func (s *Service) PutSecret(ctx context.Context, req api.SecretRequest) (api.Secret, error) {
	if s.Secrets == nil {
		return api.Secret{}, errdefs.New(errdefs.ErrNotSupported, "this master keeps no secrets (no secrets key)")
	}
	if err := secrets.CheckName(req.Name); err != nil {
		return api.Secret{}, err
	}
	if err := secrets.CheckValue([]byte(req.Value)); err != nil {
		return api.Secret{}, err
	}
	hosts, err := secrets.CheckHosts(req.Hosts)
	if err != nil {
		return api.Secret{}, err
	}
	team := apikey.From(ctx).Team
	row := store.Secret{Team: team, Name: req.Name, Sealed: s.Secrets.Seal([]byte(req.Value), secretAD(team, req.Name)),
		Hosts: hosts, Body: req.Body, CreatedAt: time.Now()}
	if err := s.Store.Secrets().Put(ctx, row); err != nil {
		return api.Secret{}, err
	}
	s.log().Info("secret stored", "team", team, "name", req.Name, "hosts", hosts, "body", req.Body) // never its value
	return wireSecret(row), nil
}

// ListSecrets is the caller's team's secrets, without values.
func (s *Service) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	rows, err := s.Store.Secrets().List(ctx, apikey.From(ctx).Team)
	out := []api.Secret{}
	for _, r := range rows {
		out = append(out, wireSecret(r))
	}
	return out, err
}

// DeleteSecret removes the caller's team's secret name. Sandboxes made
// with it keep the value they were given until they are deleted.
func (s *Service) DeleteSecret(ctx context.Context, name string) error {
	team := apikey.From(ctx).Team
	if err := s.Store.Secrets().Delete(ctx, team, name); err != nil {
		return err
	}
	s.log().Info("secret deleted", "team", team, "name", name)
	return nil
}

func wireSecret(r store.Secret) api.Secret {
	return api.Secret{Name: r.Name, Team: r.Team, Hosts: r.Hosts, Body: r.Body, CreatedAt: r.CreatedAt}
}

// bindSecrets turns a create's secrets (variable → secret name) into the
// node's bindings, each with a new marker, and env with every variable
// set to its marker. A name the team has not stored is not found.
func (s *Service) bindSecrets(ctx context.Context, want, env map[string]string) ([]inject.Binding, map[string]string, error) {
	if len(want) == 0 {
		return nil, env, nil
	}
	if s.Secrets == nil {
		return nil, nil, errdefs.New(errdefs.ErrNotSupported, "secrets: this master keeps no secrets (no secrets key)")
	}
	team := apikey.From(ctx).Team
	env = maps.Clone(env)
	if env == nil {
		env = map[string]string{}
	}
	var out []inject.Binding
	for v, name := range want {
		if _, clash := env[v]; clash || v == "" {
			return nil, nil, errdefs.New(errdefs.ErrBadInput, "secrets: variable %q is also in env (or empty)", v)
		}
		row, err := s.Store.Secrets().Get(ctx, team, name)
		if err != nil {
			return nil, nil, err
		}
		value, err := s.Secrets.Open(row.Sealed, secretAD(team, name))
		if err != nil {
			return nil, nil, fmt.Errorf("secret %q: %w", name, err)
		}
		b := inject.Binding{Name: name, Marker: secrets.NewMarker(), Value: string(value), Hosts: row.Hosts, Body: row.Body}
		env[v] = b.Marker
		out = append(out, b)
	}
	return out, env, CheckSettings(env, nil)
}

// withSandboxCA is env with NODE_EXTRA_CA_CERTS naming the sandbox's CA
// if it has one (bound: it has secrets or header rules) and env does not
// set it: Node.js reads no system trust store.
func withSandboxCA(env map[string]string, bound bool) map[string]string {
	if _, set := env["NODE_EXTRA_CA_CERTS"]; !bound || set {
		return env
	}
	env = maps.Clone(env)
	if env == nil {
		env = map[string]string{}
	}
	env["NODE_EXTRA_CA_CERTS"] = api.SecretCAPath
	return env
}
