// Package gvisor is the default sandbox backend: every container is a gVisor
// sandbox run by runsc, one per network namespace. The runsc is the one the
// repository pins (tools/runsc/go.mod, built by make runsc; see runsc.go),
// on the systrap platform by default (KVM hangs on the VMs we run on).
//
// What that runsc needs, measured here (issue 8):
//   - The sandbox joins the network namespace its OCI spec names
//     (linux.namespaces, type network, with a path); without a path it gets
//     a new, empty one. No command has to run inside the namespace: the
//     control socket is a file under --root (see maxRootLen).
//   - It takes the namespace's interface addresses and routes into its own
//     netstack and removes them from the host side, so the node puts them
//     back before every start and restore.
//   - After a checkpoint the sandbox process lingers for 1–2 s; Checkpoint
//     deletes the container at once, and Restore removes any leftover
//     first.
//   - The first run under a root bind-mounts an empty netns at
//     <root>/null-netns for its gofers and never unmounts it (see Close).
//
// (Debian's runsc 2022-12 needed more: --network=sandbox refused to run
// unless /proc/sys/net/core was hidden, its control socket was an abstract
// socket of the sandbox's netns, so every command went through nsenter, and
// it could not checkpoint a listening socket watched by epoll.)
//
// Every command has a deadline (see deadline.go), and a sandbox whose runsc
// hangs — its sandbox process or gofer stopped (SIGSTOP) or wedged, so that
// runsc's control-socket calls never return — is killed by the pids in its
// runsc state and cleaned up by Remove (see kill.go).
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"sandstorm/internal/reclaim"
	"sandstorm/internal/sandbox"
)

// Backend runs containers with runsc.
type Backend struct {
	// Runsc is the runsc binary.
	Runsc string
	// Root is runsc's --root: its per-container state.
	Root string
	// Platform is runsc's --platform (systrap or ptrace).
	Platform string
	// Compression is runsc checkpoint's --compression for snapshots: ""
	// or "none" (runsc's default now: a Python server's image is 8.7 MiB,
	// the 64 MiB numpy app's 83 MiB, restored at the disk's speed) or
	// "flate-best-speed" (2.3 / 5.5 MiB, slower to restore; for a node
	// whose disk is slow or small). Clone and warm images are never
	// compressed.
	Compression string
	// Observe, when set, hears every runsc command this backend runs: its
	// subcommand, how long it took and its error (nil, an exit status, a
	// *TimeoutError). It is how the node's metrics time runsc by verb
	// (internal/metrics) without this package knowing of them; it is
	// called on the command's goroutine, so it must not block.
	Observe Observer
	// BackgroundMin is the image size from which restores use
	// -background (BackgroundRestoreMin; see Restore).
	BackgroundMin int64
	// Log receives what Remove had to force (kills, state it dropped);
	// nil is slog.Default().
	Log *slog.Logger

	// deadlines, when set, replace the default deadlines (tests).
	deadlines *deadlines
	// version is what runsc --version said when New ran.
	version string
}

// RuntimeVersion is the runsc version and platform checkpoint images of
// this backend are made with: an image restores only on the runsc version
// that wrote it (runsc compares them), and a platform change is treated
// the same, to be safe.
func (b *Backend) RuntimeVersion() string { return b.version + " " + b.Platform }

func (b *Backend) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

// New returns a backend running the runsc binary at runsc ("" is
// DefaultRunsc) on platform ("" is DefaultPlatform), with its state under
// root. It fails when the binary does not run or root is too long for
// runsc's control sockets.
func New(root, runsc, platform string) (*Backend, error) {
	if runsc == "" {
		var err error
		if runsc, err = DefaultRunsc(); err != nil {
			return nil, err
		}
	}
	if platform == "" {
		platform = DefaultPlatform
	}
	if err := checkPlatform(platform); err != nil {
		return nil, err
	}
	if err := checkRoot(root); err != nil {
		return nil, err
	}
	v, err := Version(context.Background(), runsc)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	return &Backend{Runsc: runsc, Root: root, Platform: platform, version: v, BackgroundMin: BackgroundRestoreMin}, nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "gvisor" }

