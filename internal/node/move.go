package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/node/livemove"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/node/tiering"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/store"
)

// A live move (issue 18): a sandbox leaves this node with its memory and
// volume for another of its master's nodes. The master drives it
// (internal/fleet/move.go) and streams what MoveOut writes here into the
// other node's MoveIn; the two nodes never talk to each other (each
// accepts calls from its master only). The node's part of the rule that a
// sandbox runs in one place is two marks on its row:
//
//   - MoveOut (the move's generation) on the node it leaves, set before
//     anything else and cleared only by the master (MoveAbort), or by this
//     node itself only while nothing has been sent: while it is set the
//     sandbox is never woken, tiered or served (no gateway listeners), so
//     its copy here cannot run whatever happens to the master or the link.
//   - MoveIn on the node it arrives at: it is restored there (so a move
//     that cannot restore fails before the master commits to it) but gets
//     no boundary and no gateway listeners — no way in or out — until the
//     master confirms it (MoveCommit), which the master does only after it
//     has recorded the move as done. Unconfirmed, it is dropped: by
//     MoveAbort, by a fence, by the node's own restart, or after
//     moveInHold with no word.
//
// So at any moment at most one copy can act as the principal, and the
// master's one write (store.CommitMove) decides which.

// The stream's format and its manifest's checks are internal/node/livemove's.

// moveInHold is how long an arrived copy waits for its master's word
// before it drops itself: time for a master that died after its commit
// point to be replaced and settle the move (a failover takes seconds).
// If it is dropped meanwhile, the master finds it gone and puts the
// sandbox back where it came from, which kept its copy until now.
const moveInHold = 2 * time.Minute

// MoveOut sends sandbox id to w as a move stream for the move of
// generation gen (the generation the sandbox is to have where it goes): a
// hot or frozen sandbox is checkpointed first (snapshot, with the
// gateway drained), a snapshotted one sends its image, a detached one
// its volume only. It leaves the sandbox here, marked MoveOut and as a
// snapshot, for its master to settle (MoveAbort: it stays; or a delete).
// If it fails before anything was sent, it clears the mark itself.
func (n *Node) MoveOut(ctx context.Context, id string, gen int64, w io.Writer) error {
	l, err := n.leave(ctx, id, gen)
	if err != nil {
		return err
	}
	defer l.unlock()
	if err := l.checkpoint(); err != nil {
		return l.stay(err)
	}
	// No way in while it is leaving: its endpoints are the new node's
	// once the move is done, and here again if it is given up.
	n.gw.Close(l.sb.ID)
	l.release()
	m, image, err := l.manifest()
	if err != nil {
		return l.stay(err)
	}
	sw := livemove.NewWriter(w)
	if err := l.send(sw, m, image); err != nil {
		if !sw.Started() {
			return l.stay(err)
		}
		return err // something may have left: the mark is the master's to clear
	}
	n.log.Info("move: sandbox sent", "id", l.sb.ID, "name", l.sb.Name, "tier", l.from, "image_bytes", m.ImageBytes, "volume_bytes", m.VolumeBytes, "generation", gen,
		"checkpoint_ms", l.checkpointed.Milliseconds(), "total_ms", time.Since(l.began).Milliseconds())
	return nil
}

// leaving is one sandbox leaving this node by a move (MoveOut).
type leaving struct {
	n    *Node
	sb   store.Sandbox
	t    store.Template
	e    *tiering.Entry
	from api.Tier
	// held: the sandbox's lock is this move's until release.
	held bool
	// lockTo is what is left of the checkpoint, run with the lock once
	// the stream may start; tornDown is closed when it is done.
	lockTo       func()
	tornDown     chan struct{}
	began        time.Time
	checkpointed time.Duration
}

