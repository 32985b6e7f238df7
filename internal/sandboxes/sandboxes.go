// Package sandboxes is sandstormd's sandbox service as both of its HTTP
// APIs use it (issue 30): /v1 (internal/master) and /e2b (internal/e2b)
// only translate their wire formats to it, so what a create checks, who
// owns what it made and who may see a sandbox cannot drift between them.
//
// Ownership is the teams' rule (internal/apikey): a sandbox is its
// creator's team's; a team sees only its own, and another team's is not
// found, exactly as a missing one (IDs do not leak: 404, never 403); one
// no team made is the operator's.
package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/secrets"
	"sandstorm/internal/store"
)

// Service creates, finds and lists sandboxes for the caller its context
// carries (apikey.From).
type Service struct {
	Store *store.Store
	Fleet *fleet.Fleet
	// Secrets seals the teams' stored secrets (nil: none are kept).
	Secrets *secrets.Box
	Log     *slog.Logger // nil: slog.Default()
	// Changed, if set, is told when what is kept of a sandbox changed
	// (made, paused, resumed): internal/routes pushes the nodes'
	// ingresses anew.
	Changed func()

	locks [64]sync.Mutex // pause.go, Lock
}

// changed tells Changed.
func (s *Service) changed() {
	if s.Changed != nil {
		s.Changed()
	}
}

func (s *Service) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// CreateRequest is a create as both APIs ask it: what the node makes
// (Template, Name, Principal, MemoryMiB, Idle) and what the master keeps
// of it (Meta: env, labels, its end; ID, Team and StartedAt are set
// here).
type CreateRequest struct {
	Template  string
	Name      string
	Principal string
	MemoryMiB int
	Idle      *api.IdleTimers
	Egress    *api.Egress
	// Secrets binds stored secrets: variable → secret name.
	Secrets map[string]string
	// Rules are header rules for the sandbox's boundary (E2B's
	// network.rules, inject.Binding with Headers): bound as secrets are.
	Rules []inject.Binding
	Meta  store.SandboxMeta
}

// MaxLabelBytes bounds a sandbox's labels (E2B's metadata), keys and
// values together.
const MaxLabelBytes = 16 << 10

// CheckSettings checks what a create asks beyond its template: env
// names a process can be given, labels that fit a query string and
// their bound. Both APIs call it before anything is made.
func CheckSettings(env, labels map[string]string) error {
	for k := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return errdefs.New(errdefs.ErrBadInput, "env: %q is not a variable name", k)
		}
	}
	size := 0
	for k, v := range labels {
		if k == "" || strings.ContainsAny(k, "=&\x00") || strings.ContainsRune(v, 0) {
			return errdefs.New(errdefs.ErrBadInput, "labels: %q: a key must be non-empty, without '=', '&' or NUL", k)
		}
		size += len(k) + len(v)
	}
	if size > MaxLabelBytes {
		return errdefs.New(errdefs.ErrBadInput, "labels: %d bytes, at most %d KiB", size, MaxLabelBytes>>10)
	}
	return nil
}

// CheckLifetime checks a create's lifetime and what its end does (both
// APIs, and the CLI before it sends them): d is the lifetime (0 with
// none), autoPause an end that snapshots instead of deleting.
func CheckLifetime(lifetime, onTimeout string) (d time.Duration, autoPause bool, err error) {
	switch onTimeout {
	case "", "delete":
	case "snapshot":
		autoPause = true
	default:
		return 0, false, errdefs.New(errdefs.ErrBadInput, "on_timeout %q: want delete or snapshot", onTimeout)
	}
	if lifetime == "" {
		if onTimeout != "" {
			return 0, false, errdefs.New(errdefs.ErrBadInput, "on_timeout without a lifetime: give --lifetime too")
		}
		return 0, false, nil
	}
	d, err = time.ParseDuration(lifetime)
	if err != nil || d < 0 || d > 30*24*time.Hour {
		return 0, false, errdefs.New(errdefs.ErrBadInput, "lifetime %q: want a duration from 0s to 720h (e.g. 90s, 2h)", lifetime)
	}
	return d, autoPause, nil
}

