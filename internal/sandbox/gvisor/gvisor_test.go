package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sandstorm/internal/sandbox"
	"sandstorm/internal/testenv"

	"sandstorm/internal/sandbox/sandboxtest"
)

// These tests need root and runsc on PATH: they run real gVisor sandboxes
// (ptrace platform) in network namespaces of their own (sgv-*, veths vgv-*
// on random /30s of 10.194.0.0/16; nothing leaves the machine), each with a
// runsc root under its own temporary directory, and remove all of it again.

// hangEnv makes the test binary a stand-in for a runsc command that hangs:
// started with argv[0] "runsc" and runsc's arguments, it sleeps.
const hangEnv = "SANDSTORM_GVISOR_TEST_HANG"

func TestMain(m *testing.M) {
	if os.Getenv(hangEnv) != "" {
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	// As in sandstormd: reap runsc's sandboxes at once, or every runsc
	// delete waits up to a second for init to do it.
	if err := StartReaper(); err != nil {
		fmt.Fprintln(os.Stderr, "StartReaper:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests must run as root (they create namespaces and run runsc)")
	}
}

// run runs a setup command of the test's own, bounded too.
func run(t testing.TB, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// newNetns makes a network namespace with lo up and a veth to the host on a
// random /30 of 10.194.0.0/16, as the node does for a sandbox; cleanup
// deletes both and checks they are gone.
func newNetns(t testing.TB) string {
	t.Helper()
	requireRoot(t)
	suffix := fmt.Sprintf("%04d%04x", os.Getpid()%10000, rand.IntN(1<<16))
	name, host := "sgv-"+suffix, "vgv-"+suffix // ≤ 15 chars
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", host).Run()
		exec.Command("ip", "netns", "del", name).Run()
		if _, err := os.Stat("/var/run/netns/" + name); err == nil {
			t.Errorf("netns %s left behind", name)
		}
		if _, err := os.Stat("/sys/class/net/" + host); err == nil {
			t.Errorf("veth %s left behind", host)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	base := rand.IntN(1<<14) * 4
	hostIP := fmt.Sprintf("10.194.%d.%d", base/256, base%256+1)
	sandboxIP := fmt.Sprintf("10.194.%d.%d", base/256, base%256+2)
	run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", name)
	run(t, "ip", "addr", "add", hostIP+"/30", "dev", host)
	run(t, "ip", "link", "set", host, "up")
	run(t, "ip", "-n", name, "addr", "add", sandboxIP+"/30", "dev", "eth0")
	run(t, "ip", "-n", name, "link", "set", "eth0", "up")
	run(t, "ip", "-n", name, "route", "add", "default", "via", hostIP)
	return "/var/run/netns/" + name
}

// newBackend is a backend with its runsc state under a directory of the
// test's own.
func newBackend(t testing.TB) *Backend {
	t.Helper()
	requireRoot(t)
	bin, err := testenv.Runsc()
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(filepath.Join(t.TempDir(), "runsc"), bin, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// newSpec lays out a sandbox as the node does (<dir>/sandboxes/<id>/bundle
// with config.json and rootfs, console.log) whose process is sh -c script
// from a static busybox, in netns, with a memory limit of 256 MiB. Cleanup
// removes the container.
func newSpec(t testing.TB, b *Backend, netns, script string) sandbox.Spec {
	t.Helper()
	return newSpecLimit(t, b, netns, script, 256)
}

func newSpecLimit(t testing.TB, b *Backend, netns, script string, limitMiB int64) sandbox.Spec {
	t.Helper()
	id := fmt.Sprintf("gvt%09x", rand.Uint64()&(1<<36-1))
	dir := filepath.Join(t.TempDir(), "sandboxes", id)
	bundle := filepath.Join(dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	sandboxtest.BusyboxRootfs(t, rootfs, []string{"bin", "proc", "dev", "sys", "tmp"},
		[]string{"sh", "sleep", "echo", "dd", "cat"})
	// What internal/node's writeSpec writes, with this test's netns.
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_CHOWN", "CAP_DAC_OVERRIDE",
		"CAP_FOWNER", "CAP_FSETID", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD"}
	limit := limitMiB << 20
	oom := 1000
	s := specs.Spec{
		Version:  specs.Version,
		Hostname: id,
		Root:     &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args:            []string{"/bin/sh", "-c", script},
			Env:             []string{"PATH=/bin"},
			Cwd:             "/",
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
			OOMScoreAdj:     &oom,
		},
		Mounts: Mounts(),
		Linux: &specs.Linux{
			Namespaces: Namespaces(netns),
			Resources:  &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}},
		},
	}
	data, err := json.MarshalIndent(&s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{ID: id, Bundle: bundle, Netns: netns, LogPath: filepath.Join(dir, "console.log")}
	t.Cleanup(func() {
		if err := b.Remove(context.Background(), spec); err != nil {
			t.Errorf("cleanup: Remove %s: %v", id, err)
		}
	})
	return spec
}

// startReady starts spec and waits until its script has printed "ready".
func startReady(t testing.TB, b *Backend, spec sandbox.Spec) {
	t.Helper()
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	testenv.WaitFor(t, 30*time.Second, "the sandbox prints ready", func() bool {
		data, _ := os.ReadFile(spec.LogPath)
		return strings.Contains(string(data), "ready")
	})
}

// pidsOf returns the sandbox and gofer pids in runsc's state file of id.
func pidsOf(t testing.TB, b *Backend, id string) (sandboxPid, goferPid int) {
	t.Helper()
	st, err := b.readState(id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sandbox == nil || st.Sandbox.Pid <= 0 || st.GoferPid <= 0 {
		t.Fatalf("state of %s has no sandbox or gofer pid: %+v", id, st)
	}
	return st.Sandbox.Pid, st.GoferPid
}

// family returns pid and all its descendants, each with its start time.
func family(pid int) []proc {
	_, start, ok := sandbox.ReadStat(fmt.Sprintf("/proc/%d/stat", pid))
	if !ok {
		return nil
	}
	out := []proc{{pid: pid, start: start}}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, task := range tasks {
		data, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, family(c)...)
			}
		}
	}
	return out
}

// procState is the state letter of pid (0 if there is no such process).
func procState(pid int) byte {
	s, _, _ := sandbox.ReadStat(fmt.Sprintf("/proc/%d/stat", pid))
	return s
}

// assertNothingLeft checks that no process of b's runsc root runs (each
// test has a root of its own, so any process naming it is one of its
// containers'), that the processes in procs are dead, that runsc keeps
// nothing for id, and that its cgroups are gone.
func assertNothingLeft(t testing.TB, b *Backend, id string, procs []proc) {
	t.Helper()
	for _, p := range procs {
		if p.alive() {
			t.Errorf("process %d of %s (state %c) is still alive", p.pid, id, procState(p.pid))
		}
	}
	for _, p := range scanProcs(func(args []string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, b.Root) })
	}) {
		if p.alive() {
			t.Errorf("process %d (%s) of this test's runsc root is still alive", p.pid, strings.Join(p.args, " "))
		}
	}
	var names []string
	ents, _ := os.ReadDir(b.Root)
	for _, e := range ents {
		if e.Name() != "null-netns" { // shared by all containers of the root; see Close
			names = append(names, e.Name())
		}
	}
	if len(names) > 0 {
		t.Errorf("runsc root still holds %v", names)
	}
	if ids, err := b.List(context.Background()); err != nil || slices.Contains(ids, id) {
		t.Errorf("List = %v, %v; want no %s", ids, err, id)
	}
	if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + id); len(cgs) > 0 {
		t.Errorf("cgroups of %s left: %v", id, cgs)
	}
	if _, err := os.Stat("/sys/fs/cgroup/" + id); err == nil {
		t.Errorf("cgroup /sys/fs/cgroup/%s left", id)
	}
}