// leave takes sandbox id's lock and marks it leaving by the move of
// generation gen; it refuses a sandbox left behind, arriving, already
// leaving, or a move with no generation.
func (n *Node) leave(ctx context.Context, id string, gen int64) (*leaving, error) {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	switch {
	case sb.LeftBehind:
		return nil, tiering.RefuseLeftBehind(sb)
	case sb.MoveIn:
		return nil, tiering.RefuseMoving(sb)
	case sb.MoveOut != 0:
		return nil, fmt.Errorf("%w: sandbox %s is already leaving by another move (generation %d)", errdefs.ErrConflict, sb.Name, sb.MoveOut)
	case gen <= 0:
		return nil, fmt.Errorf("%w: a move needs its master's generation", errdefs.ErrBadInput)
	}
	t, err := n.st.GetTemplate(ctx, sb.Template)
	if err != nil {
		return nil, err
	}
	e := n.tiers.Entry(sb.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = e.Acquire(actx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s (%s) is busy with another transition; try again when it is done", errdefs.ErrConflict, sb.Name, sb.ID)
	}
	l := &leaving{n: n, sb: sb, t: t, e: e, from: e.Tier(), held: true, began: time.Now()}
	if (l.from == api.TierHot || l.from == api.TierFrozen) && !n.be.Capabilities().Checkpoint {
		l.unlock()
		return nil, fmt.Errorf("%w: the %s backend cannot checkpoint, so a running sandbox cannot move with its memory", errdefs.ErrNotSupported, n.be.Name())
	}
	if l.sb, err = n.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error { s.MoveOut = gen; return nil }); err != nil {
		l.unlock()
		return nil, err
	}
	e.SetMoving(true)
	n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	return l, nil
}

// unlock releases the sandbox's lock if the move still holds it.
func (l *leaving) unlock() {
	if l.held {
		l.held = false
		l.e.Release()
	}
}

// stay is a failure before anything has left: the sandbox stays here as
// it is, unmarked.
func (l *leaving) stay(cause error) error {
	l.n.clearMoveOut(l.sb.ID)
	return cause
}

// checkpoint takes a hot or frozen sandbox to a snapshot (the image the
// move sends); a snapshotted or detached one has nothing to do.
func (l *leaving) checkpoint() error {
	n, sb := l.n, l.sb
	if l.from != api.TierHot && l.from != api.TierFrozen {
		return nil
	}
	if err := n.adm.Disk("its snapshot, to move it", n.h.ImageMiB(sb.ID)); err != nil {
		return err
	}
	if err := n.tiers.Begin(sb.ID, api.TierSnapshot); err != nil {
		return err
	}
	finish, err := n.tiers.Checkpoint(sb, l.from)
	if err != nil {
		// checkpoint settled it (kept running, or re-created cold), or
		// failed before it ran and left it as it was.
		cur, _ := n.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error { s.Transition = ""; return nil })
		l.e.SetTier(cur.Tier)
		return fmt.Errorf("checkpoint %s to move it: %w", sb.Name, err)
	}
	if l.sb, err = n.tiers.Commit(sb.ID, api.TierSnapshot, nil); err != nil {
		finish()
		return err
	}
	n.log.Info("sandbox transition", "id", sb.ID, "from", l.from, "to", api.TierSnapshot, "why", "move")
	l.checkpointed = time.Since(l.began)
	// The image is whole: the stopped container's delete and its
	// namespace's removal (≈ 44 ms, as after a snapshot's answer:
	// transitionThen) run beside the stream, under the sandbox's lock,
	// not before its first byte — but before its end marker: the node
	// it goes to lays the sandbox out (namespace ss-<id>, cgroup, runsc
	// restore under the same ID) only once the stream has ended, and
	// nodes on one machine (fleet up --nodes, the e2e fleets) share those
	// names, so this node's teardown must be over by then.
	l.lockTo = finish
	return nil
}

// release lets go of the sandbox's lock: at once, or — when the
// checkpoint left work — once that work is done, beside the stream.
func (l *leaving) release() {
	if l.lockTo == nil {
		l.unlock()
		return
	}
	l.held = false
	l.tornDown = make(chan struct{})
	l.n.tiers.Finishing().Add(1)
	go func() {
		defer l.n.tiers.Finishing().Done()
		defer l.e.Release()
		defer close(l.tornDown)
		l.lockTo()
	}()
}