// Capabilities implements sandbox.Backend: runsc pauses and checkpoints.
func (b *Backend) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Pause: true, Checkpoint: true}
}

// flags are the top-level runsc flags. Restore needs exactly the flags the
// container was created with, so there is one place that builds them.
//
// --overlay2=none: a current runsc wraps the rootfs in an overlay of its own
// by default (root:self), whose upper layer is a gVisor filestore file that
// goes with the container. A sandbox's writes must reach the rootfs the
// node mounted for it instead, whose upper dir is the sandbox's volume:
// that is what a detached sandbox keeps, and what its cold start finds
// (TestVolumeSurvivesEveryTier fails without it).
// --allow-suid lets a setuid binary raise its user inside the sandbox
// (the base template's sudo); every sandbox whose spec keeps
// noNewPrivileges (all but those whose init is envd, bundle.go) still
// cannot ("The OCI --no-new-privileges flag continues to prevent ID
// elevation even when this flag is true", runsc/config/flags.go). It is
// the sentry's own users either way: nothing on the host changes.
func (b *Backend) flags() []string {
	return []string{"--root", b.Root, "--platform=" + b.Platform, "--network=sandbox", "--overlay2=none", "--allow-suid"}
}

// runsc runs runsc with args, killing it after limit, and returns its
// combined output. args ends with the container ID. The control socket of
// a current runsc is a file under Root, so commands need not run inside
// the container's network namespace (runsc 2022-12's was an abstract
// socket of that namespace, and every command went through nsenter).
func (b *Backend) runsc(ctx context.Context, limit time.Duration, args ...string) ([]byte, error) {
	var out bytes.Buffer
	c := command{
		what:  "runsc " + args[0] + " " + args[len(args)-1],
		limit: limit, name: b.Runsc, args: append(b.flags(), args...),
		stdout: &out, stderr: &out, wait: b.dl().waitDelay,
		verb: args[0], observe: b.Observe,
	}
	if err := c.run(ctx); err != nil {
		if cutShort(err) {
			return out.Bytes(), err
		}
		return out.Bytes(), fmt.Errorf("runsc %s: %w: %s", args[0], err, lastLine(out.String()))
	}
	return out.Bytes(), nil
}

// lastLine keeps error messages short: runsc prints Go stack traces. A
// refused checkpoint says why at the end of a long dump of the endpoint;
// that sentence is what a person needs.
func lastLine(s string) string {
	if i := strings.Index(s, "save rejected"); i >= 0 {
		s = s[i:]
		if j := strings.Index(s, ":\n"); j > 0 {
			s = s[:j]
		}
	}
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "\n"); i >= 0 {
		s = s[:i]
	}
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}