// shortDeadlines are the defaults with some replaced.
func shortDeadlines(f func(*deadlines)) *deadlines {
	d := defaultDeadlines
	f(&d)
	return &d
}

// TestStoppedSandbox: the sandbox process is stopped (SIGSTOP), so every
// runsc call to it hangs. State, Pause and Checkpoint fail within their
// deadlines instead of hanging; Remove kills it by the pids in its state
// and leaves nothing behind.
func TestStoppedSandbox(t *testing.T) {
	b := newBackend(t)
	netns := newNetns(t)
	spec := newSpec(t, b, netns, "echo ready; exec sleep 1000000")
	startReady(t, b, spec)
	if st, err := b.State(context.Background(), spec); err != nil || st != sandbox.StateRunning {
		t.Fatalf("State = %v, %v; want running", st, err)
	}
	sandboxPid, goferPid := pidsOf(t, b, spec.ID)
	procs := append(family(sandboxPid), family(goferPid)...)
	t.Logf("sandbox pid %d, gofer pid %d, %d processes in all", sandboxPid, goferPid, len(procs))

	if err := syscall.Kill(sandboxPid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the sandbox process is stopped", func() bool { return procState(sandboxPid) == 'T' })

	// (a) State: an error that says it timed out, within its deadline.
	start := time.Now()
	st, err := b.State(context.Background(), spec)
	took := time.Since(start)
	t.Logf("State of a stopped sandbox: %v after %v", err, took)
	var te *TimeoutError
	switch {
	case err == nil:
		t.Errorf("State of a stopped sandbox = %v, want an error", st)
	case !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &te):
		t.Errorf("State error %v does not wrap context.DeadlineExceeded in a *TimeoutError", err)
	case te.Command != "runsc state "+spec.ID || !strings.Contains(err.Error(), "timed out after"):
		t.Errorf("State error %q does not name the command and its deadline", err)
	}
	if took < sandbox.ControlTimeout || took > sandbox.ControlTimeout+sandbox.WaitDelay+2*time.Second {
		t.Errorf("State took %v; its deadline is %v", took, sandbox.ControlTimeout)
	}

	// Pause and Checkpoint, with shorter deadlines to keep the test short:
	// the same code path, the same hung runsc.
	b.deadlines = shortDeadlines(func(d *deadlines) {
		d.control, d.checkpointBase, d.rate = time.Second, 2*time.Second, 1<<40
	})
	for _, c := range []struct {
		what  string
		limit time.Duration
		call  func() error
	}{
		{"runsc pause " + spec.ID, time.Second, func() error { return b.Pause(context.Background(), spec) }},
		{"runsc checkpoint " + spec.ID, 2 * time.Second, func() error { return b.Checkpoint(context.Background(), spec, t.TempDir()) }},
	} {
		start := time.Now()
		err := c.call()
		took := time.Since(start)
		t.Logf("%s: %v after %v", c.what, err, took)
		if !errors.As(err, &te) || te.Command != c.what || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: error %v, want a timeout naming the command", c.what, err)
		}
		if took > c.limit+sandbox.WaitDelay+2*time.Second {
			t.Errorf("%s took %v; its deadline is %v", c.what, took, c.limit)
		}
	}
	b.deadlines = nil

	// (b) Remove, with the real deadlines.
	start = time.Now()
	err = b.Remove(context.Background(), spec)
	took = time.Since(start)
	t.Logf("Remove of a stopped sandbox: %v after %v", err, took)
	if err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if took > sandbox.RemoveTimeout {
		t.Errorf("Remove took %v, more than sandbox.RemoveTimeout %v", took, sandbox.RemoveTimeout)
	}
	// It saw the stopped process and did not wait for a runsc delete
	// that could never return.
	if took > sandbox.DeleteTimeout {
		t.Errorf("Remove took %v: it waited for a runsc delete of a stopped sandbox", took)
	}
	if b.has(spec.ID) {
		t.Error("runsc still has state for the container")
	}
	// (c) Nothing left (the netns is the test's, deleted by its cleanup).
	assertNothingLeft(t, b, spec.ID, procs)
	if st, err := b.State(context.Background(), spec); err != nil || st != sandbox.StateAbsent {
		t.Errorf("State after Remove = %v, %v; want absent", st, err)
	}
}