// manifest is what the stream says of the sandbox, and its image's files.
func (l *leaving) manifest() (livemove.Manifest, []string, error) {
	n, sb, t := l.n, l.sb, l.t
	d := n.h.Dir(sb.ID)
	m := livemove.Manifest{ID: sb.ID, Name: sb.Name, Template: sb.Template, Digest: t.Digest, Principal: sb.Principal,
		MemoryMiB: int(n.h.LimitOf(sb, t)), Tier: l.from, Idle: sb.Idle, Egress: sb.Egress, CreatedAt: sb.CreatedAt, LastActive: sb.LastActive,
		From: n.cfg.Name, UsageMiB: l.e.LastUsageMiB()}
	var image []string
	var err error
	if m.Secrets, err = n.h.ExportSecrets(sb.ID); err != nil {
		return m, nil, err
	}
	if d.HasSnapshot() {
		var key runtimes.Key
		m.Runtime, key = n.kept.ImageBuild(runtimes.Key(sb.Runsc), d.Snapshot(), runtimeOf(n.be))
		m.Runsc = string(key)
		if src := d.EnvdSource(); src != "" {
			m.Envd = filepath.Base(src)
		}
		if image, m.ImageBytes, err = livemove.ImageFiles(d.Snapshot()); err != nil {
			return m, nil, err
		}
		if l.from == api.TierDetached {
			return m, nil, fmt.Errorf("sandbox %s is detached but has an image", sb.Name)
		}
	} else if l.from != api.TierDetached {
		return m, nil, fmt.Errorf("sandbox %s is %s but has no image to move", sb.Name, l.from)
	}
	m.VolumeBytes, err = livemove.TreeBytes(d.Upper())
	return m, image, err
}

// send writes the stream: manifest, image, volume, and — once this
// node's teardown of the checkpointed container is over — its end.
func (l *leaving) send(sw *livemove.Writer, m livemove.Manifest, image []string) error {
	d := l.n.h.Dir(l.sb.ID)
	if err := sw.Manifest(m); err != nil {
		return err
	}
	if err := sw.Image(d.Snapshot(), image); err != nil {
		return err
	}
	if err := sw.Volume(d.Upper()); err != nil {
		return err
	}
	if l.tornDown != nil {
		<-l.tornDown // see checkpoint
	}
	return sw.End()
}

// clearMoveOut lets sandbox id stay: unmarked, served again in the tier
// it is in (a move's checkpoint left it a snapshot; its next request
// wakes it with its memory).
func (n *Node) clearMoveOut(id string) error {
	sb, err := n.st.UpdateSandbox(context.Background(), id, func(s *store.Sandbox) error { s.MoveOut = 0; return nil })
	if err != nil {
		return err
	}
	n.tiers.Entry(id).SetMoving(false)
	if err := n.listen(sb); err != nil {
		return err
	}
	n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	return nil
}

// MoveIn takes a sandbox a move stream r brings (MoveOut's, through the
// master) as the move of generation gen: its row (same ID, name and
// principal; a slot, address and gateway ports of this node's), its
// image and volume checked as they are written (livemove.Reader.Receive),
// then — for one that was hot or frozen — a restore into this node's
// network namespace and bundle. It stays MoveIn, with no way in or out,
// until MoveCommit. On any failure nothing of it is left.
func (n *Node) MoveIn(ctx context.Context, gen int64, r io.Reader) (store.Sandbox, error) {
	rd, m, err := livemove.ReadManifest(r)
	if err != nil {
		return store.Sandbox{}, err
	}
	a := &arriving{n: n, m: m, gen: gen}
	if a.t, err = n.checkManifest(ctx, m, gen); err != nil {
		return store.Sandbox{}, err
	}
	release, err := a.admit(ctx)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	if err := a.record(ctx); err != nil {
		return store.Sandbox{}, err
	}
	defer a.e.Release()
	began := time.Now()
	if err := rd.Receive(n.h.Dir(a.sb.ID), m); err != nil {
		return a.fail(err)
	}
	received := time.Since(began)
	steps, err := a.restore()
	if err != nil {
		return a.fail(err)
	}
	a.made = true
	sb, err := n.tiers.Commit(a.sb.ID, m.Tier, nil)
	if err != nil {
		return a.fail(err)
	}
	n.log.Info("move: sandbox arrived; waiting for its master to confirm it", append([]any{"id", sb.ID, "name", sb.Name, "tier", m.Tier, "from", m.From,
		"receive_ms", received.Milliseconds(), "total_ms", time.Since(began).Milliseconds(), "generation", gen}, steps.Attrs()...)...)
	time.AfterFunc(moveInHold, func() {
		cur, err := n.st.GetSandbox(context.Background(), sb.ID)
		if err == nil && cur.MoveIn && cur.Generation == gen {
			n.dropMoveIn(context.Background(), cur, fmt.Sprintf("its master did not confirm the move within %v", moveInHold), false)
		}
	})
	return sb, nil
}