// Create makes the sandbox and records it as the caller's team's. A
// sandbox that cannot be recorded would be nobody's, lost to its team:
// it is deleted again and the create fails.
func (s *Service) Create(ctx context.Context, req CreateRequest) (api.Sandbox, store.SandboxMeta, error) {
	if err := CheckSettings(req.Meta.Env, req.Meta.Metadata); err != nil {
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	if e := req.Egress; e != nil {
		// Here too, not only on the node: a malformed rule is the
		// caller's mistake on every fleet (the node checks the names
		// against its policy).
		if _, err := egress.Parse(e.AllowOut, e.DenyOut); err != nil {
			return api.Sandbox{}, store.SandboxMeta{}, errdefs.New(errdefs.ErrBadInput, "egress: %v", err)
		}
	}
	t, err := s.Template(ctx, req.Template)
	if err != nil {
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	c := apikey.From(ctx)
	if req.Principal != "" && !c.Operator {
		// A principal is a name the policy grants to: a team naming one
		// would take whatever the policy gives it.
		return api.Sandbox{}, store.SandboxMeta{}, errdefs.New(errdefs.ErrForbidden, "principal: only the operator names a sandbox's principal (a team's sandbox is the template's principal, else its name)")
	}
	if !c.Operator && req.Name != "" && t.Principal == "" {
		// A sandbox's principal is its name by default, and a name is the
		// team's to choose: a team's named sandbox is <team>.<name>, so
		// that no team takes a principal the policy grants to another.
		req.Principal = c.Team + "." + req.Name
	}
	bound, env, err := s.bindSecrets(ctx, req.Secrets, req.Meta.Env)
	if err != nil {
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	bound = append(bound, req.Rules...)
	req.Meta.Env = withSandboxCA(env, len(bound) > 0)
	sb, err := s.Fleet.Create(ctx, nodeapi.CreateRequest{Template: fleet.Wire(t), Name: req.Name, Principal: req.Principal, MemoryMiB: req.MemoryMiB, Idle: req.Idle, Egress: req.Egress, Secrets: bound})
	if err != nil {
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	m := req.Meta
	m.ID, m.Team = sb.ID, c.Team
	if m.StartedAt.IsZero() {
		m.StartedAt = time.Now()
	}
	if err := s.Store.Teams().PutSandboxMeta(ctx, m); err != nil {
		if n, got, ferr := s.Fleet.Find(ctx, sb.ID); ferr == nil {
			s.Fleet.Delete(context.WithoutCancel(ctx), n, got)
		}
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	s.changed()
	return sb, m, nil
}

// Template is template name if the caller may use it: the operator's
// (no team's) are everyone's, a team's its own; another team's is not
// found, exactly as a missing one.
func (s *Service) Template(ctx context.Context, name string) (store.Template, error) {
	t, err := s.Store.GetTemplate(ctx, name)
	if err == nil && t.Team != "" && !apikey.From(ctx).Sees(t.Team) {
		return store.Template{}, errdefs.New(errdefs.ErrNotFound, "template %q: not found", name)
	}
	return t, err
}

// Clone makes children of parent, on its node n (a fleet clone: one
// checkpoint, each child restored from it with its own address,
// boundary, principal and reseed). Each child is its parent's team's,
// with its labels and env; end is when each ends (zero: no end). Only
// the operator names the children's principal. Some children may be
// made when err is not nil: they are in the result, and recorded.
func (s *Service) Clone(ctx context.Context, n nodeapi.Node, parent api.Sandbox, req api.CloneRequest, end time.Time) (api.CloneResult, error) {
	if req.Principal != "" && !apikey.From(ctx).Operator {
		return api.CloneResult{}, errdefs.New(errdefs.ErrForbidden, "principal: only the operator names a clone's principal (a team's clones are its parent's principal with .<n>)")
	}
	out, err := s.Fleet.Clone(ctx, n, parent, req)
	defer s.changed()
	pm, _ := s.Store.Teams().GetSandboxMeta(ctx, parent.ID)
	for _, c := range out.Children {
		cm := store.SandboxMeta{ID: c.ID, Team: pm.Team, Metadata: pm.Metadata, Env: pm.Env, StartedAt: time.Now(), EndAt: end,
			Private: pm.Private, MaskHost: pm.MaskHost, AutoResume: pm.AutoResume}
		if pm.ID == "" {
			cm.Team = apikey.From(ctx).Team // a sandbox no team made: the caller's
		}
		if perr := s.Store.Teams().PutSandboxMeta(context.WithoutCancel(ctx), cm); perr != nil && err == nil {
			err = fmt.Errorf("clone: record child %s's team: %w", c.ID, perr)
		}
	}
	return out, err
}

// NotFound is the answer for a sandbox the caller may not see, the same
// as for one that does not exist.
func NotFound(ref string) error {
	return errdefs.New(errdefs.ErrNotFound, "sandbox %q: not found", ref)
}

// Find is sandbox ref, its node and what the master keeps of it, if the
// caller may see it. A sandbox no team made (one the operator made on
// /v1) has a Meta of its ID and creation time only.
func (s *Service) Find(ctx context.Context, ref string) (nodeapi.Node, api.Sandbox, store.SandboxMeta, error) {
	n, sb, err := s.Fleet.Find(ctx, ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, api.Sandbox{}, store.SandboxMeta{}, NotFound(ref)
	}
	if err != nil {
		// Its node lost is not its end: 503, Retry-After.
		return nil, api.Sandbox{}, store.SandboxMeta{}, err
	}
	m, err := s.Store.Teams().GetSandboxMeta(ctx, sb.ID)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		m = store.SandboxMeta{ID: sb.ID, StartedAt: sb.CreatedAt}
	case err != nil:
		return nil, api.Sandbox{}, store.SandboxMeta{}, err
	}
	if !apikey.From(ctx).Sees(m.Team) {
		return nil, api.Sandbox{}, store.SandboxMeta{}, NotFound(ref)
	}
	return n, sb, m, nil
}

// Visible is a sandbox the caller may see, with what is kept of it.
type Visible struct {
	Sandbox api.Sandbox
	Meta    store.SandboxMeta
}

// List is every sandbox the caller may see, in the fleet's order.
func (s *Service) List(ctx context.Context) ([]Visible, error) {
	all, err := s.Fleet.List(ctx)
	if err != nil {
		return nil, err
	}
	metas, err := s.Store.Teams().SandboxMetas(ctx)
	if err != nil {
		return nil, fmt.Errorf("what is kept of the sandboxes: %w", err)
	}
	byID := make(map[string]store.SandboxMeta, len(metas))
	for _, m := range metas {
		byID[m.ID] = m
	}
	c := apikey.From(ctx)
	var out []Visible
	for _, sb := range all {
		m, ok := byID[sb.ID]
		if !ok {
			m = store.SandboxMeta{ID: sb.ID, StartedAt: sb.CreatedAt}
		}
		if c.Sees(m.Team) {
			out = append(out, Visible{sb, m})
		}
	}
	return out, nil
}