// TestFrozenSandboxIsNotDroppedAlive: a sandbox whose processes SIGKILL
// cannot kill (frozen in the v1 freezer cgroup: uninterruptible, like a
// process stuck in the kernel) makes runsc delete time out, and Remove
// fails saying so — it does not drop the state of a sandbox that still
// runs. Once it can die, Remove removes it.
func TestFrozenSandboxIsNotDroppedAlive(t *testing.T) {
	b := newBackend(t)
	netns := newNetns(t)
	spec := newSpec(t, b, netns, "echo ready; exec sleep 1000000")
	startReady(t, b, spec)
	sandboxPid, goferPid := pidsOf(t, b, spec.ID)
	procs := append(family(sandboxPid), family(goferPid)...)
	cg := v1Cgroup(t, sandboxPid, "freezer")
	freeze := func(state string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(cg, "freezer.state"), []byte(state), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	freeze("FROZEN")
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			freeze("THAWED")
		}
	})
	testenv.WaitFor(t, 5*time.Second, "the sandbox is frozen", func() bool {
		data, _ := os.ReadFile(filepath.Join(cg, "freezer.state"))
		return strings.TrimSpace(string(data)) == "FROZEN"
	})

	b.deadlines = shortDeadlines(func(d *deadlines) { d.control, d.delete, d.kill = time.Second, time.Second, time.Second })
	start := time.Now()
	if _, err := b.State(context.Background(), spec); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("State of a frozen sandbox: %v, want a timeout", err)
	}
	err := b.Remove(context.Background(), spec)
	took := time.Since(start)
	t.Logf("Remove of a frozen sandbox: %v after %v", err, took)
	if err == nil || !strings.Contains(err.Error(), "still alive") {
		t.Errorf("Remove of an unkillable sandbox = %v, want an error saying it is still alive", err)
	}
	if took > 4*time.Second+2*sandbox.WaitDelay+2*time.Second {
		t.Errorf("State and Remove took %v", took)
	}
	if !b.has(spec.ID) {
		t.Error("Remove dropped runsc's state of a sandbox that still runs")
	}
	if procState(sandboxPid) == 0 || procState(sandboxPid) == 'Z' {
		t.Error("the frozen sandbox process is gone; the test proves nothing")
	}

	// It can die now (the SIGKILL is pending); Remove finishes the job.
	freeze("THAWED")
	thawed = true
	b.deadlines = nil
	if err := b.Remove(context.Background(), spec); err != nil {
		t.Fatalf("Remove after thawing: %v", err)
	}
	assertNothingLeft(t, b, spec.ID, procs)
}

