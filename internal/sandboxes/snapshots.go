package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/store"
)

// Snapshots (E2B's createSnapshot, listSnapshots, deleteSnapshot and
// Sandbox.create(snapshotID)): a snapshot is a clone of the sandbox —
// one checkpoint, the sandbox running on, as a clone's parent does —
// kept in the snapshot tier, where it costs disk and no memory. A
// sandbox made from it is a clone of it, with its memory: the snapshot
// is woken for the checkpoint and goes back to the snapshot tier after.
// Being a sandbox, a snapshot is its team's, counts with its team's
// sandboxes and outlives a daemon's restart. Its node is the one its
// sandboxes are made on; it is shipped to another when its own has no
// room for one (cloneShipping).

// ErrNotASnapshot marks a reference to something that is not a snapshot
// the caller may use.
var ErrNotASnapshot = errdefs.Refine(errdefs.ErrNotFound, "no such snapshot")

// Snapshot takes a snapshot of sb (on its node n), named name ("": none).
func (s *Service) Snapshot(ctx context.Context, n nodeapi.Node, sb api.Sandbox, name string) (store.SandboxMeta, error) {
	if len(name) > 128 || strings.ContainsFunc(name, unicode.IsControl) {
		return store.SandboxMeta{}, errdefs.New(errdefs.ErrBadInput, "snapshot name %q: at most 128 characters, none a control character", name)
	}
	// Never detached by idleness: what is made from it has its memory.
	out, err := s.Fleet.Clone(ctx, n, sb, api.CloneRequest{Count: 1, Idle: &api.IdleTimers{DetachAfter: "0"}})
	if len(out.Children) != 1 {
		if err == nil {
			err = errors.New("the clone made no copy")
		}
		return store.SandboxMeta{}, fmt.Errorf("snapshot of %s: %w", sb.ID, err)
	}
	snap := out.Children[0]
	c := apikey.From(ctx)
	pm, _ := s.Store.Teams().GetSandboxMeta(ctx, sb.ID)
	m := store.SandboxMeta{ID: snap.ID, Team: c.Team, Env: pm.Env, StartedAt: time.Now(), SnapshotOf: sb.ID, SnapshotName: name,
		Private: pm.Private, MaskHost: pm.MaskHost, AutoResume: pm.AutoResume}
	if pm.ID != "" {
		m.Team = pm.Team
	}
	bg := context.WithoutCancel(ctx)
	if err := s.Store.Teams().PutSandboxMeta(bg, m); err != nil {
		s.Fleet.Delete(bg, n, snap)
		return store.SandboxMeta{}, err
	}
	// To the snapshot tier now; if that fails it is kept all the same,
	// and its idle timers take it there.
	n.Transition(bg, snap.ID, nodeapi.Snapshot)
	return m, nil
}

// SnapshotFilter picks snapshots: of one sandbox, by name ("": any).
type SnapshotFilter struct{ Of, Name string }

// Snapshots lists the snapshots the caller may see that f keeps, oldest
// first.
func (s *Service) Snapshots(ctx context.Context, f SnapshotFilter) ([]store.SandboxMeta, error) {
	metas, err := s.Store.Teams().SandboxMetas(ctx)
	if err != nil {
		return nil, err
	}
	c := apikey.From(ctx)
	var out []store.SandboxMeta
	for _, m := range metas {
		if m.SnapshotOf == "" || !c.Sees(m.Team) || f.Of != "" && m.SnapshotOf != f.Of || f.Name != "" && m.SnapshotName != f.Name {
			continue
		}
		out = append(out, m)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out, nil
}

// snapshot is snapshot id, its node and sandbox, if the caller may use
// it.
func (s *Service) snapshot(ctx context.Context, id string) (nodeapi.Node, api.Sandbox, store.SandboxMeta, error) {
	n, sb, m, err := s.Find(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && m.SnapshotOf == "" {
		return nil, api.Sandbox{}, store.SandboxMeta{}, errdefs.Mark(ErrNotASnapshot, fmt.Errorf("snapshot %q: not found", id))
	}
	return n, sb, m, err
}

// IsSnapshot reports whether ref names a snapshot the caller may use.
func (s *Service) IsSnapshot(ctx context.Context, ref string) bool {
	_, _, _, err := s.snapshot(ctx, ref)
	return err == nil
}

// FromSnapshot makes a sandbox from snapshot id, with its memory, and
// records it as the caller's with meta (its env, labels and end; the
// snapshot's env when meta has none).
func (s *Service) FromSnapshot(ctx context.Context, id string, meta store.SandboxMeta) (api.Sandbox, store.SandboxMeta, error) {
	if err := CheckSettings(meta.Env, meta.Metadata); err != nil {
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	n, snap, sm, err := s.snapshot(ctx, id)
	if err != nil {
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	n, out, err := s.cloneShipping(ctx, n, snap)
	// The snapshot goes back to sleep, whatever the clone did.
	defer n.Transition(context.WithoutCancel(ctx), snap.ID, nodeapi.Snapshot)
	if len(out.Children) != 1 {
		if err == nil {
			err = errors.New("the clone made no sandbox")
		}
		return api.Sandbox{}, store.SandboxMeta{}, fmt.Errorf("a sandbox from snapshot %s: %w", id, err)
	}
	sb := out.Children[0]
	meta.ID, meta.Team = sb.ID, sm.Team
	if meta.StartedAt.IsZero() {
		meta.StartedAt = time.Now()
	}
	if len(meta.Env) == 0 {
		meta.Env = sm.Env
	}
	if err := s.Store.Teams().PutSandboxMeta(context.WithoutCancel(ctx), meta); err != nil {
		s.Fleet.Delete(context.WithoutCancel(ctx), n, sb)
		return api.Sandbox{}, store.SandboxMeta{}, err
	}
	return sb, meta, nil
}

// cloneShipping makes one sandbox of snapshot snap on its node n, or, if
// n has no room for it or is draining, ships the snapshot first: it is
// moved live (its image and volume, nothing woken) to the node with the
// most headroom that takes it, and the sandbox is made there. It answers
// the node the snapshot is on after.
func (s *Service) cloneShipping(ctx context.Context, n nodeapi.Node, snap api.Sandbox) (nodeapi.Node, api.CloneResult, error) {
	out, err := s.Fleet.Clone(ctx, n, snap, api.CloneRequest{Count: 1})
	if len(out.Children) > 0 || !errors.Is(err, errdefs.ErrNoRoom) && !errors.Is(err, fleet.ErrDraining) {
		return n, out, err
	}
	moved, merr := s.Fleet.LiveMove(ctx, snap.ID, "")
	if merr != nil {
		return n, out, fmt.Errorf("%w (and the snapshot could not be shipped to another node: %v)", err, merr)
	}
	to, now, ferr := s.Fleet.Find(ctx, moved.ID)
	if ferr != nil {
		return n, out, ferr
	}
	s.log().Info("snapshot shipped to the node a sandbox of it can be made on", "snapshot", snap.ID, "from", n.Name(), "to", to.Name(), "why", err)
	out, err = s.Fleet.Clone(ctx, to, now, api.CloneRequest{Count: 1})
	return to, out, err
}

// DeleteSnapshot deletes snapshot id (what was made from it stays).
func (s *Service) DeleteSnapshot(ctx context.Context, id string) error {
	n, snap, _, err := s.snapshot(ctx, id)
	if err != nil {
		return err
	}
	if err := s.Fleet.Delete(ctx, n, snap); err != nil {
		return err
	}
	return s.Store.Teams().DeleteSandboxMeta(ctx, snap.ID)
}