// launch runs `runsc run|restore -detach`, killing it after limit. The
// sandbox joins the network namespace its spec names (linux.namespaces;
// without a path a current runsc starts in a new, empty netns with only
// lo). The container's stdout and stderr go to spec.LogPath. A launch that
// is cut short (deadline, or ctx cancelled) leaves a half-started sandbox:
// its processes are killed and its state removed before launch returns.
//
// runsc takes the netns's interface addresses and routes into its own
// netstack and removes them from the host side; a netns without them
// gives a sandbox with only lo, and runsc exits 0 all the same (a warning
// in its debug log is the only sign). The node puts them back before each
// start and restore; tookNetwork checks they were taken.
func (b *Backend) launch(ctx context.Context, limit time.Duration, spec sandbox.Spec, sub ...string) error {
	logf, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// A shell takes the spec's oom_score_adj before it execs runsc, so
	// that every process runsc forks is born with it: the sentry's
	// address-space stubs are forked before runsc applies the spec (and
	// runsc 2022-12 never applied it after a restore), and would otherwise
	// inherit sandstormd's own -900. Setting it afterwards races with
	// stubs being cloned (seen in CI: one stub left at 0).
	name, args := b.Runsc, append(b.flags(), sub...)
	if adj, ok := oomScoreAdjOf(spec.Bundle); ok {
		name = "sh"
		args = append([]string{"-c", "echo " + strconv.Itoa(adj) + ` > /proc/self/oom_score_adj && exec "$@"`, "sh", b.Runsc}, args...)
	}
	// Both must be files, not pipes: the detached sandbox inherits them
	// and keeps them open for its whole life, so a pipe would never reach
	// EOF and Run would never return. (With files, Wait has no copying to
	// wait for; sandbox.WaitDelay is set all the same.) runsc's own errors land in
	// the log too; the new part of it is read back on failure.
	off, _ := logf.Seek(0, io.SeekEnd)
	c := command{
		what:  "runsc " + sub[0] + " " + spec.ID,
		limit: limit, name: name, args: args,
		stdout: logf, stderr: logf, wait: b.dl().waitDelay,
		verb: sub[0], observe: b.Observe,
	}
	err = c.run(ctx)
	if err == nil {
		if left := tookNetwork(spec.Netns); left != nil {
			err = fmt.Errorf("runsc %s %s started the sandbox without its network: %w", sub[0], spec.ID, left)
			if rerr := b.Remove(context.WithoutCancel(ctx), spec); rerr != nil {
				return fmt.Errorf("%w; removing it: %v", err, rerr)
			}
			return err
		}
		return nil
	}
	if cutShort(err) {
		if rerr := b.forceRemove(context.WithoutCancel(ctx), spec, err); rerr != nil {
			return fmt.Errorf("%w; cleaning up the half-started sandbox: %v", err, rerr)
		}
		return fmt.Errorf("%w (the half-started sandbox was removed)", err)
	}
	return fmt.Errorf("runsc %s %s: %w: %s", sub[0], spec.ID, err, lastLine(readFrom(spec.LogPath, off)))
}

// oomScoreAdjOf reads process.oomScoreAdj from the bundle's config.json.
// The value is bounded to the kernel's range so that nothing but a number
// reaches the shell.
func oomScoreAdjOf(bundle string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return 0, false
	}
	var s specs.Spec
	if json.Unmarshal(data, &s) != nil || s.Process == nil || s.Process.OOMScoreAdj == nil {
		return 0, false
	}
	adj := *s.Process.OOMScoreAdj
	if adj < -1000 || adj > 1000 {
		return 0, false
	}
	return adj, true
}

// readFrom returns what path holds after offset off (at most 64 KiB).
func readFrom(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	f.Seek(off, io.SeekStart)
	b, _ := io.ReadAll(io.LimitReader(f, 64<<10))
	return lastRunscError(string(b))
}

// lastRunscError picks the most useful line of runsc output: the last one
// that looks like an error, else the first.
func lastRunscError(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if strings.Contains(l, "error") || strings.Contains(l, "failed") || strings.Contains(l, "cannot") {
			return l
		}
	}
	return s
}

// Start implements sandbox.Backend. runsc run gets sandbox.RunTimeout; add the
// Remove of a leftover with the same ID before it, and of the half-started
// sandbox when it is cut short.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec) error {
	liveCgroups.Delete(b.liveKey(spec.ID))
	b = b.on(spec)
	if err := b.cleanup(ctx, spec); err != nil {
		return err
	}
	return b.launch(ctx, b.dl().run, spec, "run", "-detach", "-bundle", spec.Bundle, spec.ID)
}

// cleanup removes a leftover with the same ID (stopped, or hung) so that
// run/restore can reuse it (runsc keeps a stopped container's state until
// delete).
func (b *Backend) cleanup(ctx context.Context, spec sandbox.Spec) error {
	if !b.has(spec.ID) {
		return nil
	}
	if err := b.Remove(ctx, spec); err != nil {
		return fmt.Errorf("remove the leftover container %s: %w", spec.ID, err)
	}
	return nil
}

// stateFile is where runsc keeps the state of container id (sandbox and
// container share the ID here): "<root>/<id>_sandbox:<id>.state".
func (b *Backend) stateFile(id string) string {
	return filepath.Join(b.Root, id+"_sandbox:"+id+".state")
}

// lockFile is runsc's lock file for container id, next to its state file.
func (b *Backend) lockFile(id string) string {
	return filepath.Join(b.Root, id+"_sandbox:"+id+".lock")
}

// socketFile is the sandbox's control socket (see maxRootLen); a sandbox
// killed before runsc could delete it leaves it behind.
func (b *Backend) socketFile(id string) string {
	return filepath.Join(b.Root, "runsc-"+id+".sock")
}

