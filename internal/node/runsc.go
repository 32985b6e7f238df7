package node

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// Upgrades of runsc that keep memory (issue 18; docs/ARCHITECTURE.md,
// "runsc builds"). A checkpoint image restores only on the runsc build
// that wrote it, and a running sandbox's sentry is the build that started
// it, so the node keeps every build it has used (internal/runtimes:
// <data-dir>/runsc-versions/<key>/runsc, copied in when the node starts
// with a new one) and each sandbox's row names the build its memory
// belongs to (store column runsc). n.spec(sb) hands that build to the
// backend, so every command for the sandbox — state, pause, resume,
// checkpoint, exec, kill, delete — runs it. From then on:
//   - a cold start (create, wake from detached, the fallback of a failed
//     restore or checkpoint) runs the current build, and the row says so;
//   - a restore runs the build the image's stamp names (ForImage), and the
//     sandbox runs on that build afterwards: its sentry was restored by
//     it, so its next checkpoint is that build's too;
//   - a clone's children run on their parent's build (they are restores
//     of its image);
//   - a warm template's image of another build is made again with the
//     current one (renewWarm), never restored with an old build: that
//     would put every new sandbox of the template on it;
//   - a build no row, snapshot or clone in progress needs is removed, at
//     start (after reconcile) and as soon as the last one lets go.
// A build is needed by fewer sandboxes over time only: nothing but a
// clone's child ever takes up a build that is not current, and a child
// takes its parent's, pinned for the clone (pinRunsc). So once a sweep
// finds none, none can appear, and removing it is safe.

// runscKeep is the node's state of its kept builds.
type runscKeep struct {
	set *runtimes.Set // nil: the backend runs no binary runtime (tests, process)

	mu   sync.Mutex
	pins map[string]runtimes.Key // clone stage → the build its image needs

	// ready: the start-up reconcile is done, so the rows say what is
	// really there and a sweep may remove builds.
	ready            atomic.Bool
	pending, running atomic.Bool
	sweepMu          sync.Mutex

	// stale: a row changed since status was counted.
	stale    atomic.Bool
	statusMu sync.Mutex
	status   []api.RunscBuild
	counted  bool
}

// runscDir is where the node keeps its runsc builds.
func (n *Node) runscDir() string { return filepath.Join(n.cfg.DataDir, "runsc-versions") }

