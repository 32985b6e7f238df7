package tiering

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/netns"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// ColdStart starts sb from its template: rootfs overlay, OCI spec, network
// namespace and veth, container. It is also the wake from detached (wake
// true), which its console log says: its memory is new, its volume kept.
func (m *Machine) ColdStart(ctx context.Context, sb store.Sandbox, t store.Template, wake bool) error {
	if err := m.h.Prepare(sb, t, m.cfg.Envd.Current()); err != nil {
		return err
	}
	if wake {
		m.h.Dir(sb.ID).Mark("started from template %s (a cold start: its memory is new, its volume kept)", t.Name)
	} else {
		m.h.Dir(sb.ID).Mark("started from template %s (created)", t.Name)
	}
	if err := m.OnCurrentRunsc(&sb); err != nil {
		return err
	}
	return m.be.Start(ctx, m.h.Spec(sb))
}

// Wake brings sandbox id to hot from any tier (gateway.Waker). Concurrent
// callers share one wake. ctx bounds only the admission — waiting for the
// sandbox's lock, a wake slot and memory — so a wake that cannot start in
// time is refused (ErrRefused or admission.ErrNoMemory), while one that started runs
// to the end.
func (m *Machine) Wake(ctx context.Context, id string) error {
	e, ok := m.Lookup(id)
	if !ok {
		sb, err := m.st.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if e, ok = m.Lookup(sb.ID); !ok {
			return fmt.Errorf("sandbox %s is not on this node", id)
		}
	}
	if e.Tier() == api.TierHot && !e.Busy() {
		return nil
	}
	e.mu.Lock()
	if w := e.waking; w != nil {
		w.shared++
		e.mu.Unlock()
		<-w.done
		return w.err
	}
	w := &wakeCall{done: make(chan struct{})}
	e.waking = w
	e.mu.Unlock()

	w.err = m.wake(ctx, e)
	if errors.Is(w.err, ErrRefused) || errors.Is(w.err, admission.ErrNoMemory) {
		m.cfg.Events.Publish(events.Event{Kind: events.Refusal, ID: e.id, Node: m.cfg.Node, Reason: "wake: " + w.err.Error()})
	}

	e.mu.Lock()
	e.waking = nil
	e.mu.Unlock()
	close(w.done)
	return w.err
}

