package runtimes

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"sandstorm/api"
)

// A node's kept builds in use (issue 18; docs/ARCHITECTURE.md, "runsc
// builds"). A checkpoint image restores only on the runsc build that wrote
// it, and a running sandbox's sentry is the build that started it, so the
// node keeps every build it has used (Set) and each sandbox's row names
// the build its memory belongs to. From then on:
//   - a cold start runs the current build, and the row says so;
//   - a restore runs the build the image's stamp names (ForImage), and the
//     sandbox runs on that build afterwards;
//   - a clone's children run on their parent's build, pinned for the
//     clone (Pin);
//   - a warm template's image of another build is made again with the
//     current one, never restored with an old build;
//   - a build no row, snapshot or clone in progress needs is removed, at
//     start (Reconciled) and as soon as the last one lets go (Released).
// A build is needed by fewer sandboxes over time only: nothing but a
// clone's child ever takes up a build that is not current, and a child
// takes its parent's, pinned for the clone. So once a sweep finds none,
// none can appear, and removing it is safe.

// Row is what a Keeper needs of one of the node's sandboxes: the build
// its row names, and whether that build wrote its snapshot (Image) or
// runs it.
type Row struct {
	ID    string
	Key   Key
	Image bool
}

// KeeperConfig is what a Keeper reads the node's state through.
type KeeperConfig struct {
	// Set is the kept builds.
	Set *Set
	// Rows lists the node's sandboxes that name a build.
	Rows func(ctx context.Context) ([]Row, error)
	// Snapshots maps each sandbox with a snapshot directory on disk to
	// that directory (its stamp names the build that wrote it).
	Snapshots func() map[string]string
	Log       *slog.Logger
}

// Keeper is a node's use of its kept builds: which build a sandbox's
// commands run, which build restores an image, and when a build nothing
// needs is removed. A nil Keeper is a node whose backend runs no binary
// runtime (tests, the process backend): it keeps nothing and every method
// says so.
type Keeper struct {
	cfg KeeperConfig

	mu   sync.Mutex
	pins map[string]Key // clone stage → the build its image needs

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

// NewKeeper keeps cfg.Set's builds for a node.
func NewKeeper(cfg KeeperConfig) *Keeper {
	return &Keeper{cfg: cfg, pins: map[string]Key{}}
}

// Current is the current build's key ("" without kept builds).
func (k *Keeper) Current() Key {
	if k == nil {
		return ""
	}
	return k.cfg.Set.Current().Key
}

// CurrentBuild is the current build (the zero Build without kept builds).
func (k *Keeper) CurrentBuild() Build {
	if k == nil {
		return Build{}
	}
	return k.cfg.Set.Current()
}

// PathOf is the binary of build key for a sandbox's spec: "" (the
// backend's own, the current build) for no key or without kept builds;
// for a build that is not kept, a path that does not exist, so that its
// commands fail rather than run another build.
func (k *Keeper) PathOf(key Key) string {
	if k == nil || key == "" {
		return ""
	}
	return k.cfg.Set.PathOf(ForRow(key, k.Current()))
}

// ForRestore is the build that restores the image in imageDir for a
// sandbox whose row names row (ForImage: the image's stamp, else the
// row), or an error — before anything is started — when the node does
// not have that build: the caller then starts the sandbox cold, as for
// any image that does not restore, and says why.
func (k *Keeper) ForRestore(imageDir string, row Key) (Key, error) {
	if k == nil {
		return row, nil
	}
	stamp, err := ReadStamp(imageDir)
	if err != nil {
		k.cfg.Log.Warn("image stamp unreadable; using the sandbox's own build", "dir", imageDir, "err", err)
	}
	key := ForImage(stamp, row, k.Current())
	b, err := k.cfg.Set.Get(key)
	if err != nil {
		return "", fmt.Errorf("its image was written by runsc %s, which this node cannot run: %w", key, err)
	}
	if stamp == "" {
		// An image with no stamp: say which runsc it needs when it is
		// not this one (an image from before builds were kept, made by
		// a runsc that is gone), rather than let runsc fail on it.
		if v, err := ImageVersion(imageDir); err == nil && v != b.Version {
			return "", fmt.Errorf("its image was written by runsc %s, which this node no longer has (it runs %s)", v, b.Version)
		}
	}
	return key, nil
}

// Stamp records in imageDir that build key (a row's) wrote it. Without a
// stamp the image still restores with its sandbox's build (ForImage), so
// a failure is only logged.
func (k *Keeper) Stamp(imageDir string, key Key) {
	if k == nil {
		return
	}
	b, err := k.cfg.Set.Get(ForRow(key, k.Current()))
	if err == nil {
		err = WriteStamp(imageDir, b)
	}
	if err != nil {
		k.cfg.Log.Warn("image not stamped with its runsc build", "dir", imageDir, "err", err)
	}
}

// Pin keeps build key while the clone stage's image is used.
func (k *Keeper) Pin(stage string, key Key) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pins[stage] = ForRow(key, k.Current())
}