// Close unmounts what runsc keeps mounted under Root across containers:
// the shared empty network namespace its gofers join (<root>/null-netns,
// bind-mounted by the first runsc run and never unmounted by runsc). It
// may be stacked several times by runs that raced. Running sandboxes are
// unaffected (their gofers are in it already); the next run mounts it
// again. Without it, the root cannot be removed (EBUSY).
func (b *Backend) Close() error {
	p := filepath.Join(b.Root, "null-netns")
	for unix.Unmount(p, unix.MNT_DETACH) == nil {
	}
	return nil
}

// has reports whether runsc keeps state for id under Root: one stat, so it
// stays cheap with thousands of containers.
func (b *Backend) has(id string) bool {
	_, err := os.Stat(b.stateFile(id))
	return err == nil
}

// Has reports whether runsc under b's root has a record of container id
// (its state file): from its start until it is deleted.
func (b *Backend) Has(id string) bool { return b.has(id) }

// Pause implements sandbox.Backend. It takes at most sandbox.ControlTimeout; a
// pause that timed out leaves the sandbox's state unknown (the error wraps
// context.DeadlineExceeded), for the caller to settle.
func (b *Backend) Pause(ctx context.Context, spec sandbox.Spec) error {
	b = b.on(spec)
	_, err := b.runsc(ctx, b.dl().control, "pause", spec.ID)
	return err
}

// Resume implements sandbox.Backend, like Pause.
func (b *Backend) Resume(ctx context.Context, spec sandbox.Spec) error {
	b = b.on(spec)
	_, err := b.runsc(ctx, b.dl().control, "resume", spec.ID)
	return err
}

// Checkpoint implements sandbox.Backend. On success the container is
// stopped and imageDir holds its state. gVisor kills the sandbox when a save
// fails (e.g. "endpoint cannot be saved in connected state" while a TCP
// connection is established), so callers must re-check State. It takes at
// most sandbox.CheckpointBase plus the sandbox's memory at sandbox.CheckpointRate; when that
// runs out the error wraps context.DeadlineExceeded and the sandbox is left
// as it is (possibly still saving, or hung) for the caller to settle.
func (b *Backend) Checkpoint(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	if err := b.CheckpointLeaving(ctx, spec, imageDir); err != nil {
		return err
	}
	// The container is stopped now. Deleting it frees the ID for restore;
	// if that fails the image is still good, and Restore removes the
	// leftover before it starts.
	b = b.on(spec)
	b.runsc(ctx, b.dl().delete, "delete", "-force", spec.ID)
	return nil
}

// CheckpointLeaving implements sandbox.CheckpointLeaver: runsc checkpoint,
// whose image is complete when it returns, without the runsc delete that
// Checkpoint does after it. The stopped container's sandbox process
// lingers for 1–2 s and still says "running" (see the node's reconcile),
// until the caller's Remove.
func (b *Backend) CheckpointLeaving(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	b = b.on(spec)
	d := b.dl()
	limit := d.sized(d.checkpointBase, b.memoryBytes(spec.ID))
	args := []string{"checkpoint", "--image-path=" + imageDir, spec.ID}
	if b.Compression != "" {
		args = append([]string{"checkpoint", "--compression=" + b.Compression}, args[1:]...)
	}
	_, err := b.runsc(ctx, limit, args...)
	return err
}

// CheckpointRunning implements sandbox.Cloner: runsc checkpoint
// --leave-running. A paused container stays paused (measured), so a clone
// can pause the parent, checkpoint it, copy its volume and resume it, all
// from one consistent moment. Deadlines as for Checkpoint.
func (b *Backend) CheckpointRunning(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	b = b.on(spec)
	d := b.dl()
	limit := d.sized(d.checkpointBase, b.memoryBytes(spec.ID))
	_, err := b.runsc(ctx, limit, "checkpoint", "--leave-running", "--image-path="+imageDir, spec.ID)
	return err
}