// installRunsc keeps the backend's runsc build (copied in if new), makes
// the backend run the kept copy, and gives rows from before builds were
// kept the current build (the one their sandboxes most likely run on: a
// node upgraded to this version with the same runsc). A backend without a
// binary runtime has nothing to keep.
func (n *Node) installRunsc() error {
	br, ok := n.be.(sandbox.BinaryRuntime)
	if !ok {
		return nil
	}
	ctx := context.Background()
	set, err := runtimes.Open(ctx, n.runscDir(), br.Binary(), br.VersionOf, n.log)
	if err != nil {
		return fmt.Errorf("keep the runsc build: %w", err)
	}
	br.UseBinary(set.Current().Path)
	n.kept.set = set
	cur := set.Current()
	n.log.Info("runsc build", "key", cur.Key, "version", cur.Version, "sha256", cur.SHA256, "path", cur.Path, "from", br.Binary(), "kept", len(set.Keys()))
	rows, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return err
	}
	for _, sb := range rows {
		if sb.Runsc != "" || sb.Tier == api.TierDetached && sb.Transition == "" {
			continue
		}
		if _, err := n.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error {
			if s.Runsc == "" {
				s.Runsc = string(cur.Key)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// runscKey is the current build's key ("" without kept builds).
func (n *Node) runscKey() string {
	if n.kept.set == nil {
		return ""
	}
	return string(n.kept.set.Current().Key)
}

// runscPath is the binary of build key for a sandbox's spec: "" (the
// backend's own, the current build) for no key or without kept builds;
// for a build that is not kept, a path that does not exist, so that its
// commands fail rather than run another build.
func (n *Node) runscPath(key string) string {
	if n.kept.set == nil || key == "" {
		return ""
	}
	return n.kept.set.PathOf(runtimes.ForRow(runtimes.Key(key), n.kept.set.Current().Key))
}

// onCurrentRunsc records that sb, about to be started cold, runs on the
// current build (before runsc runs, so a restart finds the build that
// started it), and lets its old build go.
func (n *Node) onCurrentRunsc(sb *store.Sandbox) error {
	cur := n.runscKey()
	if cur == "" || sb.Runsc == cur {
		return nil
	}
	old := sb.Runsc
	if _, err := n.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error { s.Runsc = cur; return nil }); err != nil {
		return err
	}
	sb.Runsc = cur
	n.runscChanged(old)
	return nil
}

// restoreRunsc picks the build that restores the image in imageDir for sb
// (runtimes.ForImage: its stamp, else sb's row), records it in sb's row
// before runsc runs, and fails — before anything is started — when the
// node does not have that build: the caller then starts the sandbox cold,
// as for any image that does not restore, and says why.
func (n *Node) restoreRunsc(sb *store.Sandbox, imageDir string) error {
	set := n.kept.set
	if set == nil {
		return nil
	}
	stamp, err := runtimes.ReadStamp(imageDir)
	if err != nil {
		n.log.Warn("image stamp unreadable; using the sandbox's own build", "id", sb.ID, "err", err)
	}
	cur := set.Current().Key
	key := runtimes.ForImage(stamp, runtimes.Key(sb.Runsc), cur)
	b, err := set.Get(key)
	if err != nil {
		return fmt.Errorf("its image was written by runsc %s, which this node cannot run: %w", key, err)
	}
	if stamp == "" {
		// An image with no stamp: say which runsc it needs when it is
		// not this one (an image from before builds were kept, made by
		// a runsc that is gone), rather than let runsc fail on it.
		if v, err := runtimes.ImageVersion(imageDir); err == nil && v != b.Version {
			return fmt.Errorf("its image was written by runsc %s, which this node no longer has (it runs %s)", v, b.Version)
		}
	}
	if string(key) != sb.Runsc {
		old := sb.Runsc
		if _, err := n.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error { s.Runsc = string(key); return nil }); err != nil {
			return err
		}
		sb.Runsc = string(key)
		n.runscChanged(old)
	}
	return nil
}

// stampImage records in imageDir that build key wrote it (nothing without
// kept builds). Without a stamp the image still restores with its
// sandbox's build (ForImage), so a failure is only logged.
func (n *Node) stampImage(imageDir, key string) {
	set := n.kept.set
	if set == nil {
		return
	}
	b, err := set.Get(runtimes.ForRow(runtimes.Key(key), set.Current().Key))
	if err == nil {
		err = runtimes.WriteStamp(imageDir, b)
	}
	if err != nil {
		n.log.Warn("image not stamped with its runsc build", "dir", imageDir, "err", err)
	}
}

// freshRunsc sets sb's build from its row as it is now (a caller that
// read the row before a wake may hold an older one).
func (n *Node) freshRunsc(sb *store.Sandbox) {
	if cur, err := n.st.GetSandbox(context.Background(), sb.ID); err == nil {
		sb.Runsc = cur.Runsc
	}
}

// pinRunsc keeps build key while the clone stage's image is used.
func (n *Node) pinRunsc(stage, key string) {
	if n.kept.set == nil {
		return
	}
	n.kept.mu.Lock()
	defer n.kept.mu.Unlock()
	if n.kept.pins == nil {
		n.kept.pins = map[string]runtimes.Key{}
	}
	n.kept.pins[stage] = runtimes.ForRow(runtimes.Key(key), n.kept.set.Current().Key)
}

// unpinRunsc ends pinRunsc(stage, …), and lets its build go.
func (n *Node) unpinRunsc(stage string) {
	n.kept.mu.Lock()
	k, ok := n.kept.pins[stage]
	delete(n.kept.pins, stage)
	n.kept.mu.Unlock()
	if ok {
		n.runscChanged(string(k))
	}
}

// runscChanged says a row changed (its tier, or its build: the counts of
// RunscBuilds are out of date), and that released, if not "", is a build
// it stopped needing.
func (n *Node) runscChanged(released string) {
	n.kept.stale.Store(true)
	n.runscReleased(released)
}

// runscReleased says that something stopped needing build key: if it is
// not the current one, a sweep may remove it now.
func (n *Node) runscReleased(key string) {
	if n.kept.set == nil || key == "" || key == n.runscKey() || !n.kept.ready.Load() {
		return
	}
	n.kept.pending.Store(true)
	if !n.kept.running.CompareAndSwap(false, true) {
		return // the running sweeper sees pending
	}
	go func() {
		for {
			for n.kept.pending.Swap(false) {
				n.sweepRunsc()
			}
			n.kept.running.Store(false)
			// A release between the last Swap and the Store above.
			if !n.kept.pending.Load() || !n.kept.running.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// runscReconciled is the end of the start-up reconcile: from now on the
// rows say what is there, and builds nothing needs are removed.
func (n *Node) runscReconciled() {
	if n.kept.set == nil {
		return
	}
	n.kept.ready.Store(true)
	n.sweepRunsc()
}

// runscRefs is everything that needs a build: every row with one (its
// sandbox runs on it, or it wrote its snapshot), then every clone in
// progress, then every stamped snapshot on disk. Rows are read before
// pins: a pin is taken while its parent's row still names the build, so
// a sweep that misses that row (it let go after the read) sees the pin.
func (n *Node) runscRefs(ctx context.Context) ([]runtimes.Ref, error) {
	rows, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return nil, err
	}
	var refs []runtimes.Ref
	images := map[string]runtimes.Key{} // sandbox → the build of its snapshot, from its row
	for _, sb := range rows {
		if sb.Runsc == "" {
			continue
		}
		use := runtimes.Running
		if sb.Tier == api.TierSnapshot {
			use = runtimes.Image
			images[sb.ID] = runtimes.Key(sb.Runsc)
		}
		refs = append(refs, runtimes.Ref{Key: runtimes.Key(sb.Runsc), Use: use, ID: sb.ID})
	}
	n.kept.mu.Lock()
	for stage, k := range n.kept.pins {
		refs = append(refs, runtimes.Ref{Key: k, Use: runtimes.Image, ID: stage})
	}
	n.kept.mu.Unlock()
	stamps, _ := filepath.Glob(filepath.Join(n.cfg.DataDir, "sandboxes", "*", "snapshot"))
	for _, dir := range stamps {
		id := filepath.Base(filepath.Dir(dir))
		if k, err := runtimes.ReadStamp(dir); err == nil && k != "" && images[id] != k {
			refs = append(refs, runtimes.Ref{Key: k, Use: runtimes.Image, ID: id})
		}
	}
	return refs, nil
}

// sweepRunsc removes every kept build nothing needs (runtimes.Plan), and
// writes what it kept and why for doctor and the node's status.
func (n *Node) sweepRunsc() {
	set := n.kept.set
	if set == nil || !n.kept.ready.Load() {
		return
	}
	n.kept.sweepMu.Lock()
	defer n.kept.sweepMu.Unlock()
	ctx := context.Background()
	refs, err := n.runscRefs(ctx)
	if err != nil {
		n.log.Error("runsc builds: cannot list what needs them; removing none", "err", err)
		return
	}
	keep, remove, missing := runtimes.Plan(set.Keys(), set.Current().Key, refs)
	for _, k := range remove {
		if err := set.Remove(k); err != nil {
			n.log.Error("runsc build not removed", "key", k, "err", err)
			continue
		}
		n.log.Info("runsc build removed: no sandbox runs on it and no image of it is left", "key", k)
	}
	for _, m := range missing {
		n.log.Error("runsc build missing: sandboxes need it, and the node does not have it (they start cold)", "key", m.Key, "running", m.Running, "images", m.Images)
	}
	if err := set.WriteReport(keep, missing); err != nil {
		n.log.Warn("runsc builds: report not written", "err", err)
	}
	n.setRunscStatus(keep, missing)
}

func (n *Node) setRunscStatus(keep []runtimes.Kept, missing []runtimes.Missing) {
	set := n.kept.set
	var out []api.RunscBuild
	for _, k := range keep {
		b, _ := set.Get(k.Key)
		out = append(out, api.RunscBuild{Key: string(k.Key), Version: b.Version, SHA256: b.SHA256, Current: k.Current,
			Running: k.Running, Images: k.Images, Why: k.Why})
	}
	for _, m := range missing {
		out = append(out, api.RunscBuild{Key: string(m.Key), Running: m.Running, Images: m.Images, Missing: true,
			Why: "missing: sandboxes need it and the node does not have it; they start cold"})
	}
	n.kept.statusMu.Lock()
	n.kept.status, n.kept.counted = out, true
	n.kept.statusMu.Unlock()
}

// RunscBuilds is every runsc build the node keeps, and why (GET /v1/node
// "runsc"); nil without kept builds. It counts again only when a row
// changed since it last counted: the node's status is read every second
// (its report's heartbeat), and a count lists every row.
func (n *Node) RunscBuilds(ctx context.Context) []api.RunscBuild {
	set := n.kept.set
	if set == nil {
		return nil
	}
	n.kept.statusMu.Lock()
	out, counted := n.kept.status, n.kept.counted
	n.kept.statusMu.Unlock()
	if counted && !n.kept.stale.Swap(false) {
		return out
	}
	refs, err := n.runscRefs(ctx)
	if err != nil {
		return out
	}
	keep, _, missing := runtimes.Plan(set.Keys(), set.Current().Key, refs)
	n.setRunscStatus(keep, missing)
	n.kept.statusMu.Lock()
	defer n.kept.statusMu.Unlock()
	return n.kept.status
}

// imageBuild is what a move's manifest says of the runsc that wrote the
// image in imageDir for sb: its version and platform (as
// gvisor.Backend.RuntimeVersion says them of the current build) and,
// when this node keeps builds, its key. The sandbox may run on an older
// build than the current one (kept for it after an upgrade), and its
// checkpoint is then that build's (the sentry writes the image).
func (n *Node) imageBuild(sb store.Sandbox, imageDir string) (version, key string) {
	rv := ""
	if b, ok := n.be.(interface{ RuntimeVersion() string }); ok {
		rv = b.RuntimeVersion()
	}
	set := n.kept.set
	if set == nil {
		return rv, ""
	}
	stamp, _ := runtimes.ReadStamp(imageDir)
	k := runtimes.ForImage(stamp, runtimes.Key(sb.Runsc), set.Current().Key)
	b, err := set.Get(k)
	if err != nil {
		return rv, string(k)
	}
	platform := strings.TrimPrefix(rv, set.Current().Version)
	return b.Version + platform, string(k)
}

// canRestore refuses a move whose image this node has no runsc for:
// with kept builds, the very build that wrote it (by key: version and
// content) on this node's platform. Refused before anything is received,
// so the sandbox stays whole on the node it was leaving.
func (n *Node) canRestore(m MoveManifest) error {
	set := n.kept.set
	if m.Runsc == "" || set == nil {
		return nil
	}
	b, err := set.Get(runtimes.Key(m.Runsc))
	if err != nil {
		return fmt.Errorf("%w: move of %s: its image was written by runsc build %s, which node %s does not keep (%v); it restores only on that build: move it to a node that still has it, or let it start cold where it is", errdefs.ErrPrecondition, m.Name, m.Runsc, n.cfg.Name, err)
	}
	rv := ""
	if be, ok := n.be.(interface{ RuntimeVersion() string }); ok {
		rv = be.RuntimeVersion()
	}
	platform := strings.TrimPrefix(rv, set.Current().Version)
	if want := b.Version + platform; m.Runtime != want {
		return fmt.Errorf("%w: move of %s: its image was written by runsc %q and this node runs that build as %q (another platform); it restores only on the same", errdefs.ErrPrecondition, m.Name, m.Runtime, want)
	}
	return nil
}
