// Package process is the "plain process" sandbox backend: it runs an OCI
// bundle's process directly on the host kernel, isolated only by Linux
// namespaces (mount, PID, UTS, IPC, plus the caller's network namespace),
// a chroot into the bundle's rootfs and a cgroup v2 leaf used for
// pause/resume (cgroup.freeze) and for killing every process at once
// (cgroup.kill). There is no gVisor in the way, so it starts fast and runs
// at native speed, but it is NOT a security boundary against the code it
// runs: a process running as root in the container keeps every capability
// and can escape a chroot. Use the gvisor backend for untrusted code.
//
// The launch chain is, all as one PID that ends up being PID 1 of the new
// PID namespace:
//
//	clone(NEWNS|NEWPID|NEWUTS|NEWIPC, into the cgroup) → nsenter --net=NETNS
//	→ sh (init script: mounts /proc and a minimal /dev inside the rootfs,
//	  sets the hostname) → env -i SPEC_ENV → unshare --root=ROOTFS --wd=CWD
//	→ process.args
//
// Host helpers are used because the daemon's main package is not ours to
// re-exec, and Go cannot run code between fork and exec.
//
// Not implemented: checkpoint/restore (see Capabilities), OCI mounts,
// capabilities, rlimits, seccomp, root.readonly and additionalGids; only
// root.path, process.args/env/cwd, process.user.uid/gid and hostname are
// honoured.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sandbox"
)

const (
	// cgroupParent is the directory under the cgroup v2 mount that holds
	// one leaf per container.
	cgroupParent = "sandstorm-process"
	// hostPath is the PATH the host helpers run with; the container's own
	// environment only applies from the final exec on, so a spec's PATH
	// or LD_* variables cannot change which host binaries set it up.
	hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

	startTimeout  = 30 * time.Second // until the spec's program is exec'd
	freezeTimeout = 5 * time.Second  // until cgroup.events says frozen 0/1
	killTimeout   = 5 * time.Second  // until the cgroup is empty after cgroup.kill
	criuTimeout   = 10 * time.Second // for `criu check` at New
)

// initScript runs as PID 1 of the new PID namespace, in the new mount
// namespace (already made recursively private by Go, so nothing mounted here
// propagates to the host) but still with the host's root, so it can use
// host tools. $1 is the rootfs, $2 the /dev template, $3 the hostname; the
// rest is the command line for `env -i`.
//
//   - /proc is mounted by a child of PID 1, i.e. from inside the new PID
//     namespace, so it shows the container's processes only.
//   - /dev is a tmpfs filled with a copy of the template New prepared (a
//     few harmless character devices, the fd symlinks and shm): the host's
//     /dev is never visible. One cp instead of a mknod per node because
//     every helper exec costs several milliseconds.
//   - the hostname write goes through PID 1's own UTS namespace.
const initScript = `set -e
mount -t proc -o nosuid,nodev,noexec proc "$1/proc"
mount -t tmpfs -o nosuid,noexec,mode=755,size=64m sandstorm-dev "$1/dev"
cp -a "$2/." "$1/dev/"
printf %s "$3" > /proc/sys/kernel/hostname
shift 3
exec env -i -- "$@"
`

// idPattern is the ID syntax sandbox.Spec documents; IDs become file and
// cgroup names, so anything else (e.g. "../x") is refused.
var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Backend is the plain-process sandbox.Backend. Methods are safe for
// concurrent use on different IDs; all per-container state lives in the
// state directory and the cgroup tree, never in memory, so any number of
// Backends over the same stateDir (e.g. before and after a daemon restart)
// see the same containers.
type Backend struct {
	stateDir    string
	cgroupRoot  string // <cgroup2 mount>/sandstorm-process
	devTemplate string // <stateDir>/dev: what each container's /dev starts as
	nsenter     string // absolute paths of the host helpers
	unshare     string
	sh          string
	caps        sandbox.Capabilities
}

var _ sandbox.Backend = (*Backend)(nil)

