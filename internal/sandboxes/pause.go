package sandboxes

import (
	"context"
	"hash/fnv"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
)

// Pause, as both APIs mean it (docs/E2B.md, "the rule for pause"): a
// paused sandbox is paused by someone, not by idleness, and stays so
// until a resume (E2B's connect), or, made with autoResume, until
// traffic reaches it. With its memory it is in the snapshot tier
// (processes and all); without, in the detached tier (its files only),
// and a resume cold-boots it. The idle tiers are the product's own: a
// sandbox in one is running to the APIs and wakes on any call.

// Lock takes sandbox id's lock: the calls that change one sandbox's
// state (kill, pause, resume, lifetime, its lifetime's end) take it, so
// racing ones each answer a state the APIs define and what is kept of
// the sandbox is the last one's (issue 31, item 7). The locks are a
// fixed array, shared by both APIs (one Service per master).
func (s *Service) Lock(id string) func() {
	h := fnv.New32a()
	h.Write([]byte(id))
	mu := &s.locks[h.Sum32()%uint32(len(s.locks))]
	mu.Lock()
	return mu.Unlock
}

// PauseTo takes sb to the tier a pause asks: the snapshot tier with its
// memory, else the detached tier (its files only). A sandbox already
// without memory stays as it is.
func PauseTo(ctx context.Context, n nodeapi.Node, sb api.Sandbox, memory bool) error {
	op, tier := nodeapi.Snapshot, api.TierSnapshot
	if !memory {
		op, tier = nodeapi.Detach, api.TierDetached
	}
	if sb.Tier == tier || sb.Tier == api.TierDetached {
		return nil
	}
	_, err := n.Transition(ctx, sb.ID, op)
	return err
}

// Pause pauses sandbox ref for the caller; a paused one is a conflict.
// The caller holds its lock.
func (s *Service) Pause(ctx context.Context, ref string, memory bool) (api.Sandbox, error) {
	n, sb, m, err := s.Find(ctx, ref)
	if err != nil {
		return sb, err
	}
	if m.Paused {
		return sb, errdefs.New(errdefs.ErrConflict, "sandbox %q is already paused", sb.ID)
	}
	if err := PauseTo(ctx, n, sb, memory); err != nil {
		return sb, err
	}
	m.Paused = true
	if err := s.Store.Teams().PutSandboxMeta(context.WithoutCancel(ctx), m); err != nil {
		return sb, err
	}
	s.changed()
	sb, _ = n.Get(ctx, sb.ID)
	return sb, nil
}

// ResumeOpts says how a resume goes.
type ResumeOpts struct {
	// DropMemory cold-boots it: its memory is dropped first.
	DropMemory bool
	// Until, if set, is the least its lifetime ends at from now; a
	// paused one's ends at it (E2B's connect timeout).
	Until time.Time
}

// Resume ends sandbox ref's pause, or wakes it from an idle tier: it is
// hot and not paused after. It reports whether it was paused. The
// caller holds its lock.
func (s *Service) Resume(ctx context.Context, ref string, o ResumeOpts) (api.Sandbox, bool, error) {
	n, sb, m, err := s.Find(ctx, ref)
	if err != nil {
		return sb, false, err
	}
	resumed := m.Paused
	if o.DropMemory && sb.Tier != api.TierDetached {
		if sb, err = n.Transition(ctx, sb.ID, nodeapi.Detach); err != nil {
			return sb, false, err
		}
	}
	if sb.Tier != api.TierHot {
		if sb, err = n.Transition(ctx, sb.ID, nodeapi.Wake); err != nil {
			return sb, false, err
		}
	}
	longer := !o.Until.IsZero() && o.Until.After(m.EndAt)
	if !resumed && !longer {
		return sb, false, nil
	}
	m.Paused = false
	if longer || resumed && !o.Until.IsZero() {
		m.EndAt = o.Until
	}
	defer s.changed()
	return sb, resumed, s.Store.Teams().PutSandboxMeta(context.WithoutCancel(ctx), m)
}
