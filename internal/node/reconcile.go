package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/events"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/host"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/node/warm"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// Prepare installs the node's firewall and the unreachable route of its
// sandbox pool (netns.Pool.EnsureUnreachable). It must succeed before any sandbox
// is reconciled or created: no sandbox runs without it (fail closed).
func (n *Node) Prepare() error {
	if err := n.cfg.SAM.Firewall.Ensure(); err != nil {
		return fmt.Errorf("%w: %v", ErrFirewall, err)
	}
	if err := n.cfg.Pool.EnsureUnreachable(); err != nil {
		return fmt.Errorf("%w: %v", ErrFirewall, err)
	}
	return nil
}

// Reconcile makes the node's view match what is really on the machine, at
// start-up (after a clean stop or a kill -9 at any moment):
//   - a running container is adopted as hot, a paused one as frozen;
//   - a complete snapshot image on disk makes the sandbox snapshot (its
//     stopped container and namespace are cleaned);
//   - a sandbox whose processes are gone and that has no image becomes
//     detached (its next request cold-starts it), with a note saying so;
//   - a delete that was in progress is finished;
//   - containers, namespaces, veths and sandbox directories that belong to
//     no sandbox are removed.
//
// It is BeginReconcile, then FinishReconcile. It also opens the gateway
// listeners. It runs while the API already
// serves (issue 7: a restart must never keep the API closed): every known
// sandbox's lock is taken first, so a transition asked for meanwhile waits
// for that sandbox's repair, and Status counts the sandboxes still being
// repaired. Sandboxes are repaired a few at a time, each bounded by
// reconcileEach, so one whose runsc hangs is reported and does not hold
// up the others.
// ReconcilePlan is what BeginReconcile found: the sandboxes to repair.
type ReconcilePlan struct{ sandboxes []store.Sandbox }

// BeginReconcile is the quick, synchronous part of Reconcile, to run before
// the API opens: the firewall, and every known sandbox marked as being
// repaired (its lock taken, counted in Status) so that nothing the API is
// asked meanwhile acts on a sandbox before it has been looked at.
func (n *Node) BeginReconcile(ctx context.Context) (ReconcilePlan, error) {
	if err := n.Prepare(); err != nil {
		return ReconcilePlan{}, err
	}
	return n.planReconcile(ctx)
}

// planReconcile is BeginReconcile after the firewall (which only root can
// install): what the node's tests run.
func (n *Node) planReconcile(ctx context.Context) (ReconcilePlan, error) {
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return ReconcilePlan{}, err
	}
	for _, sb := range all {
		e := n.tiers.Entry(sb.ID)
		e.Hold() // nothing else runs before Reconcile: this never waits
		e.SetTier(sb.Tier)
	}
	// One more for the orphan sweep at the end, so that Reconciling is 0
	// only when everything is done.
	n.reconciling.Store(int64(len(all)) + 1)
	// The Host-routed listener is served from here, when every known
	// sandbox is marked as being repaired, so that a request for one
	// waits for its repair instead of finding no such sandbox.
	n.hosts.Serve(n.gw, n.hostRoute)
	return ReconcilePlan{sandboxes: all}, nil
}