// New returns a Backend that keeps its state files in stateDir (created
// with mode 0700 if missing). It fails if the machine cannot run it: no
// cgroup v2 hierarchy, a kernel without cgroup.freeze/cgroup.kill (Linux
// 5.14+), or missing util-linux/coreutils helpers. It also runs
// `criu check` (bounded to 10 s) to explain in Capabilities why there is no
// checkpoint.
func New(stateDir string) (*Backend, error) {
	if stateDir == "" {
		return nil, errors.New("process backend: empty state directory")
	}
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("process backend: %w", err)
	}
	mnt, err := Cgroup2Mount()
	if err != nil {
		return nil, fmt.Errorf("process backend: %w", err)
	}
	b := &Backend{stateDir: stateDir, cgroupRoot: filepath.Join(mnt, cgroupParent)}
	if err := os.Mkdir(b.cgroupRoot, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("process backend: create cgroup %s: %w", b.cgroupRoot, err)
	}
	// The root cgroup has neither file, so check on our own (non-root)
	// directory: that is where the kernel's support shows.
	for _, f := range []string{"cgroup.freeze", "cgroup.kill", "cgroup.events"} {
		if _, err := os.Stat(filepath.Join(b.cgroupRoot, f)); err != nil {
			return nil, fmt.Errorf("process backend: cgroup v2 at %s lacks %s (needs Linux 5.14+): %w", mnt, f, err)
		}
	}
	for _, tool := range []struct {
		name string
		dst  *string
	}{{"nsenter", &b.nsenter}, {"unshare", &b.unshare}, {"sh", &b.sh}, {"mount", nil}, {"cp", nil}, {"env", nil}} {
		p, err := lookHostPath(tool.name)
		if err != nil {
			return nil, fmt.Errorf("process backend: %s not found (apt-get install -y util-linux coreutils): %w", tool.name, err)
		}
		if tool.dst != nil {
			*tool.dst = p
		}
	}
	if b.devTemplate, err = makeDevTemplate(stateDir); err != nil {
		return nil, fmt.Errorf("process backend: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), criuTimeout)
	defer cancel()
	b.caps = sandbox.Capabilities{Pause: true, Checkpoint: false, Why: criuWhy(ctx)}
	return b, nil
}

// lookHostPath finds a helper in hostPath (not the daemon's PATH, which is
// not what the helpers run with) and resolves symlinks, so the result can be
// compared with /proc/<pid>/exe.
func lookHostPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(hostPath) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return filepath.EvalSymlinks(p)
		}
	}
	return "", exec.ErrNotFound
}

// criuWhy explains why Checkpoint is false. CRIU is the only way to
// checkpoint a plain Linux process tree; on the VMs Sandstorm targets
// `criu check` fails (it cannot parse the kernel's vDSO), and even where
// it passes this backend has no CRIU integration.
func criuWhy(ctx context.Context) string {
	const base = "the process backend has no snapshot tier: checkpointing a plain process needs CRIU"
	installed, err := CheckCRIU(ctx)
	switch {
	case !installed:
		return base + ", which is not installed (and `criu check` is known to fail on this kind of VM because of the vDSO); only pause/resume is available"
	case err != nil:
		return fmt.Sprintf("%s, and `criu check` fails on this kernel (%v); only pause/resume is available", base, err)
	}
	return base + "; `criu check` passes here, but CRIU checkpoint/restore is not implemented in this backend; only pause/resume is available"
}

// Name returns "process".
func (b *Backend) Name() string { return "process" }

// Capabilities reports Pause true (cgroup v2 freezer) and Checkpoint false,
// with Why explaining the CRIU situation found by New.
func (b *Backend) Capabilities() sandbox.Capabilities { return b.caps }

func (b *Backend) cgroupDir(id string) string { return filepath.Join(b.cgroupRoot, id) }

func checkID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("process backend: invalid container ID %q (want [a-z0-9-], at most 63 chars)", id)
	}
	return nil
}

// launch is what Start takes from the bundle's config.json.
type launch struct {
	rootfs   string // absolute, symlinks resolved
	cwd      string
	hostname string
	args     []string
	env      []string
	uid, gid uint32
}