// Unpin ends Pin(stage, …), and lets its build go.
func (k *Keeper) Unpin(stage string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	key, ok := k.pins[stage]
	delete(k.pins, stage)
	k.mu.Unlock()
	if ok {
		k.Changed(key)
	}
}

// Changed says a row changed (its tier, or its build: the counts of
// Builds are out of date), and that released, if not "", is a build it
// stopped needing: if that is not the current one, a sweep may remove it
// now.
func (k *Keeper) Changed(released Key) {
	if k == nil {
		return
	}
	k.stale.Store(true)
	if released == "" || released == k.Current() || !k.ready.Load() {
		return
	}
	k.pending.Store(true)
	if !k.running.CompareAndSwap(false, true) {
		return // the running sweeper sees pending
	}
	go func() {
		for {
			for k.pending.Swap(false) {
				k.Sweep()
			}
			k.running.Store(false)
			// A release between the last Swap and the Store above.
			if !k.pending.Load() || !k.running.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// Reconciled is the end of the node's start-up reconcile: from now on the
// rows say what is there, and builds nothing needs are removed.
func (k *Keeper) Reconciled() {
	if k == nil {
		return
	}
	k.ready.Store(true)
	k.Sweep()
}

// refs is everything that needs a build: every row with one (its
// sandbox runs on it, or it wrote its snapshot), then every clone in
// progress, then every stamped snapshot on disk. Rows are read before
// pins: a pin is taken while its parent's row still names the build, so
// a sweep that misses that row (it let go after the read) sees the pin.
func (k *Keeper) refs(ctx context.Context) ([]Ref, error) {
	rows, err := k.cfg.Rows(ctx)
	if err != nil {
		return nil, err
	}
	var refs []Ref
	images := map[string]Key{} // sandbox → the build of its snapshot, from its row
	for _, r := range rows {
		if r.Key == "" {
			continue
		}
		use := Running
		if r.Image {
			use = Image
			images[r.ID] = r.Key
		}
		refs = append(refs, Ref{Key: r.Key, Use: use, ID: r.ID})
	}
	k.mu.Lock()
	for stage, key := range k.pins {
		refs = append(refs, Ref{Key: key, Use: Image, ID: stage})
	}
	k.mu.Unlock()
	for id, dir := range k.cfg.Snapshots() {
		if key, err := ReadStamp(dir); err == nil && key != "" && images[id] != key {
			refs = append(refs, Ref{Key: key, Use: Image, ID: id})
		}
	}
	return refs, nil
}

// Sweep removes every kept build nothing needs (Plan), and writes what it
// kept and why for doctor and the node's status. It does nothing before
// Reconciled.
func (k *Keeper) Sweep() {
	if k == nil || !k.ready.Load() {
		return
	}
	k.sweepMu.Lock()
	defer k.sweepMu.Unlock()
	set, log := k.cfg.Set, k.cfg.Log
	refs, err := k.refs(context.Background())
	if err != nil {
		log.Error("runsc builds: cannot list what needs them; removing none", "err", err)
		return
	}
	keep, remove, missing := Plan(set.Keys(), set.Current().Key, refs)
	for _, key := range remove {
		if err := set.Remove(key); err != nil {
			log.Error("runsc build not removed", "key", key, "err", err)
			continue
		}
		log.Info("runsc build removed: no sandbox runs on it and no image of it is left", "key", key)
	}
	for _, m := range missing {
		log.Error("runsc build missing: sandboxes need it, and the node does not have it (they start cold)", "key", m.Key, "running", m.Running, "images", m.Images)
	}
	if err := set.WriteReport(keep, missing); err != nil {
		log.Warn("runsc builds: report not written", "err", err)
	}
	k.setStatus(keep, missing)
}

func (k *Keeper) setStatus(keep []Kept, missing []Missing) {
	var out []api.RunscBuild
	for _, kept := range keep {
		b, _ := k.cfg.Set.Get(kept.Key)
		out = append(out, api.RunscBuild{Key: string(kept.Key), Version: b.Version, SHA256: b.SHA256, Current: kept.Current,
			Running: kept.Running, Images: kept.Images, Why: kept.Why})
	}
	for _, m := range missing {
		out = append(out, api.RunscBuild{Key: string(m.Key), Running: m.Running, Images: m.Images, Missing: true,
			Why: "missing: sandboxes need it and the node does not have it; they start cold"})
	}
	k.statusMu.Lock()
	k.status, k.counted = out, true
	k.statusMu.Unlock()
}

// Builds is every build the node keeps, and why (GET /v1/node "runsc");
// nil without kept builds. It counts again only when a row changed since
// it last counted: the node's status is read every second (its report's
// heartbeat), and a count lists every row.
func (k *Keeper) Builds(ctx context.Context) []api.RunscBuild {
	if k == nil {
		return nil
	}
	k.statusMu.Lock()
	out, counted := k.status, k.counted
	k.statusMu.Unlock()
	if counted && !k.stale.Swap(false) {
		return out
	}
	refs, err := k.refs(ctx)
	if err != nil {
		return out
	}
	keep, _, missing := Plan(k.cfg.Set.Keys(), k.Current(), refs)
	k.setStatus(keep, missing)
	k.statusMu.Lock()
	defer k.statusMu.Unlock()
	return k.status
}

// ImageBuild is what a move's manifest says of the build that wrote the
// image in imageDir for a sandbox whose row names row: its version and
// platform (as runtime, the backend's RuntimeVersion, says them of the
// current build) and, when the node keeps builds, its key. The sandbox
// may run on an older build than the current one (kept for it after an
// upgrade), and its checkpoint is then that build's (the sentry writes
// the image).
func (k *Keeper) ImageBuild(row Key, imageDir, runtime string) (version string, key Key) {
	if k == nil {
		return runtime, ""
	}
	stamp, _ := ReadStamp(imageDir)
	key = ForImage(stamp, row, k.Current())
	b, err := k.cfg.Set.Get(key)
	if err != nil {
		return runtime, key
	}
	platform := strings.TrimPrefix(runtime, k.cfg.Set.Current().Version)
	return b.Version + platform, key
}

// CanRestore says why the node cannot restore an image written by build
// key as runtime (its version and platform, ImageBuild's): it does not
// keep that very build (by key: version and content), or runs it on
// another platform. "" and nil key: nothing to check.
func (k *Keeper) CanRestore(key Key, runtime, ownRuntime string) error {
	if k == nil || key == "" {
		return nil
	}
	b, err := k.cfg.Set.Get(key)
	if err != nil {
		return fmt.Errorf("its image was written by runsc build %s, which this node does not keep (%v)", key, err)
	}
	platform := strings.TrimPrefix(ownRuntime, k.cfg.Set.Current().Version)
	if want := b.Version + platform; runtime != want {
		return fmt.Errorf("its image was written by runsc %q and this node runs that build as %q (another platform); it restores only on the same", runtime, want)
	}
	return nil
}