// v1Cgroup is the directory of pid's cgroup in the v1 hierarchy of
// controller; the test is skipped where there is none (on cgroup v2 a
// frozen process dies of SIGKILL, so there is nothing to test).
func v1Cgroup(t *testing.T, pid int, controller string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), controller) {
			return filepath.Join("/sys/fs/cgroup", controller, parts[2])
		}
	}
	// Skipped only on a machine with no v1 hierarchy at all (pure cgroup
	// v2). This project's machines and CI are hybrid, with the v1 freezer
	// mounted: there a sandbox outside it is a failure, not a skip.
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", controller)); err == nil {
		t.Fatalf("a cgroup v1 %s hierarchy is mounted, but pid %d is not in it:\n%s", controller, pid, data)
	}
	if os.Getenv("CI") != "" {
		// CI's machine is hybrid (the v1 freezer is mounted): a skip there
		// would prove nothing.
		t.Fatalf("no cgroup v1 %s hierarchy on CI's machine, which is hybrid: something unmounted it", controller)
	}
	t.Skipf("no cgroup v1 %s hierarchy on this machine (pure cgroup v2)", controller)
	return ""
}

// TestStartCutShort: a runsc run killed at its deadline, at whatever step
// it had reached, leaves nothing: no gofer, sandbox or state.
func TestStartCutShort(t *testing.T) {
	b := newBackend(t)
	netns := newNetns(t)
	cut := 0
	for _, limit := range []time.Duration{10 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond,
		120 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		spec := newSpec(t, b, netns, "echo ready; exec sleep 1000000")
		b.deadlines = shortDeadlines(func(d *deadlines) { d.run = limit })
		start := time.Now()
		err := b.Start(context.Background(), spec)
		took := time.Since(start)
		b.deadlines = nil
		t.Logf("run deadline %v: %v after %v", limit, err, took)
		if err == nil {
			if err := b.Remove(context.Background(), spec); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			assertNothingLeft(t, b, spec.ID, nil)
			continue
		}
		cut++
		var te *TimeoutError
		if !errors.As(err, &te) || te.Command != "runsc run "+spec.ID {
			t.Errorf("Start: %v, want a timeout of runsc run", err)
		}
		if took > limit+sandbox.KillTimeout+sandbox.DeleteTimeout+2*sandbox.WaitDelay {
			t.Errorf("Start took %v", took)
		}
		assertNothingLeft(t, b, spec.ID, nil)
	}
	if cut == 0 {
		t.Error("no runsc run was cut short; the test proves nothing")
	}
}

