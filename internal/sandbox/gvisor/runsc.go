package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandstorm/internal/sandbox"
)

// The runsc that sandstormd runs is the one the repository pins
// (tools/runsc/go.mod: gVisor is a Go module), built by `make runsc` into
// bin/ next to sandstormd. Debian's runsc (2022-12, ptrace only) is not
// used: it cannot checkpoint a listening socket watched by epoll (every Go,
// Node.js or nginx server), and it starts, pauses, checkpoints and restores
// at about half the speed (issue 8's measurements).

// PinnedVersion is what `runsc --version` prints for the runsc the
// repository pins, as `make runsc` builds it (TestPinnedVersion keeps it
// equal to tools/runsc/go.mod). A checkpoint image restores only on the
// runsc version that wrote it.
const PinnedVersion = "gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237"

// Platforms are the runsc platforms this machine can run: systrap (the
// default, seccomp-trap based) and ptrace. KVM needs a usable /dev/kvm.
var Platforms = []string{"systrap", "ptrace"}

// DefaultPlatform is systrap: measured here against ptrace on the same
// runsc (bench/results, see README "Platform"), it starts and wakes faster;
// ptrace stays a flag for kernels where systrap's seccomp traps are not
// available.
const DefaultPlatform = "systrap"

// maxRootLen bounds --root: runsc's control socket is
// <root>/runsc-<id>.sock, and a Unix socket path has 108 bytes (sun_path,
// the NUL included). When it does not fit, runsc falls back to
// /var/run/runsc-<id>.sock, shared by every runsc on the machine, so a
// root too long for an ID of maxIDLen is refused instead. The node's IDs
// are 12 hex digits.
const (
	maxIDLen   = 32
	maxRootLen = 107 - len("/runsc-") - maxIDLen - len(".sock")
)

// DefaultRunsc is the runsc next to this executable (bin/runsc, from
// `make runsc`), or an error that says how to get one.
func DefaultRunsc() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "runsc")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no runsc next to %s: build the pinned one with `make runsc` (into bin/), or pass --runsc PATH", exe)
	}
	return p, nil
}

// Version runs `runsc --version` and returns its first line without the
// "runsc version " prefix, e.g. "gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237".
func Version(ctx context.Context, runsc string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, "--version")
	cmd.WaitDelay = sandbox.WaitDelay
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", runsc, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	v := strings.TrimSpace(strings.TrimPrefix(line, "runsc version "))
	if v == "" {
		return "", fmt.Errorf("%s --version printed nothing", runsc)
	}
	return v, nil
}

// Flags are the top-level flags the backend gives every runsc command
// (flags: --root, --platform, --network, …). Exported for bench/tiers,
// which times raw runsc next to sandstormd and must run it with exactly
// the flags sandstormd uses.
func (b *Backend) Flags() []string { return b.flags() }

// checkRoot refuses a --root too long for runsc's control sockets.
func checkRoot(root string) error {
	if len(root) > maxRootLen {
		return fmt.Errorf("runsc root %s is %d bytes long; at most %d fit in its control socket's path (108 bytes): use a shorter --data-dir", root, len(root), maxRootLen)
	}
	return nil
}

// Compressions are the values Backend.Compression takes.
var Compressions = []string{"none", "flate-best-speed"}

// checkPlatform refuses a platform this backend does not run.
func checkPlatform(p string) error {
	for _, q := range Platforms {
		if p == q {
			return nil
		}
	}
	return fmt.Errorf("unknown runsc platform %q: use %s", p, strings.Join(Platforms, " or "))
}

// versionTimeout bounds `runsc --version` (a few ms).
const versionTimeout = 5 * time.Second

// Observer hears one runsc command: its verb (runsc's subcommand: run,
// restore, checkpoint, pause, resume, state, delete, kill, exec), how long
// it ran, and how it ended (nil: exit 0).
type Observer func(verb string, took time.Duration, err error)

// ExecTimeout bounds a command run inside a sandbox by Exec.
const ExecTimeout = 30 * time.Second

// Signal implements sandbox.Signaller: runsc kill sends sig to the
// container's init process.
func (b *Backend) Signal(ctx context.Context, spec sandbox.Spec, sig syscall.Signal) error {
	b = b.on(spec)
	var out bytes.Buffer
	c := command{
		what:  "runsc kill " + spec.ID,
		limit: b.dl().control, name: b.Runsc, args: append(b.flags(), "kill", spec.ID, strconv.Itoa(int(sig))),
		stdout: &out, stderr: &out, wait: b.dl().waitDelay,
		verb: "kill", observe: b.Observe,
	}
	if err := c.run(ctx); err != nil {
		if cutShort(err) {
			return err
		}
		return fmt.Errorf("runsc kill %s %d: %w: %s", spec.ID, sig, err, lastLine(out.String()))
	}
	return nil
}

// Exec implements sandbox.Execer: runsc exec runs args inside the
// container as root (envd, a reseed command: the node's own, whatever
// user the template's process is — envd itself runs each command as its
// caller's user), bounded by ExecTimeout; a command that exits non-zero
// is an error carrying its last line of output.
func (b *Backend) Exec(ctx context.Context, spec sandbox.Spec, args []string) ([]byte, error) {
	b = b.on(spec)
	var out bytes.Buffer
	c := command{
		what:  "runsc exec " + spec.ID,
		limit: ExecTimeout, name: b.Runsc, args: append(append(b.flags(), "exec", "--user", "0:0", spec.ID), args...),
		stdout: &out, stderr: &out, wait: b.dl().waitDelay,
		verb: "exec", observe: b.Observe,
	}
	if err := c.run(ctx); err != nil {
		if cutShort(err) {
			return out.Bytes(), err
		}
		return out.Bytes(), fmt.Errorf("runsc exec %s %s: %w: %s", spec.ID, args[0], err, lastLine(out.String()))
	}
	return out.Bytes(), nil
}

// on is the backend for the container of spec: this one, running the
// runsc build spec.Runtime names when it names one. A sandbox started or
// restored by one build is driven by that build's CLI for its whole life
// (pause, resume, checkpoint, exec, kill, state, delete): its sentry is
// that build, and the control messages of runsc are that build's Go types
// (runsc/boot/controller.go), so another build is not sure to speak to it.
// Its checkpoint is then that build's image, which only it restores
// (internal/runtimes). Every build shares --root: their state files and
// control sockets are per container.
func (b *Backend) on(spec sandbox.Spec) *Backend {
	if spec.Runtime == "" || spec.Runtime == b.Runsc {
		return b
	}
	c := *b
	c.Runsc = spec.Runtime
	return &c
}

// Binary is the runsc build this backend runs for containers whose spec
// names none (sandbox.Spec.Runtime).
func (b *Backend) Binary() string { return b.Runsc }

// UseBinary makes the runsc at path (a kept copy of Binary: the same
// bytes, so the same version) the one this backend runs.
func (b *Backend) UseBinary(path string) { b.Runsc = path }

// VersionOf implements sandbox.BinaryRuntime: Version.
func (b *Backend) VersionOf(ctx context.Context, path string) (string, error) {
	return Version(ctx, path)
}
