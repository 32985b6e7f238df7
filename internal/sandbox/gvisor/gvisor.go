// Package gvisor is the default sandbox backend: every container is a gVisor
// sandbox run by runsc (Debian's runsc package, 2022-12 here), one per
// network namespace, on the ptrace platform (KVM hangs on the VMs we run on).
//
// Two quirks of that runsc shape every command here (measured, see issue 2):
//   - runsc refuses --network=sandbox when it thinks it is in the root
//     network namespace, and decides that by whether
//     /proc/sys/net/core/rmem_default exists — which it does in every netns
//     on this kernel. So runsc run/restore execute in a private mount
//     namespace with a tmpfs over /proc/sys/net/core.
//   - runsc's control socket is an abstract Unix socket, which belongs to a
//     network namespace: every later command (state, pause, checkpoint,
//     kill, delete) must run inside the container's netns too, or runsc
//     reports the container stopped with pid -1 while it runs.
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
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sandstorm/internal/reclaim"
	"sandstorm/internal/sandbox"
)

// Backend runs containers with runsc.
type Backend struct {
	// Runsc is the runsc binary.
	Runsc string
	// Root is runsc's --root: its per-container state.
	Root string
	// Platform is runsc's --platform ("ptrace").
	Platform string
	// Log receives what Remove had to force (kills, state it dropped);
	// nil is slog.Default().
	Log *slog.Logger

	// deadlines, when set, replace the default deadlines (tests).
	deadlines *deadlines
}

func (b *Backend) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