// TestOOMScoreAtBirth: after a run and after a restore (where runsc
// 2022-12 itself leaves 0 on the sandbox and gofer), every process of the
// sandbox, the sentry's stubs included, has the spec's oom_score_adj
// (1000), not this test process's own: they are born with it.
// SetOOMScore then changes the sandbox and gofer processes of a running
// sandbox (what the node does for one it adopts).
func TestOOMScoreAtBirth(t *testing.T) {
	b := newBackend(t)
	netns := newNetns(t)
	spec := newSpec(t, b, netns, "echo ready; exec sleep 1000000")
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(own)) == "1000" {
		t.Fatal("this test process already has oom_score_adj 1000; the test would prove nothing")
	}
	check := func(after, want string, all bool) {
		t.Helper()
		sandboxPid, goferPid := pidsOf(t, b, spec.ID)
		procs := []proc{{pid: sandboxPid}, {pid: goferPid}}
		if all {
			procs = append(family(sandboxPid), family(goferPid)...)
		}
		for _, p := range procs {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", p.pid))
			if err != nil {
				continue // a stub that has exited
			}
			if got := strings.TrimSpace(string(data)); got != want {
				t.Errorf("after %s: oom_score_adj of pid %d is %s, want %s (sandbox pid %d, gofer pid %d)",
					after, p.pid, got, want, sandboxPid, goferPid)
			}
		}
	}
	startReady(t, b, spec)
	check("run", "1000", true)
	img := t.TempDir()
	if err := b.Checkpoint(context.Background(), spec, img); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := b.Restore(context.Background(), spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	check("restore", "1000", true)
	if err := b.SetOOMScore(context.Background(), spec, 900); err != nil {
		t.Fatalf("SetOOMScore: %v", err)
	}
	check("SetOOMScore", "900", false)
}

// fakeRunsc writes a shell script standing in for runsc and returns its
// path.
func fakeRunsc(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeBackend is a backend whose runsc is script and which keeps a
// (made-up) state file for id.
func fakeBackend(t testing.TB, script, id string, st runscState) *Backend {
	t.Helper()
	requireRoot(t)
	b := &Backend{Runsc: script, Root: filepath.Join(t.TempDir(), "runsc"), Platform: "ptrace"}
	b.deadlines = shortDeadlines(func(d *deadlines) {
		d.control, d.delete, d.kill, d.checkpointBase, d.rate, d.waitDelay =
			300*time.Millisecond, 300*time.Millisecond, time.Second, 400*time.Millisecond, 1<<40, 300*time.Millisecond
	})
	if err := os.MkdirAll(b.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(st)
	if err := os.WriteFile(b.stateFile(id), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.lockFile(id), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeSpec runs "in" this process's own network namespace: nsenter into it
// works, and nothing else is needed.
func fakeSpec(id string) sandbox.Spec {
	return sandbox.Spec{ID: id, Netns: "/proc/self/ns/net", Bundle: "/nonexistent/" + id + "/bundle"}
}

// TestCommandDeadline: a runsc that never answers is killed at the deadline,
// and the error names the command and says it timed out — also when it
// left a child holding its output pipe open.
func TestCommandDeadline(t *testing.T) {
	id := "fake1"
	bgPid := filepath.Join(t.TempDir(), "bg.pid")
	for _, c := range []struct {
		name, script string
	}{
		{"sleeps", "exec sleep 1000"},
		{"a child keeps its output open", "sleep 1000 & echo $! >> " + bgPid + "\nexec sleep 1000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := fakeBackend(t, fakeRunsc(t, c.script), id, runscState{})
			d := b.dl()
			t.Cleanup(func() {
				data, _ := os.ReadFile(bgPid)
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				os.Remove(bgPid)
			})
			for _, op := range []struct {
				what  string
				limit time.Duration
				call  func() error
			}{
				{"runsc state " + id, d.control, func() error { _, err := b.State(context.Background(), fakeSpec(id)); return err }},
				{"runsc pause " + id, d.control, func() error { return b.Pause(context.Background(), fakeSpec(id)) }},
				{"runsc resume " + id, d.control, func() error { return b.Resume(context.Background(), fakeSpec(id)) }},
				{"runsc checkpoint " + id, d.checkpointBase, func() error {
					return b.Checkpoint(context.Background(), fakeSpec(id), t.TempDir())
				}},
			} {
				start := time.Now()
				err := op.call()
				took := time.Since(start)
				var te *TimeoutError
				if !errors.As(err, &te) || te.Command != op.what || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: error %v, want a *TimeoutError for it", op.what, err)
					continue
				}
				msg := err.Error()
				if !strings.Contains(msg, op.what) || !strings.Contains(msg, "timed out after") || !strings.Contains(msg, te.Limit.String()) {
					t.Errorf("%s: error %q does not say which command timed out after how long", op.what, msg)
				}
				// Checkpoint's deadline grows with the sandbox's memory
				// (here the fallback, at a huge rate: a few ms).
				if te.Limit < op.limit || te.Limit > op.limit+10*time.Millisecond {
					t.Errorf("%s: deadline %v, want %v", op.what, te.Limit, op.limit)
				}
				if took < op.limit || took > op.limit+d.waitDelay+time.Second {
					t.Errorf("%s returned after %v; deadline %v (+ sandbox.WaitDelay %v)", op.what, took, op.limit, d.waitDelay)
				}
			}
		})
	}

	// The caller's context still counts: cancelled, the command is killed
	// at once and the error says so.
	b := fakeBackend(t, fakeRunsc(t, "exec sleep 1000"), id, runscState{})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := b.State(ctx, fakeSpec(id))
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "runsc state "+id) || time.Since(start) > time.Second {
		t.Errorf("State with a cancelled context: %v after %v", err, time.Since(start))
	}
}

// child is a process the test started and reaps.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited; then err is set
	err  error
}