// memoryBytes is what the sandbox of id holds in memory (its memory
// cgroup's usage: gVisor's application memory is a memfd charged there),
// sandbox.FallbackMemory when that cannot be read.
func (b *Backend) memoryBytes(id string) int64 {
	st, err := b.readState(id)
	if err != nil || st.Sandbox == nil || st.Sandbox.Pid <= 0 {
		return sandbox.FallbackMemory
	}
	cg, err := reclaim.CgroupOf(st.Sandbox.Pid)
	if err != nil {
		return sandbox.FallbackMemory
	}
	if n := cg.Usage(); n > 0 {
		return n
	}
	return sandbox.FallbackMemory
}

// BackgroundRestoreMin is the image size from which restores run with
// -background by default (see Restore).
const BackgroundRestoreMin = 32 << 20

// Restore implements sandbox.Backend. runsc restore gets sandbox.RestoreBase plus
// the image's size at sandbox.CheckpointRate; add Removes as for Start.
func (b *Backend) Restore(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	liveCgroups.Delete(b.liveKey(spec.ID))
	b = b.on(spec)
	if err := b.cleanup(ctx, spec); err != nil {
		return err
	}
	d := b.dl()
	size := dirSize(imageDir)
	limit := d.sized(d.restoreBase, size)
	if (b.Compression == "" || b.Compression == "none") && size >= b.BackgroundMin {
		// -background: runsc returns once the sandbox can run, and its
		// memory goes on loading behind it (a page not there yet is
		// waited for, so memory stays intact: TestServersThroughEveryTier
		// checks it after every restore). Measured raw, 64 MiB in the
		// sandbox, n=8: 101 ms against 116 to return, 117 against 129
		// until the whole of it was read back. For a small image it does
		// not pay: the web demo's 8.7 MiB image woke in 1.09 × raw restore
		// with it and 1.03 × without (bench/tiers, n=40 each, one after
		// the other), so it is used from BackgroundRestoreMin up. The
		// sentry reads the image through file descriptors runsc hands it,
		// so the node may delete the image as soon as restore returns. It
		// needs an uncompressed image; one that is not (written with
		// another --snapshot-compression) is restored again without it.
		err := b.launch(ctx, limit, spec, "restore", "-detach", "-background", "-image-path="+imageDir, "-bundle", spec.Bundle, spec.ID)
		if err == nil || cutShort(err) {
			return err
		}
		b.log().Info("runsc restore -background failed; restoring again without it", "id", spec.ID, "err", err)
		if err := b.cleanup(ctx, spec); err != nil {
			return err
		}
	}
	return b.launch(ctx, limit, spec, "restore", "-detach", "-image-path="+imageDir, "-bundle", spec.Bundle, spec.ID)
}

// dirSize is the total size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, de os.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() {
			if fi, err := de.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// Remove implements sandbox.Backend. It runs to its end even when ctx is
// cancelled — half a removal leaves a sandbox nobody owns — and is bounded
// by its own deadlines instead: at most sandbox.RemoveTimeout.
//
// runsc delete -force is asked first, unless the sandbox or gofer process
// is stopped (SIGSTOP: it would never answer) or the netns is gone (runsc
// could not reach the control socket and would delete the state while the
// processes live on). If it fails or times out, the sandbox, gofer and any
// runsc command still running for this container are SIGKILLed by pid (from
// runsc's state file and /proc), Remove waits until they are gone, and asks
// runsc delete again; if runsc still keeps state for the ID, that state is
// removed by hand — only ever after the processes were seen dead — so the
// ID can be dropped or reused.
func (b *Backend) Remove(ctx context.Context, spec sandbox.Spec) error {
	liveCgroups.Delete(b.liveKey(spec.ID))
	b = b.on(spec)
	ctx = context.WithoutCancel(ctx)
	// runsc leaves its lock file behind when a create is cut short; once
	// the state is gone, nothing else uses it.
	defer func() {
		if !b.has(spec.ID) {
			os.Remove(b.lockFile(spec.ID))
		}
	}()
	if !b.has(spec.ID) {
		return nil
	}
	var cause error
	if p, ok := b.stoppedProc(spec.ID); ok {
		cause = fmt.Errorf("its %s process (pid %d) is stopped", p.role, p.pid)
	} else {
		_, err := b.runsc(ctx, b.dl().delete, "delete", "-force", spec.ID)
		if err == nil || !b.has(spec.ID) {
			return nil
		}
		cause = err
	}
	return b.forceRemove(ctx, spec, cause)
}