// arriving is one sandbox arriving on this node by a move (MoveIn).
type arriving struct {
	n   *Node
	m   livemove.Manifest
	gen int64
	t   store.Template
	sb  store.Sandbox
	e   *tiering.Entry
	// made: it is committed; its memory's promise is its own from now on.
	made bool
}

// running reports whether it arrives with its memory to restore.
func (a *arriving) running() bool { return a.m.Tier == api.TierHot || a.m.Tier == api.TierFrozen }

// admit admits the arriving sandbox's disk, descriptors and memory, and
// takes a start slot; release gives back what a failed arrival took.
func (a *arriving) admit(ctx context.Context) (release func(), err error) {
	n, m := a.n, a.m
	if err := n.adm.Disk("a moved sandbox", (m.ImageBytes+m.VolumeBytes)>>20); err != nil {
		return nil, err
	}
	if err := n.adm.FDs(); err != nil {
		return nil, err
	}
	if a.running() {
		need := m.UsageMiB
		if need <= 0 {
			need = n.adm.Expected(reserve.SizeKey(a.t), int64(m.MemoryMiB))
		}
		if err := n.guard.Admit(ctx, m.ID, func() error { return n.adm.Memory(m.ID, need) }); err != nil {
			return nil, err
		}
	}
	unpromise := func() {
		if !a.made {
			n.adm.Release(m.ID)
		}
	}
	select {
	case n.starts <- struct{}{}:
		return func() { <-n.starts; unpromise() }, nil
	case <-ctx.Done():
		unpromise()
		return nil, fmt.Errorf("%w: the master gave up while %d starts were running on this node: %v", ErrMoving, n.cfg.MaxStarts, context.Cause(ctx))
	}
}

// record allocates the arriving sandbox's slot and ports and records its
// row, marked MoveIn, behind no fence; it then holds its lock.
func (a *arriving) record(ctx context.Context) error {
	n, m := a.n, a.m
	a.sb = store.Sandbox{ID: m.ID, Name: m.Name, Template: a.t.Name, Node: n.cfg.Name, Backend: n.be.Name(),
		Tier: api.TierDetached, Transition: m.Tier, LastActive: m.LastActive, CreatedAt: m.CreatedAt, Principal: m.Principal,
		MemoryMiB: m.MemoryMiB, Slot: -1, Generation: a.gen, Idle: m.Idle, Egress: m.Egress, MoveIn: true, Runsc: m.Runsc,
		Note: fmt.Sprintf("moved from node %s with its memory and volume", m.From)}
	if m.Tier == api.TierDetached {
		a.sb.Note = fmt.Sprintf("moved from node %s (it was detached: its volume came with it)", m.From)
	}
	n.allocMu.Lock()
	err := n.fenced(a.gen)
	if err == nil {
		err = n.allocate(ctx, &a.sb, a.t.Ports)
	}
	if err == nil {
		err = n.st.CreateSandbox(ctx, a.sb)
	}
	n.allocMu.Unlock()
	if err != nil {
		return err
	}
	a.e = n.tiers.Entry(a.sb.ID)
	a.e.SetMoving(true)
	a.e.SetLastActive(m.LastActive.UnixMilli())
	a.e.SetLastUsageMiB(m.UsageMiB)
	a.e.Hold()
	return nil
}

