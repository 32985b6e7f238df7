// Package tiering is a Sandstorm node's tier machine: each sandbox's
// in-memory state and the lock that serialises what happens to it (Entry),
// and the transitions between tiers — hot → frozen → snapshot → detached,
// and the wake that brings a sandbox straight back from any of them —
// with what a failed one leaves settled and said. The idle timers' policy
// is internal/tier's; laying a sandbox out on the machine is
// internal/node/host's; creating, moving and deleting sandboxes is the
// node's (internal/node).
package tiering

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/gateway"
	"sandstorm/internal/metrics"
	"sandstorm/internal/node/envdlink"
	"sandstorm/internal/node/host"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// The node's own refusals (errdefs.ErrNoRoom: the API's 503 with
// Retry-After); the gateway answers any no-room error so.
var (
	// ErrRefused: a wake or start that could not begin in time (no wake
	// or start slot, the sandbox busy with another transition).
	ErrRefused = errdefs.Refine(errdefs.ErrNoRoom, "wake refused")
	// ErrMoving: anything that would run or change a sandbox while a
	// move of it is under way; try again (it is then wherever the move
	// left it).
	ErrMoving = errdefs.Refine(errdefs.ErrNoRoom, "sandbox being moved")
)

// RefuseMoving is ErrMoving for a sandbox that is leaving or arriving.
func RefuseMoving(sb store.Sandbox) error {
	switch {
	case sb.MoveOut != 0:
		return fmt.Errorf("%w: %s (%s) is leaving this node; try again in a moment, where its master then has it", ErrMoving, sb.Name, sb.ID)
	case sb.MoveIn:
		return fmt.Errorf("%w: %s (%s) is arriving on this node and not yet confirmed by its master", ErrMoving, sb.Name, sb.ID)
	}
	return nil
}

// RefuseLeftBehind is the error for anything that would run sb again.
func RefuseLeftBehind(sb store.Sandbox) error {
	return fmt.Errorf("%w: sandbox %s (%s) was left behind on this node and does not run again; delete it by its ID", errdefs.ErrConflict, sb.Name, sb.ID)
}

// Config is what a Machine works with.
type Config struct {
	// Node is the node's name (in its events).
	Node    string
	Store   *store.Store
	Backend sandbox.Backend
	Host    *host.Host
	Kept    *runtimes.Keeper
	Envd    *envdlink.Builds
	Guard   *reserve.Guard
	Adm     *admission.Admission
	Events  *events.Hub
	Metrics *metrics.Node
	Timers  tier.Timers
	// Zswap: after freezing a sandbox, push its memory out to swap.
	Zswap bool
	// MaxWakes bounds the wakes running at once.
	MaxWakes int
	Log      *slog.Logger
}

// Machine is a node's sandboxes and their tiers.
type Machine struct {
	cfg   Config
	st    *store.Store
	be    sandbox.Backend
	h     *host.Host
	log   *slog.Logger
	gw    *gateway.Gateway
	wakes chan struct{} // semaphore of MaxWakes

	mu      sync.Mutex
	entries map[string]*Entry

	// finishing counts transitions' work left for after their answer
	// (transitionThen), each holding its sandbox's lock.
	finishing sync.WaitGroup
}

// New is a machine with no sandboxes; SetGateway before it serves.
func New(cfg Config) *Machine {
	return &Machine{cfg: cfg, st: cfg.Store, be: cfg.Backend, h: cfg.Host, log: cfg.Log,
		wakes: make(chan struct{}, cfg.MaxWakes), entries: map[string]*Entry{}}
}

// SetGateway gives the machine the gateway that drains and closes its
// sandboxes' connections (the gateway wakes sandboxes through the
// machine, so it is made after it).
func (m *Machine) SetGateway(gw *gateway.Gateway) { m.gw = gw }

// WakesRunning is how many wakes hold a wake slot now.
func (m *Machine) WakesRunning() int { return len(m.wakes) }

// Finishing counts the work transitions left for after their answer, and
// a move's teardown beside its stream; Close waits for it.
func (m *Machine) Finishing() *sync.WaitGroup { return &m.finishing }

// Entry is sandbox id's entry, made (detached) if the machine has none.
func (m *Machine) Entry(id string) *Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[id]
	if e == nil {
		e = &Entry{id: id, lock: make(chan struct{}, 1)}
		e.SetTier(api.TierDetached)
		m.entries[id] = e
	}
	return e
}