func (m *Machine) wake(ctx context.Context, e *Entry) (err error) {
	steps := NewSteps()
	if err := e.Acquire(ctx); err != nil {
		err = fmt.Errorf("%w: sandbox %s is busy with another transition", ErrRefused, e.id)
		m.CountTransition(e.Tier(), api.TierHot, 0, err, false)
		return err
	}
	defer e.Release()
	from := e.Tier()
	if from == api.TierHot {
		return nil
	}
	// Counted as it ends, however it ends; a restore that fell back to a
	// cold start is a failed wake from snapshot (its memory is lost),
	// even though the sandbox is hot.
	var took time.Duration
	var fellBack bool
	defer func() { m.CountTransition(from, api.TierHot, took, err, fellBack) }()
	select {
	case m.wakes <- struct{}{}:
		defer func() { <-m.wakes }()
	case <-ctx.Done():
		return fmt.Errorf("%w: %d wakes already running on this node", ErrRefused, m.cfg.MaxWakes)
	}
	steps.Mark("lock")
	sb, err := m.st.GetSandbox(context.Background(), e.id)
	if err != nil {
		return err
	}
	steps.Mark("get")
	if sb.LeftBehind {
		return RefuseLeftBehind(sb)
	}
	if err := RefuseMoving(sb); err != nil {
		return err
	}
	// The rows are read once, here, and passed down (issue 15: a wake read
	// each twice).
	var t store.Template
	if from != api.TierFrozen { // a frozen sandbox already holds its memory
		if t, err = m.st.GetTemplate(context.Background(), sb.Template); err != nil {
			return err
		}
		need := e.lastUsageMiB.Load() // what it held when it was checkpointed
		if from != api.TierSnapshot || need <= 0 {
			need = m.expectedMiB(t, m.h.LimitOf(sb, t))
		}
		if err := m.cfg.Guard.Admit(ctx, e.id, func() error { return m.cfg.Adm.Memory(e.id, need) }); err != nil {
			return err
		}
		if err := m.cfg.Adm.FDs(); err != nil {
			return err
		}
	}
	steps.Mark("admit")
	if err := m.Begin(e.id, api.TierHot); err != nil {
		return err
	}
	steps.Mark("begin")
	start := time.Now()
	// From here the wake runs to the end, whatever the caller's deadline.
	bg := context.Background()
	switch from {
	case api.TierFrozen:
		err = m.be.Resume(bg, m.h.Spec(sb))
	case api.TierSnapshot:
		if err = m.restore(bg, sb, t); err != nil {
			fellBack = true
			return m.recoverFailedRestore(e, sb, err, start)
		}
	default:
		err = m.ColdStart(bg, sb, t, true)
	}
	if err != nil {
		m.cfg.Adm.Release(e.id)
		m.log.Error("wake failed", "id", e.id, "from", from, "err", err)
		m.SettleAfterFailure(sb, from, fmt.Sprintf("wake from %s failed: %v", from, err))
		return fmt.Errorf("wake sandbox %s from %s: %w", e.id, from, err)
	}
	took = time.Since(start)
	steps.Mark("backend")
	ms := float64(took.Microseconds()) / 1000
	e.lastActive.Store(time.Now().UnixMilli())
	// A frozen sandbox's processes are the ones protect already scored
	// when it went hot (a freeze changes no oom_score_adj); rescoring them
	// was 0.44 ms at p50, 1.1 ms at p90 of a 10 ms frozen wake (its "wake
	// steps" debug line, 60 wakes of web), on the path issue 19 holds to
	// raw resume + 2 ms. Restored and cold-started ones are new processes.
	if from != api.TierFrozen {
		m.h.Protect(sb)
	}
	steps.Mark("protect")
	_, err = m.Commit(e.id, api.TierHot, func(s *store.Sandbox) {
		s.LastWakeMs, s.LastWakeFrom, s.Note = ms, from, ""
	})
	steps.Mark("commit")
	m.log.Debug("wake steps", append([]any{"id", e.id, "from", from}, steps.Attrs()...)...)
	m.log.Info("sandbox woken", "id", e.id, "from", from, "ms", ms)
	m.cfg.Events.Publish(events.Event{Kind: events.Wake, ID: e.id, From: string(from), To: string(api.TierHot), Ms: ms, Node: m.cfg.Node})
	return err
}

func (m *Machine) coldStartFromStore(ctx context.Context, sb store.Sandbox) error {
	t, err := m.st.GetTemplate(ctx, sb.Template)
	if err != nil {
		return err
	}
	return m.ColdStart(ctx, sb, t, true)
}

// restore brings a snapshot of sb (of template t) back: what a cold start
// lays out (layOut: overlay, namespace and veth with the same addresses,
// resolver, spec), its boundary, then runsc restore from the image, which
// is deleted once the sandbox runs (each checkpoint needs an image
// directory of its own).
func (m *Machine) restore(ctx context.Context, sb store.Sandbox, t store.Template) error {
	d := m.h.Dir(sb.ID)
	steps := NewSteps()
	if err := m.RestoreRunsc(&sb, d.Snapshot()); err != nil {
		return err
	}
	if err := m.h.LayOut(sb, t, m.cfg.Envd.For(d)); err != nil {
		return err
	}
	steps.Mark("network")
	if err := m.h.BoundaryUp(sb); err != nil {
		return err
	}
	steps.Mark("boundary")
	d.Mark("restoring from its snapshot (memory kept)")
	if err := m.be.Restore(ctx, m.h.Spec(sb), d.Snapshot()); err != nil {
		return err
	}
	steps.Mark("runsc_restore")
	err := os.RemoveAll(d.Snapshot())
	steps.Mark("drop_image")
	m.log.Debug("restore steps", append([]any{"id", sb.ID}, steps.Attrs()...)...)
	return err
}