// New returns a backend whose runsc state lives under root. It fails when
// runsc is not on PATH.
func New(root string) (*Backend, error) {
	bin, err := exec.LookPath("runsc")
	if err != nil {
		return nil, fmt.Errorf("runsc not found on PATH (apt-get install -y runsc): %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	return &Backend{Runsc: bin, Root: root, Platform: "ptrace"}, nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "gvisor" }

// Capabilities implements sandbox.Backend: runsc pauses and checkpoints.
func (b *Backend) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Pause: true, Checkpoint: true}
}

// flags are the top-level runsc flags. Restore needs exactly the flags the
// container was created with, so there is one place that builds them.
func (b *Backend) flags() []string {
	return []string{"--root", b.Root, "--platform=" + b.Platform, "--network=sandbox"}
}

// inNetns runs runsc with args inside netns, killing it after limit, and
// returns its combined output. args ends with the container ID. With netns
// "" runsc runs in this process's network namespace (only useful once the
// sandbox is dead: its control socket was in its own). nsenter execs runsc
// (no fork), so the process killed at the deadline is runsc itself.
func (b *Backend) inNetns(ctx context.Context, limit time.Duration, netns string, args ...string) ([]byte, error) {
	name, full := b.Runsc, append(b.flags(), args...)
	if netns != "" {
		name, full = "nsenter", append([]string{"--net=" + netns, "--", b.Runsc}, full...)
	}
	var out bytes.Buffer
	c := command{
		what:  "runsc " + args[0] + " " + args[len(args)-1],
		limit: limit, name: name, args: full,
		stdout: &out, stderr: &out, wait: b.dl().waitDelay,
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
	if strings.Contains(s, "endpoint still has waiters upon save") {
		// runsc 2022-12 cannot save a listening socket that an epoll
		// instance watches: every Go, Node.js or nginx server. Newer runsc
		// can. Python's poll()-based servers checkpoint fine.
		return "this runsc cannot checkpoint a listening socket watched by epoll (\"endpoint still has waiters upon save\"): servers written in Go, Node.js, nginx… cannot be snapshot with it; a newer runsc can"
	}
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

// launch runs `runsc run|restore -detach` in the netns, in a private mount
// namespace with /proc/sys/net/core hidden (see the package comment),
// killing it after limit. The container's stdout and stderr go to
// spec.LogPath. A launch that is cut short (deadline, or ctx cancelled)
// leaves a half-started sandbox: its processes are killed and its state
// removed before launch returns.
func (b *Backend) launch(ctx context.Context, limit time.Duration, spec sandbox.Spec, sub ...string) error {
	logf, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// The shell also takes the spec's oom_score_adj before it execs runsc,
	// so that every process runsc forks is born with it: the sentry's
	// address-space stubs are forked before runsc applies the spec (and
	// runsc 2022-12 never applies it after a restore), and would otherwise
	// inherit sandstormd's own -900. Setting it afterwards races with
	// stubs being cloned (seen in CI: one stub left at 0).
	script := `mount -t tmpfs none /proc/sys/net/core && exec "$@"`
	if adj, ok := oomScoreAdjOf(spec.Bundle); ok {
		script = "echo " + strconv.Itoa(adj) + " > /proc/self/oom_score_adj && " + script
	}
	args := []string{"--net=" + spec.Netns, "--", "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", script, "sh", b.Runsc}
	args = append(args, b.flags()...)
	args = append(args, sub...)
	// Both must be files, not pipes: the detached sandbox inherits them
	// and keeps them open for its whole life, so a pipe would never reach
	// EOF and Run would never return. (With files, Wait has no copying to
	// wait for; WaitDelay is set all the same.) runsc's own errors land in
	// the log too; the new part of it is read back on failure.
	off, _ := logf.Seek(0, io.SeekEnd)
	c := command{
		what:  "runsc " + sub[0] + " " + spec.ID,
		limit: limit, name: "nsenter", args: args,
		stdout: logf, stderr: logf, wait: b.dl().waitDelay,
	}
	err = c.run(ctx)
	if err == nil {
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

// Start implements sandbox.Backend. runsc run gets RunTimeout; add the
// Remove of a leftover with the same ID before it, and of the half-started
// sandbox when it is cut short.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec) error {
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

// has reports whether runsc keeps state for id under Root: one stat, so it
// stays cheap with thousands of containers.
func (b *Backend) has(id string) bool {
	_, err := os.Stat(b.stateFile(id))
	return err == nil
}

// Pause implements sandbox.Backend. It takes at most ControlTimeout; a
// pause that timed out leaves the sandbox's state unknown (the error wraps
// context.DeadlineExceeded), for the caller to settle.
func (b *Backend) Pause(ctx context.Context, spec sandbox.Spec) error {
	_, err := b.inNetns(ctx, b.dl().control, spec.Netns, "pause", spec.ID)
	return err
}

// Resume implements sandbox.Backend, like Pause.
func (b *Backend) Resume(ctx context.Context, spec sandbox.Spec) error {
	_, err := b.inNetns(ctx, b.dl().control, spec.Netns, "resume", spec.ID)
	return err
}

// Checkpoint implements sandbox.Backend. On success the container is
// stopped and imageDir holds its state. gVisor kills the sandbox when a save
// fails (e.g. "endpoint cannot be saved in connected state" while a TCP
// connection is established), so callers must re-check State. It takes at
// most CheckpointBase plus the sandbox's memory at CheckpointRate; when that
// runs out the error wraps context.DeadlineExceeded and the sandbox is left
// as it is (possibly still saving, or hung) for the caller to settle.
func (b *Backend) Checkpoint(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	d := b.dl()
	limit := d.sized(d.checkpointBase, b.memoryBytes(spec.ID))
	if _, err := b.inNetns(ctx, limit, spec.Netns, "checkpoint", "--image-path="+imageDir, spec.ID); err != nil {
		return err
	}
	// The container is stopped now. Deleting it frees the ID for restore;
	// if that fails the image is still good, and Restore removes the
	// leftover before it starts.
	b.inNetns(ctx, d.delete, spec.Netns, "delete", "-force", spec.ID)
	return nil
}

// memoryBytes is what the sandbox of id holds in memory (its memory
// cgroup's usage: gVisor's application memory is a memfd charged there),
// FallbackMemory when that cannot be read.
func (b *Backend) memoryBytes(id string) int64 {
	st, err := b.readState(id)
	if err != nil || st.Sandbox == nil || st.Sandbox.Pid <= 0 {
		return FallbackMemory
	}
	cg, err := reclaim.CgroupOf(st.Sandbox.Pid)
	if err != nil {
		return FallbackMemory
	}
	if n := cg.Usage(); n > 0 {
		return n
	}
	return FallbackMemory
}

// Restore implements sandbox.Backend. runsc restore gets RestoreBase plus
// the image's size at CheckpointRate; add Removes as for Start.
func (b *Backend) Restore(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	if err := b.cleanup(ctx, spec); err != nil {
		return err
	}
	d := b.dl()
	limit := d.sized(d.restoreBase, dirSize(imageDir))
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
// by its own deadlines instead: at most RemoveTimeout.
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
	if _, err := os.Stat(spec.Netns); err != nil {
		cause = errors.New("its network namespace is gone")
	} else if p, ok := b.stoppedProc(spec.ID); ok {
		cause = fmt.Errorf("its %s process (pid %d) is stopped", p.role, p.pid)
	} else {
		_, err := b.inNetns(ctx, b.dl().delete, spec.Netns, "delete", "-force", spec.ID)
		if err == nil || !b.has(spec.ID) {
			return nil
		}
		cause = err
	}
	return b.forceRemove(ctx, spec, cause)
}

// State implements sandbox.Backend. It takes at most ControlTimeout: a
// sandbox that does not answer in time (stopped, wedged) yields an error
// that wraps context.DeadlineExceeded — its state is unknown, which is not
// the same as stopped.
func (b *Backend) State(ctx context.Context, spec sandbox.Spec) (sandbox.State, error) {
	if !b.has(spec.ID) {
		return sandbox.StateAbsent, nil
	}
	if _, err := os.Stat(spec.Netns); err != nil {
		// runsc state is there but the namespace is gone: the sandbox
		// cannot be running (its control socket lived there).
		return sandbox.StateStopped, nil
	}
	out, err := b.inNetns(ctx, b.dl().control, spec.Netns, "state", spec.ID)
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
	out, err := b.inNetns(ctx, b.dl().control, spec.Netns, "state", spec.ID)
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
	return d.sized(d.checkpointBase, FallbackMemory)
}
