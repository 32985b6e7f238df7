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
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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

// inNetns runs runsc with args inside netns and returns its combined output.
func (b *Backend) inNetns(ctx context.Context, netns string, args ...string) ([]byte, error) {
	full := append([]string{"--net=" + netns, "--", b.Runsc}, b.flags()...)
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
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
// namespace with /proc/sys/net/core hidden (see the package comment). The
// container's stdout and stderr go to spec.LogPath.
func (b *Backend) launch(ctx context.Context, spec sandbox.Spec, sub ...string) error {
	logf, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"--net=" + spec.Netns, "--", "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount -t tmpfs none /proc/sys/net/core && exec "$@"`, "sh", b.Runsc}
	args = append(args, b.flags()...)
	args = append(args, sub...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	// Both must be files, not pipes: the detached sandbox inherits them
	// and keeps them open for its whole life, so a pipe would never reach
	// EOF and Run would never return. runsc's own errors land in the log
	// too; the new part of it is read back on failure.
	off, _ := logf.Seek(0, io.SeekEnd)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s %s: %w: %s", sub[0], spec.ID, err, lastLine(readFrom(spec.LogPath, off)))
	}
	return nil
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

// Start implements sandbox.Backend.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec) error {
	b.cleanup(ctx, spec)
	return b.launch(ctx, spec, "run", "-detach", "-bundle", spec.Bundle, spec.ID)
}

// cleanup deletes a stopped leftover with the same ID so that run/restore
// can reuse it (runsc keeps a stopped container's state until delete).
func (b *Backend) cleanup(ctx context.Context, spec sandbox.Spec) {
	if b.has(spec.ID) {
		b.inNetns(ctx, spec.Netns, "delete", "-force", spec.ID)
	}
}

// stateFile is where runsc keeps the state of container id (sandbox and
// container share the ID here): "<root>/<id>_sandbox:<id>.state".
func (b *Backend) stateFile(id string) string {
	return filepath.Join(b.Root, id+"_sandbox:"+id+".state")
}

// has reports whether runsc keeps state for id under Root: one stat, so it
// stays cheap with thousands of containers.
func (b *Backend) has(id string) bool {
	_, err := os.Stat(b.stateFile(id))
	return err == nil
}

// Pause implements sandbox.Backend.
func (b *Backend) Pause(ctx context.Context, spec sandbox.Spec) error {
	_, err := b.inNetns(ctx, spec.Netns, "pause", spec.ID)
	return err
}

// Resume implements sandbox.Backend.
func (b *Backend) Resume(ctx context.Context, spec sandbox.Spec) error {
	_, err := b.inNetns(ctx, spec.Netns, "resume", spec.ID)
	return err
}

// Checkpoint implements sandbox.Backend. On success the container is
// stopped and imageDir holds its state. gVisor kills the sandbox when a save
// fails (e.g. "endpoint cannot be saved in connected state" while a TCP
// connection is established), so callers must re-check State.
func (b *Backend) Checkpoint(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	if _, err := b.inNetns(ctx, spec.Netns, "checkpoint", "--image-path="+imageDir, spec.ID); err != nil {
		return err
	}
	// The container is stopped now. Deleting it frees the ID for restore;
	// if that fails the image is still good, and Restore deletes the
	// leftover before it starts.
	b.inNetns(ctx, spec.Netns, "delete", "-force", spec.ID)
	return nil
}

// Restore implements sandbox.Backend.
func (b *Backend) Restore(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	b.cleanup(ctx, spec)
	return b.launch(ctx, spec, "restore", "-detach", "-image-path="+imageDir, "-bundle", spec.Bundle, spec.ID)
}

// Remove implements sandbox.Backend.
func (b *Backend) Remove(ctx context.Context, spec sandbox.Spec) error {
	// runsc leaves its lock file behind when a create is cut short; once
	// the state is gone, nothing else uses it.
	defer func() {
		if !b.has(spec.ID) {
			os.Remove(filepath.Join(b.Root, spec.ID+"_sandbox:"+spec.ID+".lock"))
		}
	}()
	if !b.has(spec.ID) {
		return nil
	}
	if _, err := os.Stat(spec.Netns); err != nil {
		// Without its netns runsc cannot reach the sandbox's control
		// socket, and would delete the state while the processes live on.
		b.killByState(spec.ID)
		cmd := exec.CommandContext(ctx, b.Runsc, append(b.flags(), "delete", "-force", spec.ID)...)
		if out, err := cmd.CombinedOutput(); err != nil && b.has(spec.ID) {
			return fmt.Errorf("runsc delete %s (netns gone): %w: %s", spec.ID, err, lastLine(string(out)))
		}
		return nil
	}
	if _, err := b.inNetns(ctx, spec.Netns, "delete", "-force", spec.ID); err != nil {
		if !b.has(spec.ID) {
			return nil
		}
		return err
	}
	return nil
}

// killByState SIGKILLs the sandbox and gofer processes recorded in runsc's
// state file for id, after checking each pid still belongs to that
// container (its command line names the container's runsc root and ID), so
// a reused pid is never hit.
func (b *Backend) killByState(id string) {
	data, err := os.ReadFile(b.stateFile(id))
	if err != nil {
		return
	}
	var st struct {
		GoferPid int `json:"goferPid"`
		Sandbox  *struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
	}
	if json.Unmarshal(data, &st) != nil {
		return
	}
	pids := []int{st.GoferPid}
	if st.Sandbox != nil {
		pids = append(pids, st.Sandbox.Pid)
	}
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(b.Root)) || !bytes.Contains(cmdline, []byte(id)) {
			continue
		}
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// State implements sandbox.Backend.
func (b *Backend) State(ctx context.Context, spec sandbox.Spec) (sandbox.State, error) {
	if !b.has(spec.ID) {
		return sandbox.StateAbsent, nil
	}
	if _, err := os.Stat(spec.Netns); err != nil {
		// runsc state is there but the namespace is gone: the sandbox
		// cannot be running (its control socket lived there).
		return sandbox.StateStopped, nil
	}
	out, err := b.inNetns(ctx, spec.Netns, "state", spec.ID)
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
	out, err := b.inNetns(ctx, spec.Netns, "state", spec.ID)
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
func (b *Backend) WaitInFlight(ctx context.Context) error {
	for {
		pids := b.inFlight()
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

// inFlight lists the pids of runsc commands using this backend's root.
func (b *Backend) inFlight() []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []int
	self := os.Getpid()
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if filepath.Base(args[0]) != "runsc" {
			continue
		}
		for i, a := range args {
			if (a == "--root" && i+1 < len(args) && args[i+1] == b.Root) || a == "--root="+b.Root {
				pid, _ := strconv.Atoi(strings.Split(p, "/")[2])
				if pid != self {
					out = append(out, pid)
				}
				break
			}
		}
	}
	return out
}