// startChild starts cmd, reaps it when it exits and kills it at cleanup.
func startChild(t testing.TB, cmd *exec.Cmd) *child {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-c.done })
	return c
}

// exited reports whether c has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// killedBySIGKILL reports whether c died of SIGKILL, waiting up to limit
// for it to exit.
func (c *child) killedBySIGKILL(limit time.Duration) bool {
	select {
	case <-c.done:
	case <-time.After(limit):
		return false
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		ws, ok := ee.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	}
	return false
}

// hungRunsc starts this test binary as a runsc command that hangs, with
// argv[0] "runsc" and args.
func hungRunsc(t testing.TB, args ...string) *child {
	t.Helper()
	c := startChild(t, &exec.Cmd{Path: os.Args[0], Args: append([]string{"runsc"}, args...), Env: append(os.Environ(), hangEnv+"=1")})
	testenv.WaitFor(t, 5*time.Second, "the stand-in runsc runs", func() bool {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.cmd.Process.Pid))
		return strings.HasPrefix(string(data), "runsc\x00")
	})
	return c
}

// TestRemoveWhenRunscNeverAnswers: runsc delete hangs every time. Remove
// kills the runsc command still hanging for the container, leaves alone a
// process whose pid the state file names but which is not the container's
// (a reused pid), and — nothing of the container being alive — removes
// runsc's state and lock files itself, within its deadline.
func TestRemoveWhenRunscNeverAnswers(t *testing.T) {
	id := "fake2"
	requireRoot(t)
	// Not the container's: its command line does not name the root.
	other := startChild(t, exec.Command("sleep", "1000"))
	st := runscState{GoferPid: other.cmd.Process.Pid}
	b := fakeBackend(t, fakeRunsc(t, "exec sleep 1000"), id, st)
	hung := hungRunsc(t, "--root", b.Root, "--platform=ptrace", "checkpoint", "--image-path=/x", id)
	// A runsc command for another container of the same root, and one for
	// this ID under another root: neither is touched.
	otherID := hungRunsc(t, "--root", b.Root, "state", "fake3")
	otherRoot := hungRunsc(t, "--root", b.Root+"-other", "state", id)

	d := b.dl()
	start := time.Now()
	err := b.Remove(context.Background(), fakeSpec(id))
	took := time.Since(start)
	t.Logf("Remove: %v after %v", err, took)
	if err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if limit := 2*d.delete + d.kill + 2*d.waitDelay + time.Second; took > limit {
		t.Errorf("Remove took %v, more than %v", took, limit)
	}
	if !hung.killedBySIGKILL(5 * time.Second) {
		t.Error("the runsc command hanging for the container was not SIGKILLed")
	}
	for name, c := range map[string]*child{"the unrelated process": other,
		"the runsc command of another container": otherID, "the runsc command of another root": otherRoot} {
		if c.exited() {
			t.Errorf("%s was killed: %v", name, c.err)
		}
	}
	for _, f := range []string{b.stateFile(id), b.lockFile(id)} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left: %v", f, err)
		}
	}
}