// fail removes all of the arriving sandbox.
func (a *arriving) fail(cause error) (store.Sandbox, error) {
	bg := context.Background()
	a.n.h.Teardown(bg, a.sb, true)
	a.n.st.DeleteSandbox(bg, a.sb.ID)
	a.n.tiers.Forget(a.sb.ID)
	return store.Sandbox{}, cause
}

// restore brings a sandbox that arrives running back into memory here
// (frozen again if it was), with no boundary and no listeners yet; a
// snapshot gets the spec its wake restores with.
func (a *arriving) restore() (*tiering.Steps, error) {
	n, m, sb, t := a.n, a.m, a.sb, a.t
	d := n.h.Dir(sb.ID)
	envdDir := ""
	if m.Envd != "" {
		envdDir, _ = n.envd.Named(m.Envd) // checked in checkManifest
	}
	steps := tiering.NewSteps()
	if err := n.h.ImportSecrets(sb.ID, m.Secrets); err != nil {
		return steps, err
	}
	switch {
	case a.running():
		if err := n.h.LayOut(sb, t, envdDir); err != nil {
			return steps, err
		}
		steps.Mark("layout")
		d.Mark("restoring here after a move from node %s (memory kept)", m.From)
		if err := n.be.Restore(context.Background(), n.h.Spec(sb), d.Snapshot()); err != nil {
			return steps, fmt.Errorf("restore the moved image: %w", err)
		}
		steps.Mark("restore")
		os.RemoveAll(d.Snapshot())
		if m.Tier == api.TierFrozen {
			if err := n.be.Pause(context.Background(), n.h.Spec(sb)); err != nil {
				return steps, fmt.Errorf("freeze the restored sandbox again: %w", err)
			}
		}
		n.h.Protect(sb)
	case m.Tier == api.TierSnapshot:
		// Its spec names the envd build its image maps: what its wake
		// restores with (envdlink.Builds.For).
		if err := d.WriteSpec(t, n.h.LimitOf(sb, t), sb.Name, "", envdDir); err != nil {
			return steps, err
		}
	}
	return steps, nil
}

// checkManifest refuses a move this node cannot take as it is, before
// anything is made: what livemove.Check refuses of any node, and an image
// of a runsc or envd build it has not got, a template it has not got (or
// of another rootfs), a sandbox it already has.
func (n *Node) checkManifest(ctx context.Context, m livemove.Manifest, gen int64) (store.Template, error) {
	if err := livemove.Check(m, gen); err != nil {
		return store.Template{}, err
	}
	if m.Tier != api.TierDetached {
		if err := canRestore(n.kept, n.be, n.cfg.Name, m); err != nil {
			return store.Template{}, err
		}
		if rv := runtimeOf(n.be); m.Runsc == "" && m.Runtime != rv {
			return store.Template{}, fmt.Errorf("%w: move of %s: its image was written by runsc %q and this node runs %q; it restores only on the runsc that wrote it", errdefs.ErrPrecondition, m.Name, m.Runtime, rv)
		}
		if m.Envd != "" {
			if _, err := n.envd.Named(m.Envd); err != nil {
				return store.Template{}, fmt.Errorf("%w: move of %s: its image maps envd build %s, which node %s has not got (it runs another sandstormd build)", errdefs.ErrPrecondition, m.Name, m.Envd, n.cfg.Name)
			}
		}
	}
	t, err := n.st.GetTemplate(ctx, m.Template)
	if err != nil {
		return store.Template{}, fmt.Errorf("%w: move of %s: this node has no template %s", errdefs.ErrPrecondition, m.Name, m.Template)
	}
	if t.Digest != "" && m.Digest != "" && t.Digest != m.Digest {
		return store.Template{}, fmt.Errorf("%w: move of %s: template %s here has rootfs %s, the sandbox's is %s", errdefs.ErrPrecondition, m.Name, m.Template, t.Digest, m.Digest)
	}
	if _, err := n.st.GetSandbox(ctx, m.ID); err == nil {
		return store.Template{}, fmt.Errorf("%w: sandbox %s (%s) is already on node %s", errdefs.ErrExists, m.Name, m.ID, n.cfg.Name)
	}
	if _, err := n.st.GetSandbox(ctx, m.Name); err == nil {
		return store.Template{}, fmt.Errorf("%w: a sandbox named %s is already on node %s", errdefs.ErrExists, m.Name, n.cfg.Name)
	}
	return t, nil
}