// Steps records how long each step of a transition took, for the debug
// log (--log-level debug), so a slow wake can be taken apart.
type Steps struct {
	last  time.Time
	steps []any
}

func NewSteps() *Steps { return &Steps{last: time.Now()} }

// Mark ends the step called name.
func (s *Steps) Mark(name string) {
	now := time.Now()
	s.steps = append(s.steps, name+"_ms", float64(now.Sub(s.last).Microseconds())/1000)
	s.last = now
}

func (s *Steps) Attrs() []any { return s.steps }

// recoverFailedRestore handles a snapshot that would not restore (a
// corrupt or incomplete image): the image is dropped and the sandbox
// re-created cold from its template, so the request that woke it is still
// served; its note says the memory state was lost.
func (m *Machine) recoverFailedRestore(e *Entry, sb store.Sandbox, cause error, start time.Time) error {
	bg := context.Background()
	m.log.Error("restore failed; re-creating the sandbox cold", "id", sb.ID, "err", cause)
	m.be.Remove(bg, m.h.Spec(sb))
	os.RemoveAll(m.h.Dir(sb.ID).Snapshot())
	note := "restore failed: " + cause.Error()
	if err := m.coldStartFromStore(bg, sb); err != nil {
		m.h.Teardown(bg, sb, false)
		m.Commit(sb.ID, api.TierDetached, func(s *store.Sandbox) { s.Note = note + "; cold start failed too: " + err.Error() })
		return fmt.Errorf("wake sandbox %s: %w; cold start failed too: %v", sb.ID, cause, err)
	}
	ms := float64(time.Since(start).Microseconds()) / 1000
	e.lastActive.Store(time.Now().UnixMilli())
	m.h.Protect(sb)
	_, err := m.Commit(sb.ID, api.TierHot, func(s *store.Sandbox) {
		s.LastWakeMs, s.LastWakeFrom = ms, api.TierSnapshot
		s.Note = note + "; re-created cold from its template (memory state lost)"
	})
	return err
}

// SettleAfterFailure puts a sandbox whose transition failed into a tier
// that matches what is really there, and says so in its note — never
// silently lost.
func (m *Machine) SettleAfterFailure(sb store.Sandbox, from api.Tier, note string) {
	st, err := m.be.State(context.Background(), m.h.Spec(sb))
	var to api.Tier
	switch {
	case err == nil && st == sandbox.StateRunning:
		to = api.TierHot
	case err == nil && st == sandbox.StatePaused:
		to = api.TierFrozen
	case m.h.Dir(sb.ID).HasSnapshot():
		to = api.TierSnapshot
		m.CutEnvd(sb.ID, CutSnapshotted)
		m.h.Teardown(context.Background(), sb, false)
	default:
		// Its processes are gone (its program exited, the OOM killer):
		// a call to its envd still in flight would wait on a peer that
		// will never answer.
		to = api.TierDetached
		m.CutEnvd(sb.ID, CutGone)
		m.h.Teardown(context.Background(), sb, false)
	}
	m.Commit(sb.ID, to, func(s *store.Sandbox) { s.Note = note })
}

// Freeze pauses a hot sandbox in place (runsc pause / cgroup.freeze).
func (m *Machine) Freeze(ctx context.Context, id string) (store.Sandbox, error) {
	return m.transition(ctx, id, api.TierFrozen, func(sb store.Sandbox, from api.Tier) error {
		switch from {
		case api.TierFrozen:
			return nil
		case api.TierHot:
		default:
			return fmt.Errorf("%w: sandbox %s (%s) is %s; only a hot sandbox can be frozen (wake it first)", errdefs.ErrConflict, sb.Name, sb.ID, from)
		}
		if !m.be.Capabilities().Pause {
			return fmt.Errorf("%w: the %s backend cannot pause", errdefs.ErrNotSupported, m.be.Name())
		}
		if err := m.be.Pause(context.Background(), m.h.Spec(sb)); err != nil {
			m.SettleAfterFailure(sb, from, "freeze failed: "+err.Error())
			return err
		}
		m.squeeze(sb)
		return nil
	})
}