// TestWaitInFlightKillsOverdue: a runsc command left by an earlier daemon
// gets the deadline it was started with: WaitInFlight waits for it no
// longer than that, then SIGKILLs it.
func TestWaitInFlightKillsOverdue(t *testing.T) {
	requireRoot(t)
	b := fakeBackend(t, fakeRunsc(t, "exec sleep 1000"), "fake4", runscState{})
	state := hungRunsc(t, "--root", b.Root, "--platform=ptrace", "state", "fake4")
	del := hungRunsc(t, "--root="+b.Root, "delete", "-force", "fake5")
	other := hungRunsc(t, "--root", b.Root+"-other", "state", "fake4")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := b.WaitInFlight(ctx); err != nil {
		t.Fatalf("WaitInFlight: %v", err)
	}
	took := time.Since(start)
	t.Logf("WaitInFlight returned after %v", took)
	if limit := b.dl().delete + time.Second; took > limit {
		t.Errorf("WaitInFlight took %v, more than %v", took, limit)
	}
	for name, c := range map[string]*child{"runsc state": state, "runsc delete": del} {
		if !c.killedBySIGKILL(5 * time.Second) {
			t.Errorf("the overdue %s was not SIGKILLed", name)
		}
	}
	if other.exited() {
		t.Errorf("a runsc command of another root was killed: %v", other.err)
	}
}

func TestLimitOf(t *testing.T) {
	b := &Backend{Root: "/r"}
	img := t.TempDir()
	if err := os.WriteFile(filepath.Join(img, "checkpoint.img"), make([]byte, 64<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"runsc", "--root", "/r", "--platform=ptrace", "state", "x"}, sandbox.ControlTimeout},
		{[]string{"runsc", "--root=/r", "pause", "x"}, sandbox.ControlTimeout},
		{[]string{"runsc", "--root", "/r", "delete", "-force", "x"}, sandbox.DeleteTimeout},
		{[]string{"runsc", "--root", "/r", "run", "-detach", "-bundle", "/b", "x"}, sandbox.RunTimeout},
		{[]string{"runsc", "--root", "/r", "checkpoint", "--image-path=/i", "x"}, sandbox.CheckpointBase + sandbox.FallbackMemory/sandbox.CheckpointRate*time.Second},
		{[]string{"runsc", "--root", "/r", "restore", "-detach", "-image-path=" + img, "-bundle", "/b", "x"}, sandbox.RestoreBase + 2*time.Second},
	} {
		if got := b.limitOf(c.args); got != c.want {
			t.Errorf("limitOf(%v) = %v, want %v", c.args, got, c.want)
		}
	}
}

// BenchmarkRunscCommands measures the commands whose deadlines
// deadline.go sets, as root (go test -run '^$' -bench RunscCommands
// -benchtime 1x -v ./internal/sandbox/gvisor/): five rounds at 64 and at
// 512 MiB, medians in the log. A benchmark, not a test: it only reports.
func BenchmarkRunscCommands(bm *testing.B) {
	for bm.Loop() {
		measureRunsc(bm)
	}
}