func loadBundle(spec sandbox.Spec) (*launch, error) {
	path := filepath.Join(spec.Bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if s.Root == nil || s.Root.Path == "" {
		return nil, fmt.Errorf("%s: root.path is empty", path)
	}
	if s.Process == nil || len(s.Process.Args) == 0 {
		return nil, fmt.Errorf("%s: process.args is empty", path)
	}
	root := s.Root.Path
	if !filepath.IsAbs(root) {
		root = filepath.Join(spec.Bundle, root)
	}
	root, err = filepath.Abs(root)
	if err == nil {
		// /proc/<pid>/root shows the resolved path; Start compares it.
		root, err = filepath.EvalSymlinks(root)
	}
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("rootfs %s is not a directory", root)
	}
	l := &launch{
		rootfs:   root,
		cwd:      s.Process.Cwd,
		hostname: s.Hostname,
		args:     s.Process.Args,
		uid:      s.Process.User.UID,
		gid:      s.Process.User.GID,
	}
	if l.cwd == "" {
		l.cwd = "/"
	}
	if l.hostname == "" {
		l.hostname = spec.ID
	}
	for _, kv := range s.Process.Env {
		// `env` would take an entry without '=' for the command to run.
		if i := strings.IndexByte(kv, '='); i <= 0 {
			return nil, fmt.Errorf("%s: malformed process.env entry %q", path, kv)
		}
		l.env = append(l.env, kv)
	}
	return l, nil
}

// Start launches spec's bundle (see the package comment for how) and returns
// once the bundle's own program has been exec'd inside the chroot, so a
// wrong path in process.args or a failing setup step is reported here, with
// the tail of the log. Start refuses an ID that is running or paused; the
// leftovers of a stopped one are removed first. On error nothing is left
// behind (no process, cgroup or state file). spec.Netns is required.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec) (err error) {
	if err := checkID(spec.ID); err != nil {
		return err
	}
	if spec.Netns == "" || spec.LogPath == "" || spec.Bundle == "" {
		return fmt.Errorf("process backend: start %s: Bundle, Netns and LogPath are required", spec.ID)
	}
	st, err := b.State(ctx, spec)
	if err != nil {
		return err
	}
	switch st {
	case sandbox.StateRunning, sandbox.StatePaused:
		return fmt.Errorf("process backend: start %s: %w (it is %s)", spec.ID, os.ErrExist, st)
	}
	// Stopped leftovers, or a cgroup without a record from a crash
	// inside an earlier Start.
	if err := b.Remove(ctx, spec); err != nil {
		return err
	}
	l, err := loadBundle(spec)
	if err != nil {
		return fmt.Errorf("process backend: start %s: %w", spec.ID, err)
	}

	cg := b.cgroupDir(spec.ID)
	if err := os.Mkdir(cg, 0o755); err != nil {
		return fmt.Errorf("process backend: start %s: create cgroup: %w", spec.ID, err)
	}
	rec := &record{ID: spec.ID, Cgroup: cg, Rootfs: l.rootfs, Netns: spec.Netns}
	// From here on, undo everything on failure.
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout+time.Second)
			defer cancel()
			killCgroup(cctx, cg, killTimeout)
			b.removeRecord(spec.ID)
		}
	}()
	if err := b.writeRecord(rec); err != nil {
		return fmt.Errorf("process backend: start %s: %w", spec.ID, err)
	}

	cgfd, err := os.Open(cg)
	if err != nil {
		return fmt.Errorf("process backend: start %s: %w", spec.ID, err)
	}
	defer cgfd.Close()
	logf, err := os.OpenFile(spec.LogPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("process backend: start %s: open log: %w", spec.ID, err)
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)

	// The mount points must exist; doing it here saves a helper exec.
	for _, d := range []string{"proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(l.rootfs, d), 0o755); err != nil {
			return fmt.Errorf("process backend: start %s: %w", spec.ID, err)
		}
	}
	cmd := b.initCmd(spec, l, logf, cgfd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("process backend: start %s: %w", spec.ID, err)
	}
	exited := make(chan error, 1)
	// Reap it while this daemon lives; after a restart it is reparented
	// to init, which reaps it.
	go func() { exited <- cmd.Wait() }()

	ps, err := readProcStat(cmd.Process.Pid)
	if err != nil {
		// It exited already; the wait below reports how.
		ps = procStat{}
	}
	rec.Pid, rec.StartTime, rec.Started = cmd.Process.Pid, ps.StartTime, time.Now().UTC()
	if err := b.writeRecord(rec); err != nil {
		return fmt.Errorf("process backend: start %s: %w", spec.ID, err)
	}
	if err := b.waitExec(ctx, cmd.Process.Pid, l.rootfs, exited); err != nil {
		return fmt.Errorf("process backend: start %s: %w%s", spec.ID, err, logTail(spec.LogPath, logStart))
	}
	return nil
}

