package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/internal/sandbox"
)

// What Remove does when runsc does not: find the processes of a container,
// SIGKILL them (a stopped process dies of SIGKILL too), see them gone, and
// remove what runsc keeps for the ID.

// runscState is the part of runsc's state file
// ("<root>/<id>_sandbox:<id>.state") this backend reads.
type runscState struct {
	BundleDir string `json:"bundleDir"`
	GoferPid  int    `json:"goferPid"`
	Sandbox   *struct {
		Pid    int `json:"pid"`
		Cgroup *struct {
			V1 *struct {
				Name string `json:"name"`
			} `json:"cgroupv1"`
			V2 *struct {
				Mountpoint string `json:"mountpoint"`
				Path       string `json:"path"`
			} `json:"cgroupv2"`
		} `json:"cgroup"`
	} `json:"sandbox"`
}

func (b *Backend) readState(id string) (*runscState, error) {
	data, err := os.ReadFile(b.stateFile(id))
	if err != nil {
		return nil, err
	}
	var st runscState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("runsc state file of %s: %w", id, err)
	}
	return &st, nil
}

// proc is one process, identified by its pid and its start time (so a pid
// the kernel has reused is never taken for it).
type proc struct {
	pid   int
	start uint64 // field 22 of /proc/<pid>/stat: clock ticks after boot
	state byte   // field 3: R, S, D, T, Z…
	args  []string
	role  string // "sandbox", "gofer", "runsc delete"…
}

// readProc reads pid's command line, state and start time; ok is false when
// there is no such process, it has no command line (a zombie, a kernel
// thread) or want (if not nil) does not want it.
func readProc(pid int, want func(args []string) bool) (p proc, ok bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	cmdline, err := os.ReadFile(dir + "/cmdline")
	if err != nil || len(cmdline) == 0 {
		return p, false
	}
	args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	if want != nil && !want(args) {
		return p, false
	}
	state, start, ok := sandbox.ReadStat(dir + "/stat")
	if !ok {
		return p, false
	}
	return proc{pid: pid, start: start, state: state, args: args}, true
}

// scanProcs lists the processes (other than this one) whose command line
// want wants.
func scanProcs(want func(args []string) bool) []proc {
	ents, _ := os.ReadDir("/proc")
	var out []proc
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if p, ok := readProc(pid, want); ok {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether p still runs: the pid exists, is the same process
// (same start time) and has a thread that is not a zombie. A zombie holds
// no memory, files or sockets any more: it is dead, only not yet reaped.
func (p proc) alive() bool {
	dir := "/proc/" + strconv.Itoa(p.pid)
	state, start, ok := sandbox.ReadStat(dir + "/stat")
	if !ok || start != p.start {
		return false
	}
	if state != 'Z' && state != 'X' {
		return true
	}
	// A zombie leader can have live threads.
	tasks, _ := filepath.Glob(dir + "/task/*/stat")
	for _, t := range tasks {
		if s, _, ok := sandbox.ReadStat(t); ok && s != 'Z' && s != 'X' {
			return true
		}
	}
	return false
}

// kill SIGKILLs p if it is still that process.
func (p proc) kill() {
	if _, start, ok := sandbox.ReadStat("/proc/" + strconv.Itoa(p.pid) + "/stat"); ok && start == p.start {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// age is how long p has been running: its start time is in clock ticks
// (USER_HZ, 100 on every Linux this runs on) of CLOCK_BOOTTIME.
func (p proc) age() time.Duration {
	var now unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &now) != nil {
		return 0
	}
	return time.Duration(now.Nano()) - time.Duration(p.start)*(time.Second/100)
}

// hasFlag reports whether args carry flag name (one or two dashes) with
// value, as "--name=value" or "--name value".
func hasFlag(args []string, name, value string) bool {
	for i, a := range args {
		f, ok := strings.CutPrefix(a, "-")
		if !ok {
			continue
		}
		f = strings.TrimPrefix(f, "-")
		if f == name+"="+value || (f == name && i+1 < len(args) && args[i+1] == value) {
			return true
		}
	}
	return false
}

// subcommand is the first argument of a runsc command line that is not a
// flag or the value of --root (the only flag this backend passes apart).
func subcommand(args []string) string {
	for i := 1; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			if a == "--root" || a == "-root" {
				i++
			}
			continue
		}
		return a
	}
	return ""
}

// roleOf says what p is to container id of this backend, "" if nothing:
// its sandbox (runsc-sandbox … boot … <id>), its gofer (runsc-gofer …
// --bundle <bundle>), or a runsc command for it (runsc … <id>).
func (b *Backend) roleOf(args []string, id, bundle string) string {
	if len(args) < 2 || !hasFlag(args, "root", b.Root) {
		return ""
	}
	switch filepath.Base(args[0]) {
	case "runsc-sandbox":
		if args[len(args)-1] == id {
			return "sandbox"
		}
	case "runsc-gofer":
		if bundle != "" && hasFlag(args, "bundle", filepath.Clean(bundle)) {
			return "gofer"
		}
	case "runsc", filepath.Base(b.Runsc):
		for _, a := range args[1:] {
			if a == id {
				return "runsc " + subcommand(args)
			}
		}
	}
	return ""
}

// stateProcs returns the sandbox and gofer processes named in the state
// file of id, those whose command line still says they are that
// container's.
func (b *Backend) stateProcs(id string, st *runscState) []proc {
	if st == nil {
		return nil
	}
	pids := []int{st.GoferPid}
	if st.Sandbox != nil {
		pids = append(pids, st.Sandbox.Pid)
	}
	var out []proc
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		p, ok := readProc(pid, nil)
		if !ok {
			continue
		}
		if p.role = b.roleOf(p.args, id, st.BundleDir); p.role == "sandbox" || p.role == "gofer" {
			out = append(out, p)
		}
	}
	return out
}