func measureRunsc(t testing.TB) {
	b := newBackend(t)
	netns := newNetns(t)
	times := map[string][]time.Duration{}
	timed := func(name string, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		times[name] = append(times[name], time.Since(start))
	}
	bg := context.Background()
	for _, mib := range []int{64, 512} {
		for i := 0; i < 5; i++ {
			// Incompressible data in the sandbox's tmpfs: its memory.
			// A restore needs room above the sandbox's size: at 192 MiB
			// in a 256 MiB limit it is OOM-killed in its cgroup.
			spec := newSpecLimit(t, b, netns, fmt.Sprintf("dd if=/dev/urandom of=/tmp/fill bs=1M count=%d 2>/dev/null; echo ready; exec sleep 1000000", mib), 1024)
			timed("run", func() error { return b.Start(bg, spec) })
			testenv.WaitFor(t, time.Minute, "ready", func() bool {
				data, _ := os.ReadFile(spec.LogPath)
				return strings.Contains(string(data), "ready")
			})
			timed("state", func() error { _, err := b.State(bg, spec); return err })
			timed("pause", func() error { return b.Pause(bg, spec) })
			timed("resume", func() error { return b.Resume(bg, spec) })
			img := t.TempDir()
			timed(fmt.Sprintf("checkpoint %d MiB (+delete)", mib), func() error { return b.Checkpoint(bg, spec, img) })
			timed(fmt.Sprintf("restore %d MiB", mib), func() error { return b.Restore(bg, spec, img) })
			timed("remove (running)", func() error { return b.Remove(bg, spec) })
		}
	}
	var names []string
	for n := range times {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ds := times[n]
		slices.Sort(ds)
		t.Logf("%-28s n=%d min %v median %v max %v", n, len(ds), ds[0].Round(time.Millisecond),
			ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	}
}

// TestPinnedVersion: the version sandstormd expects is the one the
// repository pins, and bin/runsc is it.
func TestPinnedVersion(t *testing.T) {
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := testenv.PinnedRunsc(root)
	if err != nil {
		t.Fatal(err)
	}
	if pinned != PinnedVersion {
		t.Errorf("tools/runsc/go.mod pins %s, PinnedVersion is %s", pinned, PinnedVersion)
	}
	bin, err := testenv.Runsc()
	if err != nil {
		t.Fatal(err)
	}
	if v, err := Version(context.Background(), bin); err != nil || v != PinnedVersion {
		t.Errorf("Version(%s) = %q, %v; want %s", bin, v, err, PinnedVersion)
	}
}

// TestStartWithoutItsNetwork: a spec that does not name the sandbox's
// network namespace makes runsc start it in a new, empty one and exit 0;
// Start notices (the addresses are still on the host side), removes the
// sandbox and says why. With the namespace named, the addresses are taken.
func TestStartWithoutItsNetwork(t *testing.T) {
	b := newBackend(t)
	netns := newNetns(t)
	spec := newSpec(t, b, netns, "echo ready; exec sleep 1000000")
	cfg := filepath.Join(spec.Bundle, "config.json")
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	for i, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			s.Linux.Namespaces[i].Path = ""
		}
	}
	data, _ = json.Marshal(&s)
	if err := os.WriteFile(cfg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := addrsIn(netns)
	if err != nil || len(before) == 0 {
		t.Fatalf("the test's netns has no address to take: %v %v", before, err)
	}
	err = b.Start(context.Background(), spec)
	t.Logf("Start without the netns in the spec: %v", err)
	if err == nil || !strings.Contains(err.Error(), "without its network") {
		t.Fatalf("Start = %v, want an error saying the sandbox has no network", err)
	}
	assertNothingLeft(t, b, spec.ID, nil)

	// Put the namespace back in the spec: the addresses are taken.
	s.Linux.Namespaces[len(s.Linux.Namespaces)-1].Path = netns
	data, _ = json.Marshal(&s)
	if err := os.WriteFile(cfg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	startReady(t, b, spec)
	if left, err := addrsIn(netns); err != nil || len(left) > 0 {
		t.Errorf("after a good start the host side still has %v (%v)", left, err)
	}
}

// TestCompressedSnapshot: with Compression flate-best-speed the image is
// smaller than without, and both restore with a backend set for
// uncompressed images (restore -background, which runsc's help says needs
// an uncompressed image; Restore retries without it if refused). The
// images here are small, so -background is asked for from any size.
func TestCompressedSnapshot(t *testing.T) {
	b := newBackend(t)
	b.BackgroundMin = 0
	netns := newNetns(t)
	spec := newSpec(t, b, netns, "echo ready; exec sleep 1000000")
	sizes := map[string]int64{}
	for _, c := range []string{"", "flate-best-speed"} {
		b.Compression = c
		startReady(t, b, spec)
		img := t.TempDir()
		if err := b.Checkpoint(context.Background(), spec, img); err != nil {
			t.Fatalf("Checkpoint (compression %q): %v", c, err)
		}
		sizes[c] = dirSize(img)
		// Restored as a node with the default compression would.
		b.Compression = ""
		if err := b.Restore(context.Background(), spec, img); err != nil {
			t.Fatalf("Restore (compression %q): %v", c, err)
		}
		if st, err := b.State(context.Background(), spec); err != nil || st != sandbox.StateRunning {
			t.Fatalf("after restore (compression %q): %v %v", c, st, err)
		}
		if err := b.Remove(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(spec.LogPath, nil, 0o600) // so the next start's "ready" is its own
	}
	t.Logf("image sizes: %v", sizes)
	if sizes["flate-best-speed"] >= sizes[""] {
		t.Errorf("compressed image %d bytes, uncompressed %d", sizes["flate-best-speed"], sizes[""])
	}
}