// State implements sandbox.Backend. It takes at most sandbox.ControlTimeout: a
// sandbox that does not answer in time (stopped, wedged) yields an error
// that wraps context.DeadlineExceeded — its state is unknown, which is not
// the same as stopped.
func (b *Backend) State(ctx context.Context, spec sandbox.Spec) (sandbox.State, error) {
	b = b.on(spec)
	if !b.has(spec.ID) {
		return sandbox.StateAbsent, nil
	}
	out, err := b.runsc(ctx, b.dl().control, "state", spec.ID)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("runsc state %s: %w", spec.ID, err)
	}
	switch st.Status {
	case "running", "created":
		return sandbox.StateRunning, nil
	case "paused":
		return sandbox.StatePaused, nil
	default:
		return sandbox.StateStopped, nil
	}
}

// List implements sandbox.Backend: the container IDs runsc keeps under Root.
// runsc names its state files "<sandbox-id>_sandbox:<container-id>.state".
func (b *Backend) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(b.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".state") {
			continue
		}
		if i := strings.Index(name, "_sandbox:"); i > 0 {
			out = append(out, name[:i])
		}
	}
	return out, nil
}

// Reclaim implements sandbox.Reclaimer: it pushes the memory of a paused
// sandbox's cgroup out to swap (see package reclaim).
func (b *Backend) Reclaim(ctx context.Context, spec sandbox.Spec) (before, after int64, err error) {
	b = b.on(spec)
	out, err := b.runsc(ctx, b.dl().control, "state", spec.ID)
	if err != nil {
		return 0, 0, err
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		return 0, 0, fmt.Errorf("runsc state %s: no sandbox pid", spec.ID)
	}
	r, err := reclaim.Process(st.Pid)
	return r.Before, r.After, err
}

// WaitInFlight implements sandbox.InFlightWaiter: it waits until no runsc
// command (run, restore, checkpoint, delete, …) with this backend's --root
// is running any more, polling /proc every 20 ms, until ctx ends. The
// sandbox and gofer processes (argv[0] runsc-sandbox, runsc-gofer) are not
// commands and are not waited for.
//
// A command of an earlier sandstormd lost the deadline it was started with
// when that daemon died; it gets it back here: one that has run longer than
// a command of its kind may (see deadline.go) is SIGKILLed — the daemon
// that started it would have killed it by now — and not waited for.
func (b *Backend) WaitInFlight(ctx context.Context) error {
	for {
		var pids []int
		for _, c := range b.inFlight() {
			if limit := b.limitOf(c.args); c.age() > limit {
				b.log().Warn("runsc: killing a command that outlived its deadline", "pid", c.pid,
					"command", strings.Join(c.args, " "), "ran", c.age().Round(time.Millisecond), "deadline", limit)
				c.kill()
				continue
			}
			pids = append(pids, c.pid)
		}
		if len(pids) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("runsc commands of an earlier sandstormd still running (pids %v): %w", pids, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// inFlight lists the runsc commands using this backend's root (other than
// this process).
func (b *Backend) inFlight() []proc {
	return scanProcs(func(args []string) bool {
		return filepath.Base(args[0]) == "runsc" && hasFlag(args, "root", b.Root)
	})
}

// limitOf is the deadline this backend gives the runsc command args
// (argv of a runsc process: flags, subcommand, its flags, container ID).
func (b *Backend) limitOf(args []string) time.Duration {
	d := b.dl()
	sub, id := subcommand(args), args[len(args)-1]
	switch sub {
	case "state", "pause", "resume", "kill", "ps", "events":
		return d.control
	case "run", "create", "start":
		return d.run
	case "delete":
		return d.delete
	case "checkpoint":
		return d.sized(d.checkpointBase, b.memoryBytes(id))
	case "restore":
		for _, a := range args {
			if v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "image-path="); ok {
				return d.sized(d.restoreBase, dirSize(v))
			}
		}
	}
	return d.sized(d.checkpointBase, sandbox.FallbackMemory)
}