// initCmd is the command that becomes the sandbox: the init script in
// spec's network namespace, which mounts /proc and /dev, then unshare
// chroots into the rootfs and execs the bundle's program as its user.
func (b *Backend) initCmd(spec sandbox.Spec, l *launch, logf, cgfd *os.File) *exec.Cmd {
	args := []string{b.nsenter, "--net=" + spec.Netns, "--", b.sh, "-c", initScript, "sandstorm-init", l.rootfs, b.devTemplate, l.hostname}
	args = append(args, l.env...)
	args = append(args, b.unshare, "--root="+l.rootfs, "--wd="+l.cwd)
	if l.uid != 0 || l.gid != 0 {
		args = append(args, "--setgid="+strconv.FormatUint(uint64(l.gid), 10), "--setuid="+strconv.FormatUint(uint64(l.uid), 10))
	}
	args = append(args, "--")
	args = append(args, l.args...)
	return &exec.Cmd{
		Path: b.nsenter,
		Args: args,
		Env:  []string{"PATH=" + hostPath},
		Dir:  "/",
		// Stdout/Stderr are *os.File, so the child gets the descriptor
		// itself and no goroutine of ours sits in the middle: the
		// container keeps logging after the daemon dies.
		Stdout: logf,
		Stderr: logf,
		SysProcAttr: &syscall.SysProcAttr{
			// Own session: no controlling terminal, and no signal
			// aimed at the daemon's process group reaches it. No
			// Pdeathsig, so it outlives the daemon.
			Setsid: true,
			// A new PID namespace must come from clone (unshare
			// would only move later children). The mount
			// namespace goes through Unshareflags because then Go
			// also marks / recursively private before exec, which
			// the init script relies on.
			Cloneflags:   syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
			Unshareflags: syscall.CLONE_NEWNS,
			// clone3(CLONE_INTO_CGROUP): the process is born in
			// the leaf, so nothing it forks can be outside it.
			UseCgroupFD: true,
			CgroupFD:    int(cgfd.Fd()),
		},
	}
}