// stoppedProc returns the sandbox or gofer process of id if one is stopped
// (SIGSTOP, state T): runsc's calls to it would never return.
func (b *Backend) stoppedProc(id string) (proc, bool) {
	st, _ := b.readState(id)
	for _, p := range b.stateProcs(id, st) {
		if p.state == 'T' {
			return p, true
		}
	}
	return proc{}, false
}

// containerProcs returns every live process of container id: the sandbox
// and gofer in its state file, and — found in /proc — any sandbox, gofer or
// runsc command for it (a runsc run cut short before it wrote the state, a
// runsc command hung on the sandbox, one of an earlier sandstormd).
func (b *Backend) containerProcs(id, bundle string, st *runscState) []proc {
	out := b.stateProcs(id, st)
	seen := map[int]bool{}
	for _, p := range out {
		seen[p.pid] = true
	}
	for _, p := range scanProcs(func(args []string) bool { return b.roleOf(args, id, bundle) != "" }) {
		if !seen[p.pid] {
			p.role = b.roleOf(p.args, id, bundle)
			out = append(out, p)
		}
	}
	return out
}

// forceRemove kills every process of spec's container, waits until they are
// gone, and removes runsc's state for it: runsc delete -force once more
// (bounded), and if runsc still keeps state, its state and lock files by
// hand. cause is why runsc's own delete was not enough. ctx should not be
// cancellable: this is the end of the road for a hung sandbox and must not
// stop halfway.
func (b *Backend) forceRemove(ctx context.Context, spec sandbox.Spec, cause error) error {
	d := b.dl()
	id := spec.ID
	st, _ := b.readState(id)
	bundle := spec.Bundle
	if st != nil && st.BundleDir != "" {
		bundle = st.BundleDir
	}
	// Once the state is gone nothing uses what runsc leaves behind when a
	// run is cut short: its lock file, and the cgroups it had made (seen
	// when the run was killed before it wrote its state).
	defer func() {
		if !b.has(id) {
			os.Remove(b.lockFile(id))
			os.Remove(b.socketFile(id))
			removeCgroups(cgroupsOf(id, bundle, st))
		}
	}()
	procs := b.containerProcs(id, bundle, st)
	for _, p := range procs {
		p.kill()
	}
	if len(procs) > 0 {
		b.log().Warn("runsc: killed the processes of a container runsc could not remove", "id", id,
			"cause", cause, "processes", describeProcs(procs))
	}
	if alive := waitGone(procs, d.kill); len(alive) > 0 {
		return fmt.Errorf("remove %s (%v): SIGKILLed its processes, but after %s these are still alive: %s",
			id, cause, d.kill, describeProcs(alive))
	}
	if !b.has(id) {
		return nil
	}
	_, err := b.runsc(ctx, d.delete, "delete", "-force", id)
	if err == nil || !b.has(id) {
		return nil
	}
	// Every process of it is gone (seen above), yet runsc cannot delete
	// it: its state is all that is left of it. Drop that, so the node can
	// reuse or forget the ID.
	b.log().Warn("runsc: removing the state of a dead container by hand", "id", id, "cause", cause, "delete", err)
	return b.dropState(id, st)
}