// Lookup is sandbox id's entry, if the machine has one.
func (m *Machine) Lookup(id string) (*Entry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	return e, ok
}

// Forget drops sandbox id's entry (it is gone).
func (m *Machine) Forget(id string) {
	m.mu.Lock()
	delete(m.entries, id)
	m.mu.Unlock()
}

// Entries is every entry, in no order.
func (m *Machine) Entries() []*Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	es := make([]*Entry, 0, len(m.entries))
	for _, e := range m.entries {
		es = append(es, e)
	}
	return es
}

// Views is the tier policy's view of every sandbox, by ID.
func (m *Machine) Views() []tier.View {
	es := m.Entries()
	out := make([]tier.View, 0, len(es))
	for _, e := range es {
		// Open but quiet connections do not keep a sandbox hot: freezing
		// keeps them, and their next byte thaws it (gateway.copy).
		// A call forwarded to envd (a command someone waits on) does,
		// and so does a mesh request its agent waits on (egress.go).
		// An HTTP request in flight through the gateway (a client waiting
		// on an answer being worked out) does too.
		busy := len(e.lock) > 0 || e.Envd.Busy() || e.egressCalls.Load() > 0 || e.moving.Load() || m.gw.Busy(e.id)
		out = append(out, tier.View{
			ID: e.id, Tier: e.Tier(), Busy: busy, Timers: e.timers.Load(),
			LastActive: time.UnixMilli(e.lastActive.Load()),
			TierSince:  time.UnixMilli(e.tierSince.Load()),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Fresh gives sb the last activity the machine knows of it, when that is
// later than its row's.
func (m *Machine) Fresh(sb *store.Sandbox) {
	if e, ok := m.Lookup(sb.ID); ok {
		if la := e.lastActive.Load(); la > sb.LastActive.UnixMilli() {
			sb.LastActive = time.UnixMilli(la).UTC()
		}
	}
}

// Touch records activity, keeping the idle timer fresh (gateway.Waker).
func (m *Machine) Touch(id string) {
	if e, ok := m.Lookup(id); ok {
		e.lastActive.Store(time.Now().UnixMilli())
	}
}

// IsHot implements gateway.Waker.
//
// A sandbox in the middle of a transition is not hot, even while its
// stored tier still says so: a snapshot lets the gateway's held requests
// go once its checkpoint is done, before it records the new tier, and a
// request let through then must wake the sandbox, not dial a network
// namespace that is already gone.
func (m *Machine) IsHot(id string) bool {
	e, ok := m.Lookup(id)
	return ok && e.Tier() == api.TierHot && !e.Busy()
}

// Unreachable implements gateway.Waker: if the sandbox's container is no
// longer running (its process exited), it is settled as detached with a
// note, so the next request cold-starts it instead of timing out again.
func (m *Machine) Unreachable(id string) { m.Gone(id, false) }

// Gone settles hot sandbox id whose process is gone as detached, saying
// why (oom: the kernel's OOM killer ended it), unless a transition holds
// it or it is running after all.
func (m *Machine) Gone(id string, oom bool) {
	e, ok := m.Lookup(id)
	if !ok || !e.TryAcquire() {
		return // a transition is running; it will settle the tier
	}
	defer e.Release()
	if e.Tier() != api.TierHot {
		return
	}
	sb, err := m.st.GetSandbox(context.Background(), id)
	if err != nil {
		return
	}
	st, err := m.be.State(context.Background(), m.h.Spec(sb))
	if err != nil || st == sandbox.StateRunning || st == sandbox.StatePaused {
		return
	}
	if !oom {
		m.log.Warn("sandbox process is gone; detaching it so the next request cold-starts it", "id", id, "state", st)
		m.SettleAfterFailure(sb, api.TierHot, "its process exited (see its logs); the next request cold-starts it")
		return
	}
	m.log.Warn("sandbox killed by the kernel: out of memory", "id", id, "limit_mib", sb.MemoryMiB)
	m.SettleAfterFailure(sb, api.TierHot, fmt.Sprintf("killed: out of memory (the kernel's OOM killer ended it; its limit is %d MiB); the next request cold-starts it", sb.MemoryMiB))
}

// SetIdle gives sandbox id idle timers of its own (over the node's; nil:
// the node's again), kept with it across restarts.
func (m *Machine) SetIdle(ctx context.Context, id string, idle *api.IdleTimers) error {
	own, err := m.cfg.Timers.With(idle)
	if err != nil {
		return errdefs.Mark(errdefs.ErrBadInput, err)
	}
	if _, err := m.st.UpdateSandbox(ctx, id, func(sb *store.Sandbox) error { sb.Idle = idle; return nil }); err != nil {
		return err
	}
	if e, ok := m.Lookup(id); ok {
		if idle == nil {
			e.timers.Store(nil)
		} else {
			e.timers.Store(&own)
		}
	}
	return nil
}

// Commit records that sandbox id is now in tier to (clearing its
// transition) and applies extra changes to the row in the same write.
func (m *Machine) Commit(id string, to api.Tier, extra func(*store.Sandbox)) (store.Sandbox, error) {
	e := m.Entry(id)
	var released string
	sb, err := m.st.UpdateSandbox(context.Background(), id, func(s *store.Sandbox) error {
		s.Tier, s.Transition = to, ""
		if to == api.TierDetached {
			// Its memory is gone, and with it the need for its runsc build.
			released, s.Runsc = s.Runsc, ""
		}
		if la := e.lastActive.Load(); la > s.LastActive.UnixMilli() {
			s.LastActive = time.UnixMilli(la)
		}
		if extra != nil {
			extra(s)
		}
		return nil
	})
	if err == nil {
		e.SetTier(to)
		e.flushed.Store(sb.LastActive.UnixMilli())
		m.cfg.Kept.Changed(runtimes.Key(released))
		// Every tier the node commits is reported (nodeside.Side.Watch),
		// also those no transition announces: a failure settled (an OOM
		// kill, a checkpoint re-created cold) changes tier and note.
		m.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: m.cfg.Node})
	}
	return sb, err
}

// Begin records that a transition of id towards to has started.
func (m *Machine) Begin(id string, to api.Tier) error {
	_, err := m.st.UpdateSandbox(context.Background(), id, func(s *store.Sandbox) error {
		s.Transition = to
		return nil
	})
	return err
}

// CutEnvd ends the calls forwarded to sandbox id's envd and closes the
// connections kept to it (envdlink.Link.Cut); what became of the sandbox
// ("was moved or snapshotted") is what those calls answer.
func (m *Machine) CutEnvd(id, what string) {
	if e, ok := m.Lookup(id); ok {
		e.Envd.Cut(CutReason(id, what))
	}
}

// CutReason is what a call cut by what became of sandbox id answers:
// unavailable, as E2B's SDK reads a sandbox that went away under a
// command; deleted, marked envdlink.ErrKilled, so that its streams are
// torn as E2B tears a killed sandbox's.
func CutReason(id, what string) error {
	err := fmt.Errorf("sandbox %s %s while this call ran, which ended it", id, what)
	if what == CutDeleted {
		err = fmt.Errorf("%w (%w)", err, envdlink.ErrKilled)
	}
	return errdefs.Mark(errdefs.ErrUnavailable, err)
}

// What CutEnvd's calls are told became of their sandbox.
const (
	CutSnapshotted = "was snapshotted (paused, moved, or idle)"
	CutDetached    = "was detached (its processes stopped)"
	CutGone        = "lost its processes (its program exited or was killed)"
	CutDeleted     = "was deleted"
)

// FlushActivity writes last-activity times that changed to the store, so
// a restart keeps the idle timers roughly where they were.
func (m *Machine) FlushActivity() {
	for _, e := range m.Entries() {
		la := e.lastActive.Load()
		if la <= e.flushed.Load() {
			continue
		}
		_, err := m.st.UpdateSandbox(context.Background(), e.id, func(s *store.Sandbox) error {
			s.LastActive = time.UnixMilli(la)
			return nil
		})
		if err == nil {
			e.flushed.Store(la)
		}
	}
}

// expectedMiB is what a sandbox of template t with limit limit is
// admitted at.
func (m *Machine) expectedMiB(t store.Template, limit int64) int64 {
	return m.cfg.Adm.Expected(reserve.SizeKey(t), limit)
}