// waitExec waits until pid has exec'd the bundle's program: its root is the
// rootfs (unshare has chrooted) and its executable is no longer unshare.
func (b *Backend) waitExec(ctx context.Context, pid int, rootfs string, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	proc := "/proc/" + strconv.Itoa(pid)
	delay := 200 * time.Microsecond
	for {
		root, _ := os.Readlink(proc + "/root")
		exe, _ := os.Readlink(proc + "/exe")
		if root == rootfs && exe != "" && exe != b.unshare {
			return nil
		}
		select {
		case err := <-exited:
			if err == nil {
				// It ran and exited 0 before we saw it: that
				// is a (short) successful run; State says
				// stopped.
				return nil
			}
			return fmt.Errorf("container exited during start: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the container's program to start: %w", ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Millisecond)
	}
}

// logTail returns what was appended to the log from offset on (at most the
// last 2 KiB), formatted for an error message.
func logTail(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil || end <= from {
		return ""
	}
	from = max(from, end-2048)
	buf := make([]byte, end-from)
	n, _ := f.ReadAt(buf, from)
	s := strings.TrimSpace(string(buf[:n]))
	if s == "" {
		return ""
	}
	return "; log: " + s
}

// live returns the record of a running or paused container, ErrNotFound if
// there is none, and an error saying it is stopped otherwise.
func (b *Backend) live(spec sandbox.Spec, op string) (*record, error) {
	if err := checkID(spec.ID); err != nil {
		return nil, err
	}
	rec, err := b.readRecord(spec.ID)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("process backend: %s %s: %w", op, spec.ID, sandbox.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if !alive(rec.Pid, rec.StartTime) {
		return nil, fmt.Errorf("process backend: %s %s: container is stopped", op, spec.ID)
	}
	return rec, nil
}

// Pause freezes every process of the container (cgroup.freeze) and returns
// once the kernel reports the cgroup frozen (at most 5 s). If the freeze
// does not complete in time it is undone and an error returned, so the
// container is left running. Pausing a paused container is a no-op.
// ErrNotFound if there is no such container.
func (b *Backend) Pause(ctx context.Context, spec sandbox.Spec) error {
	return b.setFrozen(ctx, spec, true)
}

// Resume thaws a paused container and returns once the kernel reports it
// thawed (at most 5 s). Resuming a running container is a no-op.
// ErrNotFound if there is no such container.
func (b *Backend) Resume(ctx context.Context, spec sandbox.Spec) error {
	return b.setFrozen(ctx, spec, false)
}

// setFrozen is Pause (frozen) and Resume: it writes the container's
// cgroup.freeze and waits until the kernel reports the cgroup so.
func (b *Backend) setFrozen(ctx context.Context, spec sandbox.Spec, frozen bool) error {
	op, value := "resume", "0"
	if frozen {
		op, value = "pause", "1"
	}
	rec, err := b.live(spec, op)
	if err != nil {
		return err
	}
	if err := writeCgroupFile(rec.Cgroup, "cgroup.freeze", value); err != nil {
		return fmt.Errorf("process backend: %s %s: %w", op, spec.ID, err)
	}
	if err := waitCgroupEvents(ctx, rec.Cgroup, freezeTimeout, func(ev cgroupEvents) bool { return ev.Frozen == frozen }); err != nil {
		if frozen {
			// A half-frozen container is neither running nor paused.
			writeCgroupFile(rec.Cgroup, "cgroup.freeze", "0")
		}
		return fmt.Errorf("process backend: %s %s: %w", op, spec.ID, err)
	}
	return nil
}

// Checkpoint always fails with an error wrapping errdefs.ErrNotSupported:
// this backend has no CRIU integration (see Capabilities().Why).
func (b *Backend) Checkpoint(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	return fmt.Errorf("process backend: checkpoint %s: %w: %s", spec.ID, errdefs.ErrNotSupported, b.caps.Why)
}

// Restore always fails with an error wrapping errdefs.ErrNotSupported, since
// Checkpoint never produces an image.
func (b *Backend) Restore(ctx context.Context, spec sandbox.Spec, imageDir string) error {
	return fmt.Errorf("process backend: restore %s: %w: %s", spec.ID, errdefs.ErrNotSupported, b.caps.Why)
}

// Remove kills every process of the container with cgroup.kill (frozen ones
// too), waits up to 5 s for the cgroup to empty, removes the cgroup and then
// the state file. Removing an absent container returns nil. If the processes
// do not die in time the state file is kept, so Remove can be retried.
func (b *Backend) Remove(ctx context.Context, spec sandbox.Spec) error {
	if err := checkID(spec.ID); err != nil {
		return err
	}
	// Without a (readable) record there may still be a cgroup, from a
	// crash inside Start or a corrupt file: the path derives from the ID.
	cg := b.cgroupDir(spec.ID)
	if rec, err := b.readRecord(spec.ID); err == nil {
		cg = rec.Cgroup
	}
	if err := killCgroup(ctx, cg, killTimeout); err != nil {
		return fmt.Errorf("process backend: remove %s: %w", spec.ID, err)
	}
	if err := b.removeRecord(spec.ID); err != nil {
		return fmt.Errorf("process backend: remove %s: %w", spec.ID, err)
	}
	return nil
}

// State reports StateAbsent if there is no state file, StateStopped if the
// recorded init process is gone (or the PID now belongs to another
// process), StatePaused if the cgroup is frozen, StateRunning otherwise. It
// only reads files; the error is for an unreadable state file or cgroup.
func (b *Backend) State(ctx context.Context, spec sandbox.Spec) (sandbox.State, error) {
	if err := checkID(spec.ID); err != nil {
		return "", err
	}
	rec, err := b.readRecord(spec.ID)
	if errors.Is(err, os.ErrNotExist) {
		return sandbox.StateAbsent, nil
	}
	if err != nil {
		return "", fmt.Errorf("process backend: state %s: %w", spec.ID, err)
	}
	if !alive(rec.Pid, rec.StartTime) {
		return sandbox.StateStopped, nil
	}
	ev, err := readCgroupEvents(rec.Cgroup)
	if err != nil {
		return "", fmt.Errorf("process backend: state %s: %w", spec.ID, err)
	}
	if ev.Frozen {
		return sandbox.StatePaused, nil
	}
	return sandbox.StateRunning, nil
}

// List returns the IDs that have a state file, sorted; the error is for an
// unreadable state directory.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(b.stateDir)
	if err != nil {
		return nil, fmt.Errorf("process backend: list: %w", err)
	}
	var ids []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && e.Type().IsRegular() && idPattern.MatchString(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}