// FinishReconcile repairs what BeginReconcile marked; the API may already
// serve.
func (n *Node) FinishReconcile(ctx context.Context, plan ReconcilePlan) error {
	all := plan.sandboxes
	// A kill -9 does not stop the runsc commands the daemon had started: a
	// checkpoint or restore goes on to the end. Read the state they leave,
	// not one they are still changing.
	if w, ok := n.be.(sandbox.InFlightWaiter); ok {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := w.WaitInFlight(wctx)
		cancel()
		if err != nil {
			n.log.Error("reconcile: proceeding anyway", "err", err)
		}
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, reconcileParallel)
	for _, sb := range all {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer n.reconciling.Add(-1)
			e := n.tiers.Entry(sb.ID)
			defer e.Release()
			rctx, cancel := context.WithTimeout(ctx, reconcileEach)
			defer cancel()
			if err := n.reconcileOne(rctx, sb); err != nil {
				n.log.Error("reconcile: sandbox not repaired", "id", sb.ID, "err", err)
				n.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error {
					s.Note = "the node could not repair it after a restart: " + err.Error()
					return nil
				})
				mu.Lock()
				errs = append(errs, fmt.Errorf("sandbox %s: %w", sb.ID, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	n.removeOrphans(ctx)
	n.removeOrphanWarm(ctx)
	n.kept.Reconciled()
	n.reconciling.Add(-1)
	n.log.Info("reconcile done", "sandboxes", len(all), "failed", len(errs))
	return errors.Join(errs...)
}

const (
	// reconcileParallel sandboxes are repaired at once: enough that one
	// stuck on a hung runsc does not hold up the rest, few enough not to
	// swamp a 2-core node.
	reconcileParallel = 4
	// reconcileEach bounds the repair of one sandbox; the backend's own
	// command deadlines are shorter.
	reconcileEach = 3 * time.Minute
)

func (n *Node) reconcileOne(ctx context.Context, sb store.Sandbox) error {
	spec := n.h.Spec(sb)
	e := n.tiers.Entry(sb.ID)
	e.SetLastActive(sb.LastActive.UnixMilli())
	e.Flushed(sb.LastActive.UnixMilli())
	if own, err := n.cfg.Timers.With(sb.Idle); err == nil && sb.Idle != nil {
		e.UseTimers(&own)
	}
	if sb.Transition == transitionDelete {
		n.h.Teardown(ctx, sb, true)
		n.tiers.Forget(sb.ID)
		return n.st.DeleteSandbox(ctx, sb.ID)
	}
	if sb.LeftBehind {
		return n.ensureRetired(ctx, sb)
	}
	if sb.MoveIn {
		// A move's copy its master had not confirmed when the node
		// stopped: never adopted (move.go). The master still has the
		// sandbox where it came from, and settles the move from there.
		return n.dropMoveIn(ctx, sb, "the node restarted before its master confirmed the move", true)
	}
	if sb.MoveOut != 0 {
		n.tiers.Entry(sb.ID).SetMoving(true)
	}
	st, err := n.be.State(ctx, spec)
	if err != nil {
		n.log.Warn("reconcile: state unknown, treating as stopped", "id", sb.ID, "err", err)
		st = sandbox.StateStopped
	}
	to, note, err := found(ctx, n.be, n.h, sb, st)
	if err != nil {
		return err
	}
	if to != sb.Tier || sb.Transition != "" {
		n.log.Info("reconcile", "id", sb.ID, "stored", sb.Tier, "transition", sb.Transition, "found", to)
	}
	if _, err := n.tiers.Commit(sb.ID, to, func(s *store.Sandbox) { s.Note = note }); err != nil {
		return err
	}
	if to != sb.Tier || sb.Transition != "" || note != sb.Note {
		// The master may have heard this node's full report before this
		// repair (reconcile runs behind the API): tell watchers the row
		// changed, or the master keeps the transition it was told of
		// (seen in CI: TestNodeKilledMidCreateAndMove, a create cut short
		// by a kill, "detached/hot" for good).
		if n.cfg.Events != nil {
			n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
		}
	}
	if sb.MoveOut != 0 {
		// Leaving by a move its master has not settled: nothing reaches
		// it until the master says it stays (MoveAbort) or has gone.
		return nil
	}
	if to == api.TierHot || to == api.TierFrozen {
		if err := n.h.BoundaryUp(sb); err != nil {
			return err
		}
	}
	return n.listen(sb)
}

// removeOrphans deletes what this node made for sandboxes it no longer has.
// Several daemons may share a machine (each with its own data dir), so a
// namespace or veth counts as this node's only if the node has a trace of
// the sandbox (its directory or its runsc state); others are left alone.
//
// The API is open by now, so a create may be running: what is known is read
// from the store under the allocation lock, together with what is on disk.
// A create inserts its row (under that lock) before it makes anything, so
// whatever exists without a row at that moment is an orphan.
func (n *Node) removeOrphans(ctx context.Context) {
	ours := map[string]bool{}
	known := map[string]bool{}
	n.allocMu.Lock()
	rows, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	ids, _ := n.be.List(ctx)
	dirs, _ := os.ReadDir(filepath.Join(n.cfg.DataDir, "sandboxes"))
	for _, id := range n.reserved { // pooled sandboxes have no row
		known[id] = true
	}
	n.allocMu.Unlock()
	if err != nil {
		n.log.Error("reconcile: cannot list sandboxes; not removing orphans", "err", err)
		return
	}
	for _, sb := range rows {
		known[sb.ID] = true
	}
	pooledIDs := map[string]bool{}
	for _, id := range ids {
		ours[id] = true
		if known[id] {
			continue
		}
		if n.h.Dir(id).Hostname() == warm.PooledName(id) {
			// A warm pool's sandbox has no row until a create takes it:
			// one from before a restart or a reload is expected here,
			// and its pool is made again (internal/node/warm).
			pooledIDs[id] = true
			n.log.Info("reconcile: removing a warm pool's sandbox from before the restart; the pool is made again", "id", id)
		} else {
			n.log.Warn("reconcile: removing orphaned container", "id", id)
		}
		spec := sandbox.Spec{ID: id, Netns: filepath.Join(netns.Dir, NetnsPrefix+id)}
		if err := n.be.Remove(ctx, spec); err != nil {
			n.log.Error("reconcile: remove orphaned container", "id", id, "err", err)
		}
	}
	for _, de := range dirs {
		ours[de.Name()] = true
	}
	for id := range ours {
		if known[id] {
			continue
		}
		nw := netns.Net{Name: NetnsPrefix + id, HostIf: VethPrefix + id}
		if nw.Exists() && !pooledIDs[id] {
			n.log.Warn("reconcile: removing orphaned network namespace", "netns", nw.Name)
		}
		if err := netns.Delete(nw); err != nil {
			n.log.Error("reconcile: remove orphaned network namespace", "netns", nw.Name, "err", err)
		}
		d := n.h.Dir(id)
		if _, err := os.Stat(string(d)); err == nil {
			if !pooledIDs[id] && d.Hostname() != warm.PooledName(id) {
				n.log.Warn("reconcile: removing orphaned sandbox directory", "dir", string(d))
			}
			d.UnmountRootfs()
			os.RemoveAll(string(d))
		}
	}
}

// hostRoute resolves the <sandbox> part of a Host-routed request to a
// sandbox of this node's. After a start or a reload the gateway knows a
// sandbox once it is repaired (reconcileOne opens its listeners under its
// lock): a request for it waits for that, as one to its own port waits
// in the listener's backlog, rather than being told 404.
func (n *Node) hostRoute(ref string) (string, bool) {
	sb, err := n.st.GetSandbox(context.Background(), ref)
	if err != nil || sb.Node != n.cfg.Name {
		return "", false
	}
	if int(n.reconciling.Load()) > 0 {
		if e, ok := n.tiers.Lookup(sb.ID); ok {
			ctx, cancel := context.WithTimeout(context.Background(), reconcileEach)
			if e.Acquire(ctx) == nil {
				e.Release()
			}
			cancel()
		}
	}
	return sb.ID, true
}

// found is the tier sandbox sb is really in, as the start-up repair finds
// it (its runsc state st, its snapshot directories), with the note that
// says what happened, once what a transition cut short left is finished
// or removed.
func found(ctx context.Context, be sandbox.Backend, h *host.Host, sb store.Sandbox, st sandbox.State) (to api.Tier, note string, err error) {
	d := h.Dir(sb.ID)
	note = sb.Note
	switch {
	case sb.Transition == api.TierSnapshot && layout.NonEmpty(d.SnapTmp()):
		// The checkpoint ran to its end after the daemon died (WaitInFlight
		// waited for it): finish the transition. This comes before the
		// running case: a current runsc's sandbox process lingers for 1–2 s
		// after a checkpoint and still says "running" meanwhile (measured;
		// seen in TestCrashRestart), and a checkpoint that failed halfway
		// kills the sandbox too. If the image turns out bad, the wake
		// re-creates the sandbox cold and says so.
		os.RemoveAll(d.Snapshot())
		if err := os.Rename(d.SnapTmp(), d.Snapshot()); err != nil {
			return "", "", err
		}
		to = api.TierSnapshot
		note = "its checkpoint finished while the node was down"
		stopped(ctx, be, h, sb)
	case sb.Transition == api.TierSnapshot && d.HasSnapshot(), sb.Transition == "" && sb.Tier == api.TierSnapshot && d.HasSnapshot():
		// An image renamed into place is complete (checkpoint), and its
		// container only stopped, whatever runsc says: the node records a
		// snapshot before it removes the container and the namespace
		// (checkpoint's finish, after the answer), and the daemon ended in
		// between, or before the record. Until it is removed, the stopped
		// sandbox process lingers and says "running" for 1–2 s (measured),
		// which the next case would take for a sandbox that runs.
		os.RemoveAll(d.SnapTmp())
		to = api.TierSnapshot
		if sb.Transition == api.TierSnapshot {
			note = "its checkpoint finished while the node was down"
		}
		stopped(ctx, be, h, sb)
	case st == sandbox.StateRunning || st == sandbox.StatePaused:
		to = api.TierHot
		if st == sandbox.StatePaused {
			to = api.TierFrozen
		}
		// A restore that finished after the daemon died leaves its image.
		os.RemoveAll(d.Snapshot())
		os.RemoveAll(d.SnapTmp())
	case d.HasSnapshot():
		os.RemoveAll(d.SnapTmp())
		to = api.TierSnapshot
		stopped(ctx, be, h, sb)
	default:
		os.RemoveAll(d.SnapTmp())
		to = api.TierDetached
		if sb.Tier != api.TierDetached {
			note = fmt.Sprintf("its processes were gone when the node restarted (was %s); the next request cold-starts it", sb.Tier)
		}
		h.Teardown(ctx, sb, false)
	}
	return to, note, nil
}

// stopped removes sb's stopped container and its network namespace.
func stopped(ctx context.Context, be sandbox.Backend, h *host.Host, sb store.Sandbox) {
	be.Remove(ctx, h.Spec(sb))
	if nw, err := h.Net(sb.ID, sb.Slot); err == nil {
		netns.Delete(nw)
	}
}
