package node

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
	"sandstorm/internal/gateway"
	"sandstorm/internal/netns"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// coldStart starts sb from its template: rootfs overlay, OCI spec, network
// namespace and veth, container. It is also the wake from detached (wake
// true), which its console log says: its memory is new, its volume kept.
func (n *Node) coldStart(ctx context.Context, sb store.Sandbox, t store.Template, wake bool) error {
	if err := n.prepare(sb, t, n.envd.Current()); err != nil {
		return err
	}
	if wake {
		n.dir(sb.ID).Mark("started from template %s (a cold start: its memory is new, its volume kept)", t.Name)
	} else {
		n.dir(sb.ID).Mark("started from template %s (created)", t.Name)
	}
	if err := n.onCurrentRunsc(&sb); err != nil {
		return err
	}
	return n.be.Start(ctx, n.spec(sb))
}

// prepare lays out everything a sandbox runs in before runsc starts or
// restores it: the overlay of the template's rootfs and its volume, its
// network namespace and veth (addresses put back), its resolver, its
// boundary, and the bundle's OCI spec with its own hostname and netns. A
// cold start, a warm start and a clone's child differ only after it.
func (n *Node) prepare(sb store.Sandbox, t store.Template, envdDir string) error {
	if err := n.layOut(sb, t, envdDir); err != nil {
		return err
	}
	return n.boundaryUp(sb)
}

// layOut is prepare without the boundary: what a pooled sandbox has
// before a create gives it a principal. envdDir is the envd build its spec
// mounts: the current one for a cold start, the image's for a restore
// (envdDirFor).
func (n *Node) layOut(sb store.Sandbox, t store.Template, envdDir string) error {
	d := n.dir(sb.ID)
	if err := d.MountRootfs(t.Rootfs); err != nil {
		return err
	}
	nw, err := n.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	if err := netns.Create(nw); err != nil {
		return err
	}
	if err := d.WriteResolvConf(nw.Host.Addr()); err != nil {
		return err
	}
	return d.WriteSpec(t, n.limitOf(sb, t), sb.Name, nw.Path(), envdDir)
}