// waitGone polls until none of procs is alive or limit has passed, and
// returns those still alive.
func waitGone(procs []proc, limit time.Duration) []proc {
	deadline := time.Now().Add(limit)
	for {
		var alive []proc
		for _, p := range procs {
			if p.alive() {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func describeProcs(procs []proc) string {
	var parts []string
	for _, p := range procs {
		s := fmt.Sprintf("%s pid %d", p.role, p.pid)
		if state, _, ok := sandbox.ReadStat("/proc/" + strconv.Itoa(p.pid) + "/stat"); ok {
			s += " state " + string(state)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// dropState removes runsc's state, lock and control socket files for id.
// Call it only once every process of id is gone.
func (b *Backend) dropState(id string, st *runscState) error {
	if err := os.Remove(b.stateFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	os.Remove(b.lockFile(id))
	os.Remove(b.socketFile(id))
	return nil
}

// cgroupsOf returns the cgroup paths (relative to a hierarchy's root) of
// container id: those its runsc state names, else the bundle's
// linux.cgroupsPath, else runsc's default "/<id>".
func cgroupsOf(id, bundle string, st *runscState) []string {
	var out []string
	if st != nil && st.Sandbox != nil && st.Sandbox.Cgroup != nil {
		if v1 := st.Sandbox.Cgroup.V1; v1 != nil {
			out = append(out, v1.Name)
		}
		if v2 := st.Sandbox.Cgroup.V2; v2 != nil {
			out = append(out, v2.Path)
		}
	}
	if len(out) == 0 && bundle != "" {
		var spec struct {
			Linux *struct {
				CgroupsPath string `json:"cgroupsPath"`
			} `json:"linux"`
		}
		if data, err := os.ReadFile(filepath.Join(bundle, "config.json")); err == nil && json.Unmarshal(data, &spec) == nil &&
			spec.Linux != nil && spec.Linux.CgroupsPath != "" {
			out = append(out, spec.Linux.CgroupsPath)
		}
	}
	if len(out) == 0 {
		out = append(out, "/"+id)
	}
	return out
}

// removeCgroups removes the cgroups at paths in every hierarchy (v1 and
// v2). rmdir removes only an empty cgroup, so nothing that still runs is
// touched. The sandbox's ptrace stubs die after it (of its death signal),
// so a cgroup can stay busy for a moment after the sandbox and gofer are
// gone: EBUSY is retried for up to sandbox.CgroupBusyWait.
func removeCgroups(paths []string) {
	var dirs []string
	for _, p := range paths {
		if name := cleanCgroup(p); name != "" {
			d, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
			dirs = append(append(dirs, d...), filepath.Join("/sys/fs/cgroup", name))
		}
	}
	deadline := time.Now().Add(sandbox.CgroupBusyWait)
	for len(dirs) > 0 {
		var busy []string
		for _, d := range dirs {
			if err := syscall.Rmdir(d); errors.Is(err, syscall.EBUSY) {
				busy = append(busy, d)
			}
		}
		if dirs = busy; len(dirs) == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cleanCgroup returns a cgroup path from a state file, relative and without
// "..", or "" for the root or anything odd.
func cleanCgroup(p string) string {
	p = strings.TrimPrefix(filepath.Clean("/"+p), "/")
	if p == "" || p == "." || strings.Contains(p, "..") {
		return ""
	}
	return p
}