// squeeze pushes a just-frozen sandbox's memory out to swap when the node
// runs with Zswap. A failure costs only memory, so it is logged, not returned.
func (m *Machine) squeeze(sb store.Sandbox) {
	r, ok := m.be.(sandbox.Reclaimer)
	if !m.cfg.Zswap || !ok {
		return
	}
	start := time.Now()
	before, after, err := r.Reclaim(context.Background(), m.h.Spec(sb))
	if err != nil {
		m.log.Warn("zswap: reclaim failed", "id", sb.ID, "err", err)
		return
	}
	m.log.Info("zswap: frozen sandbox squeezed", "id", sb.ID, "before_mib", before>>20, "after_mib", after>>20,
		"ms", time.Since(start).Milliseconds())
}

// Snapshot checkpoints a hot or frozen sandbox to the node's disk and
// releases its processes and network namespace. The gateway drains the
// sandbox first (requests in flight waited for, every connection into it
// closed, new ones held) and its boundary is closed: runsc cannot save an
// established TCP endpoint, and kills the sandbox when a save fails. If the
// checkpoint fails anyway, a sandbox still running stays hot, and one the
// failure killed is re-created cold from its template; the note says which
// (recoverFailedCheckpoint).
func (m *Machine) Snapshot(ctx context.Context, id string) (store.Sandbox, error) {
	return m.snapshot(ctx, id, false)
}

// snapshot is Snapshot; wait says whether it returns only once the stopped
// container and the namespace are gone too. The node's own pushes off
// memory wait: the stopped sandbox process holds the sandbox's memory
// until it is removed, and the memory guard asks MemAvailable again right
// after a push.
func (m *Machine) snapshot(ctx context.Context, id string, wait bool) (store.Sandbox, error) {
	return m.transitionThen(ctx, id, api.TierSnapshot, func(sb store.Sandbox, from api.Tier) (func(), error) {
		switch from {
		case api.TierSnapshot:
			return nil, nil
		case api.TierHot, api.TierFrozen:
		default:
			return nil, fmt.Errorf("%w: sandbox %s (%s) is %s; only a hot or frozen sandbox can be snapshot (wake it first)", errdefs.ErrConflict, sb.Name, sb.ID, from)
		}
		if caps := m.be.Capabilities(); !caps.Checkpoint {
			return nil, fmt.Errorf("%w: %s", errdefs.ErrNotSupported, caps.Why)
		}
		if err := m.cfg.Adm.Disk("its snapshot", m.h.ImageMiB(sb.ID)); err != nil {
			return nil, err
		}
		// What is left once the image is complete (the stopped container,
		// the namespace) is done after the answer, still under the
		// sandbox's lock.
		finish, err := m.Checkpoint(sb, from)
		if err == nil && wait {
			finish()
			finish = nil
		}
		return finish, err
	})
}

// SnapshotOrDetach is the node's own push off memory (idle timers, memory
// pressure): a snapshot, or — when the disk cannot take the image — a
// detach that says what was lost.
func (m *Machine) SnapshotOrDetach(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := m.snapshot(ctx, id, true)
	if !errors.Is(err, admission.ErrNoDisk) {
		return sb, err
	}
	m.log.Warn("disk reserve: detaching instead of snapshotting", "id", id, "err", err)
	return m.DetachNoted(ctx, id, "detached instead of snapshot ("+err.Error()+"): its memory state was lost, its volume kept")
}

