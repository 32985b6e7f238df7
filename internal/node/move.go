package node

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/rootfs"
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

// MoveManifest is the first entry of a move stream: what the sandbox is,
// for the node it goes to.
type MoveManifest struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Template  string          `json:"template"`
	Digest    string          `json:"digest"`
	Principal string          `json:"principal,omitempty"`
	MemoryMiB int             `json:"memory_mib"`
	Tier      api.Tier        `json:"tier"`
	Idle      *api.IdleTimers `json:"idle,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	// LastActive keeps its idle timers where they were.
	LastActive time.Time `json:"last_active"`
	// Runtime is the runsc version and platform that wrote the image
	// (gvisor.Backend.RuntimeVersion): it restores only on the same.
	Runtime string `json:"runtime,omitempty"`
	// Runsc is the key of the runsc build that wrote it (its stamp, else
	// the sandbox's row: runtimes.ForImage), when the node keeps builds:
	// the node it goes to must keep that very build, or its wake after
	// the master committed the move would find no runsc to restore it
	// with and start it cold (its memory lost).
	Runsc string `json:"runsc,omitempty"`
	// Envd is the envd build (its directory's name) the image maps.
	Envd string `json:"envd,omitempty"`
	// ImageBytes and VolumeBytes bound what follows.
	ImageBytes  int64 `json:"image_bytes"`
	VolumeBytes int64 `json:"volume_bytes"`
	// UsageMiB is what its memory held at the checkpoint.
	UsageMiB int64  `json:"usage_mib,omitempty"`
	From     string `json:"from"`
}

// Entries of a move stream, in this order: the manifest, the image's
// files (flat, regular files only), the volume, the end.
const (
	moveManifest = "manifest.json"
	moveImage    = "image/"
	moveVolume   = "volume/"
	moveEnd      = "end"
)

// moveInHold is how long an arrived copy waits for its master's word
// before it drops itself: time for a master that died after its commit
// point to be replaced and settle the move (a failover takes seconds).
// If it is dropped meanwhile, the master finds it gone and puts the
// sandbox back where it came from, which kept its copy until now.
const moveInHold = 2 * time.Minute

// ErrMoving is the refusal of anything that would run or change a
// sandbox while a move of it is under way: 503, try again (it is then
// wherever the move left it).
var ErrMoving = errdefs.Refine(errdefs.ErrNoRoom, "sandbox being moved")

// refuseMoving is ErrMoving for a sandbox that is leaving or arriving.
func refuseMoving(sb store.Sandbox) error {
	switch {
	case sb.MoveOut != 0:
		return fmt.Errorf("%w: %s (%s) is leaving this node; try again in a moment, where its master then has it", ErrMoving, sb.Name, sb.ID)
	case sb.MoveIn:
		return fmt.Errorf("%w: %s (%s) is arriving on this node and not yet confirmed by its master", ErrMoving, sb.Name, sb.ID)
	}
	return nil
}

// MoveOut sends sandbox id to w as a move stream for the move of
// generation gen (the generation the sandbox is to have where it goes): a
// hot or frozen sandbox is checkpointed first (snapshot, with the
// gateway drained), a snapshotted one sends its image, a detached one
// its volume only. It leaves the sandbox here, marked MoveOut and as a
// snapshot, for its master to settle (MoveAbort: it stays; or a delete).
// If it fails before anything was sent, it clears the mark itself.
func (n *Node) MoveOut(ctx context.Context, id string, gen int64, w io.Writer) error {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case sb.LeftBehind:
		return refuseLeftBehind(sb)
	case sb.MoveIn:
		return refuseMoving(sb)
	case sb.MoveOut != 0:
		return fmt.Errorf("%w: sandbox %s is already leaving by another move (generation %d)", errdefs.ErrConflict, sb.Name, sb.MoveOut)
	case gen <= 0:
		return fmt.Errorf("%w: a move needs its master's generation", errdefs.ErrBadInput)
	}
	t, err := n.st.GetTemplate(ctx, sb.Template)
	if err != nil {
		return err
	}
	e := n.entry(sb.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = e.acquire(actx)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: sandbox %s (%s) is busy with another transition; try again when it is done", errdefs.ErrConflict, sb.Name, sb.ID)
	}
	held := true
	defer func() {
		if held {
			e.release()
		}
	}()
	from := e.getTier()
	if (from == api.TierHot || from == api.TierFrozen) && !n.be.Capabilities().Checkpoint {
		return fmt.Errorf("%w: the %s backend cannot checkpoint, so a running sandbox cannot move with its memory", errdefs.ErrNotSupported, n.be.Name())
	}
	if sb, err = n.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error { s.MoveOut = gen; return nil }); err != nil {
		return err
	}
	e.moving.Store(true)
	n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	// Nothing has left yet: on a failure from here until the first byte
	// is written, the sandbox stays here as it is.
	stay := func(cause error) error {
		n.clearMoveOut(sb.ID)
		return cause
	}
	began := time.Now()
	var checkpointed time.Duration
	var lockTo func() // what is left of the checkpoint, run with the lock once the stream may start
	if from == api.TierHot || from == api.TierFrozen {
		if err := n.adm.Disk("its snapshot, to move it", n.imageMiB(sb.ID)); err != nil {
			return stay(err)
		}
		if err := n.begin(sb.ID, api.TierSnapshot); err != nil {
			return stay(err)
		}
		finish, err := n.checkpoint(sb, from)
		if err != nil {
			// checkpoint settled it (kept running, or re-created cold),
			// or failed before it ran and left it as it was.
			cur, _ := n.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error { s.Transition = ""; return nil })
			e.setTier(cur.Tier)
			return stay(fmt.Errorf("checkpoint %s to move it: %w", sb.Name, err))
		}
		if sb, err = n.commit(sb.ID, api.TierSnapshot, nil); err != nil {
			finish()
			return stay(err)
		}
		n.log.Info("sandbox transition", "id", sb.ID, "from", from, "to", api.TierSnapshot, "why", "move")
		checkpointed = time.Since(began)
		// The image is whole: the stopped container's delete and its
		// namespace's removal (≈ 44 ms, as after a snapshot's answer:
		// transitionThen) run beside the stream, under the sandbox's lock,
		// not before its first byte — but before its end marker: the node
		// it goes to lays the sandbox out (namespace ss-<id>, cgroup,
		// runsc restore under the same ID) only once the stream has ended,
		// and nodes on one machine (fleet up --nodes, the e2e fleets) share
		// those names, so this node's teardown must be over by then.
		lockTo = finish
	}
	// No way in while it is leaving: its endpoints are the new node's
	// once the move is done, and here again if it is given up.
	n.gw.Close(sb.ID)
	var tornDown chan struct{}
	if lockTo != nil {
		tornDown = make(chan struct{})
		n.finishing.Add(1)
		go func() {
			defer n.finishing.Done()
			defer e.release()
			defer close(tornDown)
			lockTo()
		}()
	} else {
		e.release()
	}
	held = false
	d := n.dir(sb.ID)
	m := MoveManifest{ID: sb.ID, Name: sb.Name, Template: sb.Template, Digest: t.Digest, Principal: sb.Principal,
		MemoryMiB: int(n.limitOf(sb, t)), Tier: from, Idle: sb.Idle, CreatedAt: sb.CreatedAt, LastActive: sb.LastActive,
		From: n.cfg.Name, UsageMiB: e.lastUsageMiB.Load()}
	var image []string
	if d.HasSnapshot() {
		var key runtimes.Key
		m.Runtime, key = n.kept.ImageBuild(runtimes.Key(sb.Runsc), d.Snapshot(), n.backendRuntime())
		m.Runsc = string(key)
		if src := d.EnvdSource(); src != "" {
			m.Envd = filepath.Base(src)
		}
		if image, m.ImageBytes, err = imageFiles(d.Snapshot()); err != nil {
			return stay(err)
		}
		if from == api.TierDetached {
			return stay(fmt.Errorf("sandbox %s is detached but has an image", sb.Name))
		}
	} else if from != api.TierDetached {
		return stay(fmt.Errorf("sandbox %s is %s but has no image to move", sb.Name, from))
	}
	if m.VolumeBytes, err = treeBytes(d.Upper()); err != nil {
		return stay(err)
	}
	tw := tar.NewWriter(w)
	mb, _ := json.Marshal(m)
	if err := tw.WriteHeader(&tar.Header{Name: moveManifest, Mode: 0o600, Size: int64(len(mb)), Typeflag: tar.TypeReg}); err != nil {
		return stay(err)
	}
	// From here something may have left: the mark is the master's to clear.
	if _, err := tw.Write(mb); err != nil {
		return err
	}
	for _, name := range image {
		if err := sendFile(tw, filepath.Join(d.Snapshot(), name), moveImage+name); err != nil {
			return err
		}
	}
	if _, err := rootfs.PackVolume(d.Upper(), tw, moveVolume); err != nil {
		return err
	}
	if tornDown != nil {
		<-tornDown // see lockTo above
	}
	if err := tw.WriteHeader(&tar.Header{Name: moveEnd, Mode: 0o600, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	n.log.Info("move: sandbox sent", "id", sb.ID, "name", sb.Name, "tier", from, "image_bytes", m.ImageBytes, "volume_bytes", m.VolumeBytes, "generation", gen,
		"checkpoint_ms", checkpointed.Milliseconds(), "total_ms", time.Since(began).Milliseconds())
	return nil
}

// clearMoveOut lets sandbox id stay: unmarked, served again in the tier
// it is in (a move's checkpoint left it a snapshot; its next request
// wakes it with its memory).
func (n *Node) clearMoveOut(id string) error {
	sb, err := n.st.UpdateSandbox(context.Background(), id, func(s *store.Sandbox) error { s.MoveOut = 0; return nil })
	if err != nil {
		return err
	}
	n.entry(id).moving.Store(false)
	if err := n.listen(sb); err != nil {
		return err
	}
	n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	return nil
}

// imageFiles lists a checkpoint image's files (runsc writes them flat)
// and their total size.
func imageFiles(dir string) ([]string, int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	var names []string
	var total int64
	for _, de := range ents {
		if !de.Type().IsRegular() {
			return nil, 0, fmt.Errorf("checkpoint image %s holds %s, which is not a regular file", dir, de.Name())
		}
		fi, err := de.Info()
		if err != nil {
			return nil, 0, err
		}
		names = append(names, de.Name())
		total += fi.Size()
	}
	return names, total, nil
}

// treeBytes is the size of the regular files under dir (0 if it is not
// there).
func treeBytes(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			total += fi.Size()
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return total, err
}

func sendFile(tw *tar.Writer, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: fi.Size(), Typeflag: tar.TypeReg, ModTime: fi.ModTime()}); err != nil {
		return err
	}
	k, err := io.Copy(tw, f)
	if err == nil && k != fi.Size() {
		err = fmt.Errorf("%s changed size while it was sent", path)
	}
	return err
}

// maxManifest bounds a move stream's manifest.
const maxManifest = 64 << 10

// MoveIn takes a sandbox a move stream r brings (MoveOut's, through the
// master) as the move of generation gen: its row (same ID, name and
// principal; a slot, address and gateway ports of this node's), its
// image and volume checked as they are written (sizes bounded by the
// manifest and the disk reserve, names confined to the sandbox's
// directory), then — for one that was hot or frozen — a restore into this
// node's network namespace and bundle. It stays MoveIn, with no way in or
// out, until MoveCommit. On any failure nothing of it is left.
func (n *Node) MoveIn(ctx context.Context, gen int64, r io.Reader) (store.Sandbox, error) {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("%w: move stream: %v", errdefs.ErrBadInput, err)
	}
	if hdr.Name != moveManifest || hdr.Typeflag != tar.TypeReg || hdr.Size > maxManifest {
		return store.Sandbox{}, fmt.Errorf("%w: move stream: it starts with %q, not its manifest", errdefs.ErrBadInput, hdr.Name)
	}
	var m MoveManifest
	if err := json.NewDecoder(io.LimitReader(tr, maxManifest)).Decode(&m); err != nil {
		return store.Sandbox{}, fmt.Errorf("%w: move manifest: %v", errdefs.ErrBadInput, err)
	}
	t, err := n.checkManifest(ctx, m, gen)
	if err != nil {
		return store.Sandbox{}, err
	}
	if err := n.adm.Disk("a moved sandbox", (m.ImageBytes+m.VolumeBytes)>>20); err != nil {
		return store.Sandbox{}, err
	}
	if err := n.adm.FDs(); err != nil {
		return store.Sandbox{}, err
	}
	running := m.Tier == api.TierHot || m.Tier == api.TierFrozen
	if running {
		need := m.UsageMiB
		if need <= 0 {
			need = n.expectedMiB(t, int64(m.MemoryMiB))
		}
		if err := n.admitMemory(ctx, m.ID, func() error { return n.adm.Memory(m.ID, need) }); err != nil {
			return store.Sandbox{}, err
		}
	}
	made := false
	defer func() {
		if !made {
			n.releasePromise(m.ID)
		}
	}()
	select {
	case n.starts <- struct{}{}:
		defer func() { <-n.starts }()
	case <-ctx.Done():
		return store.Sandbox{}, fmt.Errorf("%w: the master gave up while %d starts were running on this node: %v", ErrMoving, n.cfg.MaxStarts, context.Cause(ctx))
	}
	sb := store.Sandbox{ID: m.ID, Name: m.Name, Template: t.Name, Node: n.cfg.Name, Backend: n.be.Name(),
		Tier: api.TierDetached, Transition: m.Tier, LastActive: m.LastActive, CreatedAt: m.CreatedAt, Principal: m.Principal,
		MemoryMiB: m.MemoryMiB, Slot: -1, Generation: gen, Idle: m.Idle, MoveIn: true, Runsc: m.Runsc,
		Note: fmt.Sprintf("moved from node %s with its memory and volume", m.From)}
	if m.Tier == api.TierDetached {
		sb.Note = fmt.Sprintf("moved from node %s (it was detached: its volume came with it)", m.From)
	}
	n.allocMu.Lock()
	err = n.fenced(gen)
	if err == nil {
		err = n.allocate(ctx, &sb, t.Ports)
	}
	if err == nil {
		err = n.st.CreateSandbox(ctx, sb)
	}
	n.allocMu.Unlock()
	if err != nil {
		return store.Sandbox{}, err
	}
	e := n.entry(sb.ID)
	e.moving.Store(true)
	e.lastActive.Store(m.LastActive.UnixMilli())
	e.lastUsageMiB.Store(m.UsageMiB)
	e.lock <- struct{}{}
	defer e.release()
	fail := func(cause error) (store.Sandbox, error) {
		bg := context.Background()
		n.teardown(bg, sb, true)
		n.st.DeleteSandbox(bg, sb.ID)
		n.forget(sb.ID)
		return store.Sandbox{}, cause
	}
	began := time.Now()
	if err := n.receive(tr, sb, m); err != nil {
		return fail(err)
	}
	received := time.Since(began)
	d := n.dir(sb.ID)
	envdDir := ""
	if m.Envd != "" {
		envdDir, _ = n.envd.Named(m.Envd) // checked in checkManifest
	}
	to := m.Tier
	steps := newStepTimer()
	switch {
	case running:
		if err := n.layOut(sb, t, envdDir); err != nil {
			return fail(err)
		}
		steps.mark("layout")
		d.Mark("restoring here after a move from node %s (memory kept)", m.From)
		if err := n.be.Restore(context.Background(), n.spec(sb), d.Snapshot()); err != nil {
			return fail(fmt.Errorf("restore the moved image: %w", err))
		}
		steps.mark("restore")
		os.RemoveAll(d.Snapshot())
		if m.Tier == api.TierFrozen {
			if err := n.be.Pause(context.Background(), n.spec(sb)); err != nil {
				return fail(fmt.Errorf("freeze the restored sandbox again: %w", err))
			}
		}
		n.protect(sb)
	case m.Tier == api.TierSnapshot:
		// Its spec names the envd build its image maps: what its wake
		// restores with (envdDirFor).
		if err := d.WriteSpec(t, n.limitOf(sb, t), sb.Name, "", envdDir); err != nil {
			return fail(err)
		}
	}
	made = true
	sb, err = n.commit(sb.ID, to, nil)
	if err != nil {
		return fail(err)
	}
	n.log.Info("move: sandbox arrived; waiting for its master to confirm it", append([]any{"id", sb.ID, "name", sb.Name, "tier", to, "from", m.From,
		"receive_ms", received.Milliseconds(), "total_ms", time.Since(began).Milliseconds(), "generation", gen}, steps.attrs()...)...)
	time.AfterFunc(moveInHold, func() {
		cur, err := n.st.GetSandbox(context.Background(), sb.ID)
		if err == nil && cur.MoveIn && cur.Generation == gen {
			n.dropMoveIn(context.Background(), cur, fmt.Sprintf("its master did not confirm the move within %v", moveInHold), false)
		}
	})
	return sb, nil
}

// checkManifest refuses a move this node cannot take as it is, before
// anything is made: a bad name, a template it has not got (or of
// another rootfs), an image of another runsc, an envd build it has not
// got, a sandbox it already has.
func (n *Node) checkManifest(ctx context.Context, m MoveManifest, gen int64) (store.Template, error) {
	bad := func(format string, args ...any) (store.Template, error) {
		return store.Template{}, fmt.Errorf("%w: move of %s: %s", errdefs.ErrBadInput, m.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case gen <= 0:
		return bad("no generation")
	case !api.ValidName(m.Name):
		return bad("name %q is not valid", m.Name)
	case !validID(m.ID):
		return bad("ID %q is not valid", m.ID)
	case m.Principal != "" && !api.ValidPrincipal(m.Principal):
		return bad("principal %q is not valid", m.Principal)
	case m.ImageBytes < 0 || m.VolumeBytes < 0 || m.MemoryMiB < 0:
		return bad("negative sizes")
	case m.Envd != "" && (len(m.Envd) != 16 || strings.Trim(m.Envd, "0123456789abcdef") != ""):
		return bad("envd build %q is not 16 hex digits", m.Envd)
	}
	switch m.Tier {
	case api.TierHot, api.TierFrozen, api.TierSnapshot:
		// An image holds the sandbox's memory and the runtime's own
		// state: no more than its limit and a margin.
		if lim := int64(m.MemoryMiB)<<20 + maxImageOver; m.ImageBytes > lim {
			return bad("an image of %d bytes for a sandbox of %d MiB", m.ImageBytes, m.MemoryMiB)
		}
		if err := n.canRestore(m); err != nil {
			return store.Template{}, err
		}
		rv := ""
		if b, ok := n.be.(interface{ RuntimeVersion() string }); ok {
			rv = b.RuntimeVersion()
		}
		if m.Runsc == "" && m.Runtime != rv {
			return store.Template{}, fmt.Errorf("%w: move of %s: its image was written by runsc %q and this node runs %q; it restores only on the runsc that wrote it", errdefs.ErrPrecondition, m.Name, m.Runtime, rv)
		}
		if m.Envd != "" {
			if _, err := n.envd.Named(m.Envd); err != nil {
				return store.Template{}, fmt.Errorf("%w: move of %s: its image maps envd build %s, which node %s has not got (it runs another sandstormd build)", errdefs.ErrPrecondition, m.Name, m.Envd, n.cfg.Name)
			}
		}
	case api.TierDetached:
		if m.ImageBytes != 0 {
			return bad("a detached sandbox with an image")
		}
	default:
		return bad("tier %q", m.Tier)
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

// maxImageOver is what an image may hold beyond its sandbox's memory
// limit (the sentry's own state).
const maxImageOver = 256 << 20

// validID is a sandbox ID as the node makes them (newID: 12 hex digits),
// or a pooled one's.
func validID(id string) bool {
	return len(id) >= 1 && len(id) <= 32 && strings.Trim(id, "0123456789abcdef") == ""
}

// receive writes the image and volume of a move stream into sb's
// directory, each bounded by what the manifest declared, and requires the
// stream's end entry: a stream cut short is never taken for whole.
func (n *Node) receive(tr *tar.Reader, sb store.Sandbox, m MoveManifest) error {
	d := n.dir(sb.ID)
	if err := os.MkdirAll(d.Snapshot(), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(d.Upper(), 0o755); err != nil {
		return err
	}
	vol, err := rootfs.NewTree(d.Upper(), rootfs.Limits{MaxBytes: max(m.VolumeBytes, 1)})
	if err != nil {
		return err
	}
	finished := false
	defer func() {
		if !finished {
			vol.Abort()
		}
	}()
	var imageBytes int64
	for {
		hdr, err := tr.Next()
		if err != nil {
			return fmt.Errorf("%w: move stream cut short: %v", errdefs.ErrBadInput, err)
		}
		switch name := hdr.Name; {
		case name == moveEnd:
			if _, err := vol.Finish(); err != nil {
				return err
			}
			finished = true
			if !d.HasSnapshotFiles() && m.Tier != api.TierDetached {
				return fmt.Errorf("%w: move stream of %s brought no image", errdefs.ErrBadInput, m.Name)
			}
			return nil
		case strings.HasPrefix(name, moveImage):
			leaf := strings.TrimPrefix(name, moveImage)
			if m.Tier == api.TierDetached || hdr.Typeflag != tar.TypeReg || leaf == "" || strings.ContainsAny(leaf, "/\x00") || leaf == "." || leaf == ".." {
				return fmt.Errorf("%w: move stream: image entry %q", rootfs.ErrUnsafe, name)
			}
			if imageBytes += hdr.Size; imageBytes > m.ImageBytes {
				return fmt.Errorf("%w: move stream: image of more than the %d bytes its manifest said", rootfs.ErrTooLarge, m.ImageBytes)
			}
			if err := writeNew(filepath.Join(d.Snapshot(), leaf), io.LimitReader(tr, hdr.Size), hdr.Size); err != nil {
				return err
			}
		case strings.HasPrefix(name, moveVolume):
			if hdr.Typeflag == tar.TypeLink {
				return fmt.Errorf("%w: move stream: hard link %q in a volume", rootfs.ErrUnsafe, name)
			}
			hdr.Name = strings.TrimPrefix(name, moveVolume)
			if hdr.Name == "" {
				continue
			}
			if err := vol.Add(hdr, tr); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: move stream: unexpected entry %q", rootfs.ErrUnsafe, name)
		}
	}
}

// hasSnapshotFiles reports whether the image directory holds anything.

// writeNew writes exactly size bytes of r to a new file at path (never
// through a link, never over a file).
func writeNew(path string, r io.Reader, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	k, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && k != size {
		err = fmt.Errorf("%w: %s: %d of %d bytes", errdefs.ErrBadInput, path, k, size)
	}
	return err
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
	e := n.entry(sb.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.acquire(actx); err != nil {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s is busy", errdefs.ErrConflict, id)
	}
	defer e.release()
	// Again under its lock: its hold may have run out meanwhile.
	if sb, err = n.st.GetSandbox(ctx, id); err != nil {
		return store.Sandbox{}, err
	}
	if sb.Generation != gen || !sb.MoveIn {
		return sb, nil
	}
	steps := newStepTimer()
	if tier := e.getTier(); tier == api.TierHot || tier == api.TierFrozen {
		if err := n.boundaryUp(sb); err != nil {
			return store.Sandbox{}, err
		}
	}
	steps.mark("boundary")
	if sb, err = n.st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error { s.MoveIn = false; return nil }); err != nil {
		return store.Sandbox{}, err
	}
	steps.mark("store")
	e.moving.Store(false)
	e.lastActive.Store(time.Now().UnixMilli())
	if err := n.listen(sb); err != nil {
		return store.Sandbox{}, err
	}
	steps.mark("listen")
	n.log.Info("move: sandbox confirmed here", append([]any{"id", sb.ID, "name", sb.Name, "tier", sb.Tier, "generation", gen}, steps.attrs()...)...)
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
		e := n.entry(sb.ID)
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := e.acquire(actx); err != nil {
			return fmt.Errorf("%w: sandbox %s is busy", errdefs.ErrConflict, id)
		}
		defer e.release()
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
		n.teardown(ctx, sb, true)
		n.forget(sb.ID)
		n.releasePromise(sb.ID)
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