// MoveCommit makes an arrived sandbox live: its master has recorded the
// move (gen) as done. It gets its boundary (its principal's way out) and
// its gateway listeners (its new endpoints). Done twice, the second finds
// it live and returns it. errdefs.ErrNotFound if this node has no copy of
// that move (it was dropped: the master puts the sandbox back).
func (n *Node) MoveCommit(ctx context.Context, id string, gen int64) (store.Sandbox, error) {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	if sb.Generation != gen || sb.LeftBehind {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s here is not the copy of move %d", errdefs.ErrNotFound, id, gen)
	}
	if !sb.MoveIn {
		return sb, nil
	}
	e := n.tiers.Entry(sb.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.Acquire(actx); err != nil {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s is busy", errdefs.ErrConflict, id)
	}
	defer e.Release()
	// Again under its lock: its hold may have run out meanwhile.
	if sb, err = n.st.GetSandbox(ctx, id); err != nil {
		return store.Sandbox{}, err
	}
	if sb.Generation != gen || !sb.MoveIn {
		return sb, nil
	}
	steps := tiering.NewSteps()
	if tier := e.Tier(); tier == api.TierHot || tier == api.TierFrozen {
		if err := n.h.BoundaryUp(sb); err != nil {
			return store.Sandbox{}, err
		}
	}
	steps.Mark("boundary")
	if sb, err = n.st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error { s.MoveIn = false; return nil }); err != nil {
		return store.Sandbox{}, err
	}
	steps.Mark("store")
	e.SetMoving(false)
	e.SetLastActive(time.Now().UnixMilli())
	if err := n.listen(sb); err != nil {
		return store.Sandbox{}, err
	}
	steps.Mark("listen")
	n.log.Info("move: sandbox confirmed here", append([]any{"id", sb.ID, "name", sb.Name, "tier", sb.Tier, "generation", gen}, steps.Attrs()...)...)
	n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	return sb, nil
}

// MoveAbort gives up the move of generation gen of sandbox id on this
// node: the copy leaving it stays (unmarked, served again), the copy
// arriving goes. Not an error if there is no such move here.
func (n *Node) MoveAbort(ctx context.Context, id string, gen int64) error {
	sb, err := n.st.GetSandbox(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case sb.MoveOut != 0 && sb.MoveOut == gen:
		e := n.tiers.Entry(sb.ID)
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := e.Acquire(actx); err != nil {
			return fmt.Errorf("%w: sandbox %s is busy", errdefs.ErrConflict, id)
		}
		defer e.Release()
		if err := n.clearMoveOut(sb.ID); err != nil {
			return err
		}
		n.log.Info("move: given up; the sandbox stays here", "id", sb.ID, "name", sb.Name, "generation", gen)
		return nil
	case sb.MoveIn && sb.Generation == gen:
		return n.dropMoveIn(ctx, sb, "its master gave the move up", false)
	}
	return nil
}

// dropMoveIn removes an arrived copy its master did not confirm: all of
// it (its original is where it came from). locked: the caller holds its
// lock (the start-up reconcile).
func (n *Node) dropMoveIn(ctx context.Context, sb store.Sandbox, why string, locked bool) error {
	n.log.Warn("move: an arrived copy is dropped", "id", sb.ID, "name", sb.Name, "generation", sb.Generation, "why", why)
	if locked {
		n.h.Teardown(ctx, sb, true)
		n.tiers.Forget(sb.ID)
		n.adm.Release(sb.ID)
		err := n.st.DeleteSandbox(ctx, sb.ID)
		n.cfg.Events.Publish(events.Event{Kind: events.Delete, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	}
	err := n.Delete(context.WithoutCancel(ctx), sb.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}