// Checkpoint saves a hot or frozen sandbox's image into its snapshot
// directory: gateway drained, envd calls and the boundary's flows cut,
// runsc checkpoint into snapshot.tmp, stamped with its runsc build, renamed
// to snapshot. Once it returns nil the image is complete, and the sandbox
// may be recorded as snapshot. What is left — removing the stopped
// container and releasing the network namespace and veth — is finish,
// which the caller must run (before or after it answers) under the
// sandbox's lock: a restore must not lay out its namespace while finish
// still deletes it. Those two steps took ≈ 29 and 15 ms of a web
// snapshot's 79 here, on top of runsc checkpoint's 54
// (bench/results/2026-12-03-d946f31-systrap-snapshot-steps), and nothing
// needs them done before the answer: reconcile takes a snapshot row whose
// image is in place for a snapshot even while its stopped container
// lingers.
func (m *Machine) Checkpoint(sb store.Sandbox, from api.Tier) (finish func(), err error) {
	bg := context.Background()
	steps := NewSteps()
	defer func() { m.log.Debug("snapshot steps", append([]any{"id", sb.ID}, steps.Attrs()...)...) }()
	release := m.gw.Drain(sb.ID)
	defer release()
	steps.Mark("drain")
	m.CutEnvd(sb.ID, CutSnapshotted)
	steps.Mark("envd")
	// Its outbound flows too: the boundary resets them and stops taking
	// new ones until the sandbox runs again.
	m.h.BoundaryDown(sb.ID)
	steps.Mark("boundary")
	// A failure before the checkpoint runs has saved nothing and left the
	// sandbox's network as it was: the sandbox stays in its tier, and gets
	// its boundary back (a later wake from frozen only resumes it, so
	// nothing else would start it again).
	keep := func(err error) (func(), error) {
		if berr := m.h.BoundaryUp(sb); berr != nil {
			m.log.Error("boundary restart after a failed snapshot", "id", sb.ID, "err", berr)
		}
		return nil, err
	}
	spec := m.h.Spec(sb)
	if from == api.TierFrozen {
		if err := m.be.Resume(bg, spec); err != nil {
			return keep(err)
		}
	}
	if held, ok := m.h.HeldMiB(sb.ID); ok {
		// What it will need again when it is restored.
		m.Entry(sb.ID).lastUsageMiB.Store(held)
	}
	steps.Mark("usage")
	d := m.h.Dir(sb.ID)
	os.RemoveAll(d.SnapTmp())
	os.RemoveAll(d.Snapshot())
	if err := os.MkdirAll(d.SnapTmp(), 0o700); err != nil {
		if from == api.TierFrozen {
			// Resumed above for the checkpoint: frozen again, as its
			// tier says.
			if perr := m.be.Pause(bg, spec); perr != nil {
				m.log.Error("pause after a failed snapshot", "id", sb.ID, "err", perr)
			}
		}
		return keep(err)
	}
	steps.Mark("dirs")
	leaver, leaves := m.be.(sandbox.CheckpointLeaver)
	if leaves {
		err = leaver.CheckpointLeaving(bg, spec, d.SnapTmp())
	} else {
		err = m.be.Checkpoint(bg, spec, d.SnapTmp())
	}
	if err != nil {
		os.RemoveAll(d.SnapTmp())
		return nil, m.recoverFailedCheckpoint(sb, err)
	}
	steps.Mark("runsc_checkpoint")
	m.cfg.Kept.Stamp(d.SnapTmp(), runtimes.Key(sb.Runsc))
	steps.Mark("stamp")
	if err := os.Rename(d.SnapTmp(), d.Snapshot()); err != nil {
		// Not a snapshot: the container stopped, the image not in place.
		// As a checkpoint that failed, once the stopped container is gone
		// (its lingering process would say "running"): re-created cold.
		os.RemoveAll(d.SnapTmp())
		m.be.Remove(bg, spec)
		return nil, m.recoverFailedCheckpoint(sb, err)
	}
	steps.Mark("rename")
	d.Mark("checkpointed to disk (snapshot tier)")
	return func() {
		steps := NewSteps()
		if leaves {
			if err := m.be.Remove(bg, spec); err != nil {
				m.log.Warn("remove the stopped container after its checkpoint", "id", sb.ID, "err", err)
			}
			steps.Mark("runsc_delete")
		}
		// The processes are gone; release the namespace and veth too.
		if nw, err := m.h.Net(sb.ID, sb.Slot); err != nil {
			m.log.Warn("network of a snapshot sandbox", "id", sb.ID, "err", err)
		} else if err := netns.Delete(nw); err != nil {
			m.log.Warn("release the network namespace of a snapshot sandbox", "id", sb.ID, "err", err)
		}
		steps.Mark("netns_delete")
		m.log.Debug("snapshot finish steps", append([]any{"id", sb.ID}, steps.Attrs()...)...)
	}, nil
}