// Wake brings sandbox id to hot from any tier (gateway.Waker). Concurrent
// callers share one wake. ctx bounds only the admission — waiting for the
// sandbox's lock, a wake slot and memory — so a wake that cannot start in
// time is refused (gateway.ErrRefused or admission.ErrNoMemory), while one that started runs
// to the end.
func (n *Node) Wake(ctx context.Context, id string) error {
	e, ok := n.lookup(id)
	if !ok {
		sb, err := n.st.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if e, ok = n.lookup(sb.ID); !ok {
			return fmt.Errorf("sandbox %s is not on this node", id)
		}
	}
	if e.getTier() == api.TierHot && !e.busy() {
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

	w.err = n.wake(ctx, e)
	if errors.Is(w.err, gateway.ErrRefused) || errors.Is(w.err, admission.ErrNoMemory) {
		n.cfg.Events.Publish(events.Event{Kind: events.Refusal, ID: e.id, Node: n.cfg.Name, Reason: "wake: " + w.err.Error()})
	}

	e.mu.Lock()
	e.waking = nil
	e.mu.Unlock()
	close(w.done)
	return w.err
}

func (n *Node) wake(ctx context.Context, e *entry) (err error) {
	steps := newStepTimer()
	if err := e.acquire(ctx); err != nil {
		err = fmt.Errorf("%w: sandbox %s is busy with another transition", gateway.ErrRefused, e.id)
		n.countTransition(e.getTier(), api.TierHot, 0, err, false)
		return err
	}
	defer e.release()
	from := e.getTier()
	if from == api.TierHot {
		return nil
	}
	// Counted as it ends, however it ends; a restore that fell back to a
	// cold start is a failed wake from snapshot (its memory is lost),
	// even though the sandbox is hot.
	var took time.Duration
	var fellBack bool
	defer func() { n.countTransition(from, api.TierHot, took, err, fellBack) }()
	select {
	case n.wakes <- struct{}{}:
		defer func() { <-n.wakes }()
	case <-ctx.Done():
		return fmt.Errorf("%w: %d wakes already running on this node", gateway.ErrRefused, n.cfg.MaxWakes)
	}
	steps.mark("lock")
	sb, err := n.st.GetSandbox(context.Background(), e.id)
	if err != nil {
		return err
	}
	steps.mark("get")
	if sb.LeftBehind {
		return refuseLeftBehind(sb)
	}
	if err := refuseMoving(sb); err != nil {
		return err
	}
	// The rows are read once, here, and passed down (issue 15: a wake read
	// each twice).
	var t store.Template
	if from != api.TierFrozen { // a frozen sandbox already holds its memory
		if t, err = n.st.GetTemplate(context.Background(), sb.Template); err != nil {
			return err
		}
		need := e.lastUsageMiB.Load() // what it held when it was checkpointed
		if from != api.TierSnapshot || need <= 0 {
			need = n.expectedMiB(t, n.limitOf(sb, t))
		}
		if err := n.guard.Admit(ctx, e.id, func() error { return n.adm.Memory(e.id, need) }); err != nil {
			return err
		}
		if err := n.adm.FDs(); err != nil {
			return err
		}
	}
	steps.mark("admit")
	if err := n.begin(e.id, api.TierHot); err != nil {
		return err
	}
	steps.mark("begin")
	start := time.Now()
	// From here the wake runs to the end, whatever the caller's deadline.
	bg := context.Background()
	switch from {
	case api.TierFrozen:
		err = n.be.Resume(bg, n.spec(sb))
	case api.TierSnapshot:
		if err = n.restore(bg, sb, t); err != nil {
			fellBack = true
			return n.recoverFailedRestore(e, sb, err, start)
		}
	default:
		err = n.coldStart(bg, sb, t, true)
	}
	if err != nil {
		n.adm.Release(e.id)
		n.log.Error("wake failed", "id", e.id, "from", from, "err", err)
		n.settleAfterFailure(sb, from, fmt.Sprintf("wake from %s failed: %v", from, err))
		return fmt.Errorf("wake sandbox %s from %s: %w", e.id, from, err)
	}
	took = time.Since(start)
	steps.mark("backend")
	ms := float64(took.Microseconds()) / 1000
	e.lastActive.Store(time.Now().UnixMilli())
	// A frozen sandbox's processes are the ones protect already scored
	// when it went hot (a freeze changes no oom_score_adj); rescoring them
	// was 0.44 ms at p50, 1.1 ms at p90 of a 10 ms frozen wake (its "wake
	// steps" debug line, 60 wakes of web), on the path issue 19 holds to
	// raw resume + 2 ms. Restored and cold-started ones are new processes.
	if from != api.TierFrozen {
		n.protect(sb)
	}
	steps.mark("protect")
	_, err = n.commit(e.id, api.TierHot, func(s *store.Sandbox) {
		s.LastWakeMs, s.LastWakeFrom, s.Note = ms, from, ""
	})
	steps.mark("commit")
	n.log.Debug("wake steps", append([]any{"id", e.id, "from", from}, steps.attrs()...)...)
	n.log.Info("sandbox woken", "id", e.id, "from", from, "ms", ms)
	n.cfg.Events.Publish(events.Event{Kind: events.Wake, ID: e.id, From: string(from), To: string(api.TierHot), Ms: ms, Node: n.cfg.Name})
	return err
}

func (n *Node) coldStartFromStore(ctx context.Context, sb store.Sandbox) error {
	t, err := n.st.GetTemplate(ctx, sb.Template)
	if err != nil {
		return err
	}
	return n.coldStart(ctx, sb, t, true)
}

// restore brings a snapshot of sb (of template t) back: what a cold start
// lays out (layOut: overlay, namespace and veth with the same addresses,
// resolver, spec), its boundary, then runsc restore from the image, which
// is deleted once the sandbox runs (each checkpoint needs an image
// directory of its own).
func (n *Node) restore(ctx context.Context, sb store.Sandbox, t store.Template) error {
	d := n.dir(sb.ID)
	steps := newStepTimer()
	if err := n.restoreRunsc(&sb, d.Snapshot()); err != nil {
		return err
	}
	if err := n.layOut(sb, t, n.envd.For(d)); err != nil {
		return err
	}
	steps.mark("network")
	if err := n.boundaryUp(sb); err != nil {
		return err
	}
	steps.mark("boundary")
	d.Mark("restoring from its snapshot (memory kept)")
	if err := n.be.Restore(ctx, n.spec(sb), d.Snapshot()); err != nil {
		return err
	}
	steps.mark("runsc_restore")
	err := os.RemoveAll(d.Snapshot())
	steps.mark("drop_image")
	n.log.Debug("restore steps", append([]any{"id", sb.ID}, steps.attrs()...)...)
	return err
}

// stepTimer records how long each step of a transition took, for the debug
// log (--log-level debug), so a slow wake can be taken apart.
type stepTimer struct {
	last  time.Time
	steps []any
}

func newStepTimer() *stepTimer { return &stepTimer{last: time.Now()} }

// mark ends the step called name.
func (s *stepTimer) mark(name string) {
	now := time.Now()
	s.steps = append(s.steps, name+"_ms", float64(now.Sub(s.last).Microseconds())/1000)
	s.last = now
}

func (s *stepTimer) attrs() []any { return s.steps }

// recoverFailedRestore handles a snapshot that would not restore (a
// corrupt or incomplete image): the image is dropped and the sandbox
// re-created cold from its template, so the request that woke it is still
// served; its note says the memory state was lost.
func (n *Node) recoverFailedRestore(e *entry, sb store.Sandbox, cause error, start time.Time) error {
	bg := context.Background()
	n.log.Error("restore failed; re-creating the sandbox cold", "id", sb.ID, "err", cause)
	n.be.Remove(bg, n.spec(sb))
	os.RemoveAll(n.dir(sb.ID).Snapshot())
	note := "restore failed: " + cause.Error()
	if err := n.coldStartFromStore(bg, sb); err != nil {
		n.teardown(bg, sb, false)
		n.commit(sb.ID, api.TierDetached, func(s *store.Sandbox) { s.Note = note + "; cold start failed too: " + err.Error() })
		return fmt.Errorf("wake sandbox %s: %w; cold start failed too: %v", sb.ID, cause, err)
	}
	ms := float64(time.Since(start).Microseconds()) / 1000
	e.lastActive.Store(time.Now().UnixMilli())
	n.protect(sb)
	_, err := n.commit(sb.ID, api.TierHot, func(s *store.Sandbox) {
		s.LastWakeMs, s.LastWakeFrom = ms, api.TierSnapshot
		s.Note = note + "; re-created cold from its template (memory state lost)"
	})
	return err
}

// settleAfterFailure puts a sandbox whose transition failed into a tier
// that matches what is really there, and says so in its note — never
// silently lost.
func (n *Node) settleAfterFailure(sb store.Sandbox, from api.Tier, note string) {
	st, err := n.be.State(context.Background(), n.spec(sb))
	var to api.Tier
	switch {
	case err == nil && st == sandbox.StateRunning:
		to = api.TierHot
	case err == nil && st == sandbox.StatePaused:
		to = api.TierFrozen
	case n.dir(sb.ID).HasSnapshot():
		to = api.TierSnapshot
		n.cutEnvd(sb.ID)
		n.teardown(context.Background(), sb, false)
	default:
		// Its processes are gone (its program exited, the OOM killer):
		// a call to its envd still in flight would wait on a peer that
		// will never answer.
		to = api.TierDetached
		n.cutEnvd(sb.ID)
		n.teardown(context.Background(), sb, false)
	}
	n.commit(sb.ID, to, func(s *store.Sandbox) { s.Note = note })
}

// Freeze pauses a hot sandbox in place (runsc pause / cgroup.freeze).
func (n *Node) Freeze(ctx context.Context, id string) (store.Sandbox, error) {
	return n.transition(ctx, id, api.TierFrozen, func(sb store.Sandbox, from api.Tier) error {
		switch from {
		case api.TierFrozen:
			return nil
		case api.TierHot:
		default:
			return fmt.Errorf("%w: sandbox %s (%s) is %s; only a hot sandbox can be frozen (wake it first)", errdefs.ErrConflict, sb.Name, sb.ID, from)
		}
		if !n.be.Capabilities().Pause {
			return fmt.Errorf("%w: the %s backend cannot pause", errdefs.ErrNotSupported, n.be.Name())
		}
		if err := n.be.Pause(context.Background(), n.spec(sb)); err != nil {
			n.settleAfterFailure(sb, from, "freeze failed: "+err.Error())
			return err
		}
		n.squeeze(sb)
		return nil
	})
}

// squeeze pushes a just-frozen sandbox's memory out to swap when the node
// runs with Zswap. A failure costs only memory, so it is logged, not returned.
func (n *Node) squeeze(sb store.Sandbox) {
	r, ok := n.be.(sandbox.Reclaimer)
	if !n.cfg.Zswap || !ok {
		return
	}
	start := time.Now()
	before, after, err := r.Reclaim(context.Background(), n.spec(sb))
	if err != nil {
		n.log.Warn("zswap: reclaim failed", "id", sb.ID, "err", err)
		return
	}
	n.log.Info("zswap: frozen sandbox squeezed", "id", sb.ID, "before_mib", before>>20, "after_mib", after>>20,
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
func (n *Node) Snapshot(ctx context.Context, id string) (store.Sandbox, error) {
	return n.snapshot(ctx, id, false)
}

// snapshot is Snapshot; wait says whether it returns only once the stopped
// container and the namespace are gone too. The node's own pushes off
// memory wait: the stopped sandbox process holds the sandbox's memory
// until it is removed, and the memory guard asks MemAvailable again right
// after a push.
func (n *Node) snapshot(ctx context.Context, id string, wait bool) (store.Sandbox, error) {
	return n.transitionThen(ctx, id, api.TierSnapshot, func(sb store.Sandbox, from api.Tier) (func(), error) {
		switch from {
		case api.TierSnapshot:
			return nil, nil
		case api.TierHot, api.TierFrozen:
		default:
			return nil, fmt.Errorf("%w: sandbox %s (%s) is %s; only a hot or frozen sandbox can be snapshot (wake it first)", errdefs.ErrConflict, sb.Name, sb.ID, from)
		}
		if caps := n.be.Capabilities(); !caps.Checkpoint {
			return nil, fmt.Errorf("%w: %s", errdefs.ErrNotSupported, caps.Why)
		}
		if err := n.adm.Disk("its snapshot", n.imageMiB(sb.ID)); err != nil {
			return nil, err
		}
		// What is left once the image is complete (the stopped container,
		// the namespace) is done after the answer, still under the
		// sandbox's lock.
		finish, err := n.checkpoint(sb, from)
		if err == nil && wait {
			finish()
			finish = nil
		}
		return finish, err
	})
}

// snapshotOrDetach is the node's own push off memory (idle timers, memory
// pressure): a snapshot, or — when the disk cannot take the image — a
// detach that says what was lost.
func (n *Node) snapshotOrDetach(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := n.snapshot(ctx, id, true)
	if !errors.Is(err, admission.ErrNoDisk) {
		return sb, err
	}
	n.log.Warn("disk reserve: detaching instead of snapshotting", "id", id, "err", err)
	return n.detach(ctx, id, "detached instead of snapshot ("+err.Error()+"): its memory state was lost, its volume kept")
}

// checkpoint saves a hot or frozen sandbox's image into its snapshot
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
func (n *Node) checkpoint(sb store.Sandbox, from api.Tier) (finish func(), err error) {
	bg := context.Background()
	steps := newStepTimer()
	defer func() { n.log.Debug("snapshot steps", append([]any{"id", sb.ID}, steps.attrs()...)...) }()
	release := n.gw.Drain(sb.ID)
	defer release()
	steps.mark("drain")
	n.cutEnvd(sb.ID)
	steps.mark("envd")
	// Its outbound flows too: the boundary resets them and stops taking
	// new ones until the sandbox runs again.
	n.bounds.Down(sb.ID)
	steps.mark("boundary")
	// A failure before the checkpoint runs has saved nothing and left the
	// sandbox's network as it was: the sandbox stays in its tier, and gets
	// its boundary back (a later wake from frozen only resumes it, so
	// nothing else would start it again).
	keep := func(err error) (func(), error) {
		if berr := n.boundaryUp(sb); berr != nil {
			n.log.Error("boundary restart after a failed snapshot", "id", sb.ID, "err", berr)
		}
		return nil, err
	}
	spec := n.spec(sb)
	if from == api.TierFrozen {
		if err := n.be.Resume(bg, spec); err != nil {
			return keep(err)
		}
	}
	if held, ok := n.heldMiB(sb.ID); ok {
		// What it will need again when it is restored.
		n.entry(sb.ID).lastUsageMiB.Store(held)
	}
	steps.mark("usage")
	d := n.dir(sb.ID)
	os.RemoveAll(d.SnapTmp())
	os.RemoveAll(d.Snapshot())
	if err := os.MkdirAll(d.SnapTmp(), 0o700); err != nil {
		if from == api.TierFrozen {
			// Resumed above for the checkpoint: frozen again, as its
			// tier says.
			if perr := n.be.Pause(bg, spec); perr != nil {
				n.log.Error("pause after a failed snapshot", "id", sb.ID, "err", perr)
			}
		}
		return keep(err)
	}
	steps.mark("dirs")
	leaver, leaves := n.be.(sandbox.CheckpointLeaver)
	if leaves {
		err = leaver.CheckpointLeaving(bg, spec, d.SnapTmp())
	} else {
		err = n.be.Checkpoint(bg, spec, d.SnapTmp())
	}
	if err != nil {
		os.RemoveAll(d.SnapTmp())
		return nil, n.recoverFailedCheckpoint(sb, err)
	}
	steps.mark("runsc_checkpoint")
	n.kept.Stamp(d.SnapTmp(), runtimes.Key(sb.Runsc))
	steps.mark("stamp")
	if err := os.Rename(d.SnapTmp(), d.Snapshot()); err != nil {
		// Not a snapshot: the container stopped, the image not in place.
		// As a checkpoint that failed, once the stopped container is gone
		// (its lingering process would say "running"): re-created cold.
		os.RemoveAll(d.SnapTmp())
		n.be.Remove(bg, spec)
		return nil, n.recoverFailedCheckpoint(sb, err)
	}
	steps.mark("rename")
	d.Mark("checkpointed to disk (snapshot tier)")
	return func() {
		steps := newStepTimer()
		if leaves {
			if err := n.be.Remove(bg, spec); err != nil {
				n.log.Warn("remove the stopped container after its checkpoint", "id", sb.ID, "err", err)
			}
			steps.mark("runsc_delete")
		}
		// The processes are gone; release the namespace and veth too.
		if nw, err := n.Net(sb.ID, sb.Slot); err != nil {
			n.log.Warn("network of a snapshot sandbox", "id", sb.ID, "err", err)
		} else if err := netns.Delete(nw); err != nil {
			n.log.Warn("release the network namespace of a snapshot sandbox", "id", sb.ID, "err", err)
		}
		steps.mark("netns_delete")
		n.log.Debug("snapshot finish steps", append([]any{"id", sb.ID}, steps.attrs()...)...)
	}, nil
}

// recoverFailedCheckpoint handles a checkpoint that failed: if the sandbox
// still runs it stays hot; if gVisor killed it, it is re-created cold from
// its template. Either way the error is reported and the note set.
func (n *Node) recoverFailedCheckpoint(sb store.Sandbox, cause error) error {
	bg := context.Background()
	spec := n.spec(sb)
	note := "checkpoint failed: " + cause.Error()
	if st, err := n.be.State(bg, spec); err == nil && st == sandbox.StateRunning {
		if err := n.boundaryUp(sb); err != nil {
			n.log.Error("boundary restart after failed checkpoint", "id", sb.ID, "err", err)
		}
		n.commit(sb.ID, api.TierHot, func(s *store.Sandbox) { s.Note = note + "; sandbox kept running" })
		return fmt.Errorf("%w; sandbox kept running", cause)
	}
	n.be.Remove(bg, spec)
	if err := n.coldStartFromStore(bg, sb); err != nil {
		n.teardown(bg, sb, false)
		n.commit(sb.ID, api.TierDetached, func(s *store.Sandbox) { s.Note = note + "; cold start failed too: " + err.Error() })
		return fmt.Errorf("%w; cold start failed too: %v", cause, err)
	}
	n.protect(sb)
	n.commit(sb.ID, api.TierHot, func(s *store.Sandbox) { s.Note = note + "; re-created cold from its template (memory state lost)" })
	return fmt.Errorf("%w; re-created cold from its template (memory state lost)", cause)
}

// Detach removes a sandbox's processes, namespace and snapshot; only its
// volume (the overlay's upper dir) stays. A wake is a cold start.
func (n *Node) Detach(ctx context.Context, id string) (store.Sandbox, error) {
	return n.detach(ctx, id, "")
}

// detach is Detach recording note as the sandbox's note in the same write
// as its new tier, so that nobody reads it detached without the reason
// (TestDiskReserve once did, between two writes).
func (n *Node) detach(ctx context.Context, id, note string) (store.Sandbox, error) {
	return n.transitionNoted(ctx, id, api.TierDetached, note, func(sb store.Sandbox, from api.Tier) (func(), error) {
		return nil, n.detachOp(sb, from)
	})
}

// detachOp stops sb's processes and drops its image, keeping its volume.
func (n *Node) detachOp(sb store.Sandbox, from api.Tier) error {
	if from == api.TierDetached {
		return nil
	}
	release := n.gw.Drain(sb.ID)
	defer release()
	n.cutEnvd(sb.ID)
	if err := n.teardown(context.Background(), sb, false); err != nil {
		return err
	}
	n.dir(sb.ID).Mark("detached: its processes stopped, its volume kept")
	return os.RemoveAll(n.dir(sb.ID).Snapshot())
}

// transition runs op under the sandbox's lock, recording the transition
// before and the tier after. Errors from op that already settled the
// sandbox (recoverFailedCheckpoint, settleAfterFailure) are returned as is.
func (n *Node) transition(ctx context.Context, id string, to api.Tier, op func(store.Sandbox, api.Tier) error) (store.Sandbox, error) {
	return n.transitionThen(ctx, id, to, func(sb store.Sandbox, from api.Tier) (func(), error) {
		return nil, op(sb, from)
	})
}

// transitionThen is transition for an op that leaves work to do once the
// new tier is recorded (then, when op succeeded and returned one): it runs
// after the caller has its answer, still holding the sandbox's lock, so
// whatever comes next for the sandbox (a wake, a delete, a move) waits for
// it. Close waits for it too.
func (n *Node) transitionThen(ctx context.Context, id string, to api.Tier, op func(store.Sandbox, api.Tier) (then func(), err error)) (store.Sandbox, error) {
	return n.transitionNoted(ctx, id, to, "", op)
}

// transitionNoted is transitionThen that records note (empty: none) with
// the new tier.
func (n *Node) transitionNoted(ctx context.Context, id string, to api.Tier, note string, op func(store.Sandbox, api.Tier) (then func(), err error)) (store.Sandbox, error) {
	steps := newStepTimer()
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return sb, err
	}
	steps.mark("get")
	e := n.entry(sb.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.acquire(actx); err != nil {
		return sb, fmt.Errorf("%w: sandbox %s (%s) is busy with another transition; try again when it is done", errdefs.ErrConflict, sb.Name, sb.ID)
	}
	var then func()
	defer func() {
		if then == nil {
			e.release()
			return
		}
		// The lock goes with then.
		n.finishing.Add(1)
		go func() {
			defer n.finishing.Done()
			defer e.release()
			then()
		}()
	}()
	steps.mark("lock")
	if cur, err := n.st.GetSandbox(ctx, sb.ID); err == nil {
		if err := refuseMoving(cur); err != nil {
			return cur, err
		}
	}
	steps.mark("get_again")
	from := e.getTier()
	if from == to {
		return n.st.GetSandbox(ctx, sb.ID)
	}
	if err := n.begin(sb.ID, to); err != nil {
		return sb, err
	}
	steps.mark("begin")
	start := time.Now()
	after, err := op(sb, from)
	if err != nil {
		n.countTransition(from, to, 0, err, false)
		// Clear the transition unless op settled the sandbox itself.
		n.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error {
			s.Transition = ""
			return nil
		})
		cur, _ := n.st.GetSandbox(context.Background(), sb.ID)
		n.entry(sb.ID).setTier(cur.Tier)
		return cur, err
	}
	steps.mark("op")
	n.countTransition(from, to, time.Since(start), nil, false)
	n.log.Info("sandbox transition", "id", sb.ID, "from", from, "to", to, "ms", time.Since(start).Milliseconds())
	n.cfg.Events.Publish(events.Event{Kind: events.Transition, ID: sb.ID, From: string(from), To: string(to),
		Ms: float64(time.Since(start).Microseconds()) / 1000, Node: n.cfg.Name})
	steps.mark("log_events")
	out, err := n.commit(sb.ID, to, func(s *store.Sandbox) { s.Note = note })
	steps.mark("commit")
	then = after
	n.log.Debug("transition steps", append([]any{"id", sb.ID, "to", to}, steps.attrs()...)...)
	return out, err
}

// Run drives the idle timers and the memory guard until Close.
func (n *Node) Run() {
	n.done.Add(3)
	go func() {
		defer n.done.Done()
		n.guard.Loop(n.stop)
	}()
	go func() {
		defer n.done.Done()
		n.pool.Loop(n.stop)
	}()
	go func() {
		defer n.done.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		lastFlush := time.Now()
		for {
			select {
			case <-n.stop:
				return
			case <-tick.C:
			}
			n.idleStep(time.Now())
			n.guard.DiskStep()
			if time.Since(lastFlush) > 5*time.Second {
				n.flushActivity()
				lastFlush = time.Now()
			}
		}
	}()
}

// idleStep moves every idle sandbox one tier down where its timer says so.
//
// The transitions it decides run idleParallel at a time (each sandbox has
// its own lock; they share nothing else): one after another, a node
// filling with thousands of short-lived sandboxes could not tier them as
// fast as they arrive (a freeze, a snapshot and a detach take ≈ 15, 60 and
// 50 ms here, so one at a time is ≈ 8 sandboxes a second). It returns when
// all are done, so a tick never decides for a sandbox still moving.
func (n *Node) idleStep(now time.Time) {
	canCP := n.be.Capabilities().Checkpoint
	sem := make(chan struct{}, idleParallel)
	var wg sync.WaitGroup
	for _, v := range n.views() {
		to, ok := tier.Next(v, n.cfg.Timers, now, canCP)
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
				_, err = n.Freeze(ctx, v.ID)
			case api.TierSnapshot:
				_, err = n.snapshotOrDetach(ctx, v.ID)
			case api.TierDetached:
				_, err = n.Detach(ctx, v.ID)
			}
			if err != nil {
				n.log.Warn("idle transition failed", "id", v.ID, "to", to, "err", err)
			}
		}()
	}
	wg.Wait()
}

// idleParallel bounds the idle transitions run at once: enough to keep up
// with a node filling at tens of sandboxes a second, few enough for two
// cores (checkpoints are CPU and disk bound).
const idleParallel = 4

// flushActivity writes last-activity times that changed to the store, so a
// restart keeps the idle timers roughly where they were.
func (n *Node) flushActivity() {
	n.mu.Lock()
	es := make([]*entry, 0, len(n.entries))
	for _, e := range n.entries {
		es = append(es, e)
	}
	n.mu.Unlock()
	for _, e := range es {
		la := e.lastActive.Load()
		if la <= e.flushed.Load() {
			continue
		}
		_, err := n.st.UpdateSandbox(context.Background(), e.id, func(s *store.Sandbox) error {
			s.LastActive = time.UnixMilli(la)
			return nil
		})
		if err == nil {
			e.flushed.Store(la)
		}
	}
}