// recoverFailedCheckpoint handles a checkpoint that failed: if the sandbox
// still runs it stays hot; if gVisor killed it, it is re-created cold from
// its template. Either way the error is reported and the note set.
func (m *Machine) recoverFailedCheckpoint(sb store.Sandbox, cause error) error {
	bg := context.Background()
	spec := m.h.Spec(sb)
	note := "checkpoint failed: " + cause.Error()
	if st, err := m.be.State(bg, spec); err == nil && st == sandbox.StateRunning {
		if err := m.h.BoundaryUp(sb); err != nil {
			m.log.Error("boundary restart after failed checkpoint", "id", sb.ID, "err", err)
		}
		m.Commit(sb.ID, api.TierHot, func(s *store.Sandbox) { s.Note = note + "; sandbox kept running" })
		return fmt.Errorf("%w; sandbox kept running", cause)
	}
	m.be.Remove(bg, spec)
	if err := m.coldStartFromStore(bg, sb); err != nil {
		m.h.Teardown(bg, sb, false)
		m.Commit(sb.ID, api.TierDetached, func(s *store.Sandbox) { s.Note = note + "; cold start failed too: " + err.Error() })
		return fmt.Errorf("%w; cold start failed too: %v", cause, err)
	}
	m.h.Protect(sb)
	m.Commit(sb.ID, api.TierHot, func(s *store.Sandbox) { s.Note = note + "; re-created cold from its template (memory state lost)" })
	return fmt.Errorf("%w; re-created cold from its template (memory state lost)", cause)
}

// Detach removes a sandbox's processes, namespace and snapshot; only its
// volume (the overlay's upper dir) stays. A wake is a cold start.
func (m *Machine) Detach(ctx context.Context, id string) (store.Sandbox, error) {
	return m.DetachNoted(ctx, id, "")
}

// DetachNoted is Detach recording note as the sandbox's note in the same write
// as its new tier, so that nobody reads it detached without the reason
// (TestDiskReserve once did, between two writes).
func (m *Machine) DetachNoted(ctx context.Context, id, note string) (store.Sandbox, error) {
	return m.transitionNoted(ctx, id, api.TierDetached, note, func(sb store.Sandbox, from api.Tier) (func(), error) {
		return nil, m.detachOp(sb, from)
	})
}

// detachOp stops sb's processes and drops its image, keeping its volume.
func (m *Machine) detachOp(sb store.Sandbox, from api.Tier) error {
	if from == api.TierDetached {
		return nil
	}
	release := m.gw.Drain(sb.ID)
	defer release()
	m.CutEnvd(sb.ID, CutDetached)
	if err := m.h.Teardown(context.Background(), sb, false); err != nil {
		return err
	}
	m.h.Dir(sb.ID).Mark("detached: its processes stopped, its volume kept")
	return os.RemoveAll(m.h.Dir(sb.ID).Snapshot())
}

// transition runs op under the sandbox's lock, recording the transition
// before and the tier after. Errors from op that already settled the
// sandbox (recoverFailedCheckpoint, settleAfterFailure) are returned as is.
func (m *Machine) transition(ctx context.Context, id string, to api.Tier, op func(store.Sandbox, api.Tier) error) (store.Sandbox, error) {
	return m.transitionThen(ctx, id, to, func(sb store.Sandbox, from api.Tier) (func(), error) {
		return nil, op(sb, from)
	})
}

// transitionThen is transition for an op that leaves work to do once the
// new tier is recorded (then, when op succeeded and returned one): it runs
// after the caller has its answer, still holding the sandbox's lock, so
// whatever comes next for the sandbox (a wake, a delete, a move) waits for
// it. Close waits for it too.
func (m *Machine) transitionThen(ctx context.Context, id string, to api.Tier, op func(store.Sandbox, api.Tier) (then func(), err error)) (store.Sandbox, error) {
	return m.transitionNoted(ctx, id, to, "", op)
}

// transitionNoted is transitionThen that records note (empty: none) with
// the new tier.
func (m *Machine) transitionNoted(ctx context.Context, id string, to api.Tier, note string, op func(store.Sandbox, api.Tier) (then func(), err error)) (store.Sandbox, error) {
	steps := NewSteps()
	sb, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return sb, err
	}
	steps.Mark("get")
	e := m.Entry(sb.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.Acquire(actx); err != nil {
		return sb, fmt.Errorf("%w: sandbox %s (%s) is busy with another transition; try again when it is done", errdefs.ErrConflict, sb.Name, sb.ID)
	}
	var then func()
	defer func() {
		if then == nil {
			e.Release()
			return
		}
		// The lock goes with then.
		m.finishing.Add(1)
		go func() {
			defer m.finishing.Done()
			defer e.Release()
			then()
		}()
	}()
	steps.Mark("lock")
	if cur, err := m.st.GetSandbox(ctx, sb.ID); err == nil {
		if err := RefuseMoving(cur); err != nil {
			return cur, err
		}
	}
	steps.Mark("get_again")
	from := e.Tier()
	if from == to {
		return m.st.GetSandbox(ctx, sb.ID)
	}
	if err := m.Begin(sb.ID, to); err != nil {
		return sb, err
	}
	steps.Mark("begin")
	start := time.Now()
	after, err := op(sb, from)
	if err != nil {
		m.CountTransition(from, to, 0, err, false)
		// Clear the transition unless op settled the sandbox itself.
		m.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error {
			s.Transition = ""
			return nil
		})
		cur, _ := m.st.GetSandbox(context.Background(), sb.ID)
		m.Entry(sb.ID).SetTier(cur.Tier)
		return cur, err
	}
	steps.Mark("op")
	m.CountTransition(from, to, time.Since(start), nil, false)
	m.log.Info("sandbox transition", "id", sb.ID, "from", from, "to", to, "ms", time.Since(start).Milliseconds())
	m.cfg.Events.Publish(events.Event{Kind: events.Transition, ID: sb.ID, From: string(from), To: string(to),
		Ms: float64(time.Since(start).Microseconds()) / 1000, Node: m.cfg.Node})
	steps.Mark("log_events")
	out, err := m.Commit(sb.ID, to, func(s *store.Sandbox) { s.Note = note })
	steps.Mark("commit")
	then = after
	m.log.Debug("transition steps", append([]any{"id", sb.ID, "to", to}, steps.Attrs()...)...)
	return out, err
}

// IdleStep moves every idle sandbox one tier down where its timer says so.
//
// The transitions it decides run idleParallel at a time (each sandbox has
// its own lock; they share nothing else): one after another, a node
// filling with thousands of short-lived sandboxes could not tier them as
// fast as they arrive (a freeze, a snapshot and a detach take ≈ 15, 60 and
// 50 ms here, so one at a time is ≈ 8 sandboxes a second). It returns when
// all are done, so a tick never decides for a sandbox still moving.
func (m *Machine) IdleStep(now time.Time) {
	canCP := m.be.Capabilities().Checkpoint
	sem := make(chan struct{}, idleParallel)
	var wg sync.WaitGroup
	for _, v := range m.Views() {
		to, ok := tier.Next(v, m.cfg.Timers, now, canCP)
		if !ok {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var err error
			ctx := context.Background()
			switch to {
			case api.TierFrozen:
				_, err = m.Freeze(ctx, v.ID)
			case api.TierSnapshot:
				_, err = m.SnapshotOrDetach(ctx, v.ID)
			case api.TierDetached:
				_, err = m.Detach(ctx, v.ID)
			}
			if err != nil {
				m.log.Warn("idle transition failed", "id", v.ID, "to", to, "err", err)
			}
		}()
	}
	wg.Wait()
}

// idleParallel bounds the idle transitions run at once: enough to keep up
// with a node filling at tens of sandboxes a second, few enough for two
// cores (checkpoints are CPU and disk bound).
const idleParallel = 4
