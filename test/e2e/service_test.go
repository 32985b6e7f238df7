package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/unit"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// PID 1 here (and in CI) is not systemd, so systemctl cannot run the unit.
// These tests do what systemd does with it instead, reading every setting
// they use from the installed unit file itself, so they cannot drift from
// it: the process is started in a cgroup of its own, as systemd places a
// service (on the unified hierarchy, where systemd tracks it, and on the
// named v1 "systemd" hierarchy it mirrors on a hybrid host), with the
// unit's environment and ExecStart, and readiness read from sd_notify(3)
// datagrams on a NOTIFY_SOCKET; a stop signals what KillMode says
// (systemd.kill(5)): control-group, KillSignal then SIGCONT to every
// process of the cgroup, SIGKILL to what is left after TimeoutStopSec;
// mixed, KillSignal to the main process and, once it has exited, SIGKILL
// to every process left in the cgroup; process, the main process only.

// systemdUnit is what the emulation reads from a unit's [Service] section.
type systemdUnit struct {
	path        string
	typ         string
	notify      string // NotifyAccess
	killMode    string
	killSignal  syscall.Signal
	timeoutStop time.Duration
	sendSIGKILL bool
	execStart   string
	execReload  string
	env         map[string]string
}

func readSystemdUnit(t *testing.T, path string) systemdUnit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts, err := unit.Deserialize(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	// systemd's defaults (systemd.kill(5), systemd.service(5)).
	u := systemdUnit{path: path, typ: "simple", notify: "none", killMode: "control-group", killSignal: syscall.SIGTERM,
		timeoutStop: 90 * time.Second, sendSIGKILL: true, env: map[string]string{}}
	for _, o := range opts {
		if o.Section != "Service" {
			continue
		}
		v := strings.TrimSpace(o.Value)
		switch o.Name {
		case "Type":
			u.typ = v
		case "NotifyAccess":
			u.notify = v
		case "KillMode":
			u.killMode = v
		case "KillSignal":
			sig, ok := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT, "SIGHUP": syscall.SIGHUP}[v]
			if !ok {
				t.Fatalf("%s: KillSignal=%s: not one this emulation knows", path, v)
			}
			u.killSignal = sig
		case "TimeoutStopSec":
			d, err := time.ParseDuration(v)
			if n, err2 := strconv.Atoi(v); err2 == nil {
				d, err = time.Duration(n)*time.Second, nil
			}
			if err != nil {
				t.Fatalf("%s: TimeoutStopSec=%s: %v", path, v, err)
			}
			u.timeoutStop = d
		case "SendSIGKILL":
			u.sendSIGKILL = v != "no" && v != "false"
		case "ExecStart":
			u.execStart = v
		case "ExecReload":
			u.execReload = v
		case "Environment":
			for _, kv := range splitQuoted(v) {
				if k, val, ok := strings.Cut(kv, "="); ok {
					u.env[k] = val
				}
			}
		}
	}
	return u
}

// splitQuoted splits on spaces outside double quotes, dropping the quotes
// (Environment= and command lines, systemd.syntax(7)).
func splitQuoted(s string) []string {
	var out []string
	var cur strings.Builder
	in, any := false, false
	for _, r := range s {
		switch {
		case r == '"':
			in, any = !in, true
		case r == ' ' && !in:
			if any {
				out = append(out, cur.String())
				cur.Reset()
				any = false
			}
		default:
			cur.WriteRune(r)
			any = true
		}
	}
	if any {
		out = append(out, cur.String())
	}
	return out
}

// command expands a command line as systemd does (systemd.service(5),
// "Command lines"): $NAME alone is split on whitespace into words, ${NAME}
// is one word.
func command(line string, env map[string]string) []string {
	var out []string
	for _, w := range splitQuoted(line) {
		switch {
		case strings.HasPrefix(w, "${") && strings.HasSuffix(w, "}"):
			out = append(out, env[w[2:len(w)-1]])
		case strings.HasPrefix(w, "$"):
			out = append(out, strings.Fields(env[w[1:]])...)
		default:
			out = append(out, w)
		}
	}
	return out
}

// unitCgroup is the cgroup systemd would give the service.
type unitCgroup struct {
	unified string // on the cgroup2 hierarchy, where systemd tracks the unit
	named   string // on the named v1 hierarchy "systemd" of a hybrid host ("": none)
}

// cgroupMounts finds the cgroup2 mount and the named "systemd" v1 mount.
func cgroupMounts(t *testing.T) (unified, named string) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i < 0 || i+3 >= len(fields) {
			continue
		}
		switch {
		case fields[i+1] == "cgroup2" && unified == "":
			unified = fields[4]
		case fields[i+1] == "cgroup" && strings.Contains(fields[i+3], "name=systemd"):
			named = fields[4]
		}
	}
	if unified == "" {
		t.Fatal("no cgroup2 hierarchy is mounted: systemd could not track a service here")
	}
	return unified, named
}

func newUnitCgroup(t *testing.T, name string) *unitCgroup {
	t.Helper()
	unified, named := cgroupMounts(t)
	c := &unitCgroup{unified: filepath.Join(unified, name)}
	if named != "" {
		c.named = filepath.Join(named, name)
	}
	for _, d := range []string{c.unified, c.named} {
		if d == "" {
			continue
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Last: after the daemon's own cleanup has stopped it and removed its
	// sandboxes. What is left is moved out and the cgroups removed.
	t.Cleanup(func() {
		for _, d := range []string{c.unified, c.named} {
			if d == "" {
				continue
			}
			for _, pid := range procsUnder(d) {
				os.WriteFile(filepath.Join(filepath.Dir(d), "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
			}
			removeTree(d)
		}
	})
	return c
}

// removeTree removes a cgroup and its children, deepest first.
func removeTree(d string) {
	ents, _ := os.ReadDir(d)
	for _, e := range ents {
		if e.IsDir() {
			removeTree(filepath.Join(d, e.Name()))
		}
	}
	os.Remove(d)
}

// procsUnder lists the processes of cgroup d and of every cgroup below it.
func procsUnder(d string) []int {
	var out []int
	filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return nil
	})
	return out
}

// killAll signals every process of the cgroup (and below), again while new
// ones turn up, as systemd's cg_kill_recursive does against a fork racing
// the kill. It returns how many it signalled.
func (c *unitCgroup) killAll(sig syscall.Signal) int {
	done := map[int]bool{}
	for {
		found := false
		for _, pid := range procsUnder(c.unified) {
			if !done[pid] {
				done[pid], found = true, true
				syscall.Kill(pid, sig)
			}
		}
		if !found {
			return len(done)
		}
	}
}

// notifySocket is a NOTIFY_SOCKET: the sd_notify(3) datagrams a service
// sends, each with its sender's PID (SCM_CREDENTIALS), as systemd reads
// them to check NotifyAccess=main.
type notifySocket struct {
	path string
	mu   sync.Mutex
	got  []notification
}

type notification struct {
	pid   int
	state string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	n := &notifySocket{path: filepath.Join(t.TempDir(), "notify.sock")}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, _ := c.SyscallConn()
	rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1) })
	go func() {
		buf, oob := make([]byte, 4096), make([]byte, 1024)
		for {
			nb, no, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			pid := 0
			if msgs, err := syscall.ParseSocketControlMessage(oob[:no]); err == nil {
				for _, m := range msgs {
					if cred, err := syscall.ParseUnixCredentials(&m); err == nil {
						pid = int(cred.Pid)
					}
				}
			}
			n.mu.Lock()
			for _, l := range strings.Split(strings.TrimSpace(string(buf[:nb])), "\n") {
				n.got = append(n.got, notification{pid, l})
			}
			n.mu.Unlock()
		}
	}()
	return n
}

// wait waits for state from pid, counting from the index-th notification.
func (n *notifySocket) wait(t *testing.T, from int, pid int, state string) int {
	t.Helper()
	at := -1
	testenv.WaitFor(t, 2*time.Minute, fmt.Sprintf("%s from PID %d on NOTIFY_SOCKET", state, pid), func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		for i := from; i < len(n.got); i++ {
			if n.got[i].state == state && n.got[i].pid == pid {
				at = i
				return true
			}
		}
		return false
	})
	return at + 1
}

func (n *notifySocket) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.got)
}

// runAsUnit makes every start of d what systemd does for u: the unit's
// ExecStart, with SANDSTORMD_ARGS the daemon's serve flags (as an
// EnvironmentFile would set them), its Environment, NOTIFY_SOCKET, in
// cgroup c from before the exec.
func runAsUnit(d *Daemon, u systemdUnit, c *unitCgroup, ns *notifySocket) {
	d.wrap = func(cmd *exec.Cmd) {
		env := map[string]string{}
		for k, v := range u.env {
			env[k] = v
		}
		// /etc/default/sandstormd, as the unit's EnvironmentFile= reads it.
		env["SANDSTORM_DATA_DIR"] = d.DataDir
		env["SANDSTORMD_ARGS"] = strings.Join(cmd.Args[2:], " ") // after "sandstormd serve"
		argv := command(u.execStart, env)
		cmd.Path = "/bin/sh"
		cmd.Args = append([]string{"sh", "-c", `echo $$ > "$1/cgroup.procs" && { [ -z "$2" ] || echo $$ > "$2/cgroup.procs"; } && shift 2 && exec "$@"`, "sh", c.unified, c.named}, argv...)
		cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+ns.path)
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
}

// stopAsUnit stops d the way systemd stops the unit with KillMode mode,
// and returns how long it took.
func stopAsUnit(t *testing.T, d *Daemon, u systemdUnit, c *unitCgroup, mode string) time.Duration {
	t.Helper()
	start := time.Now()
	main := d.cmd.Process.Pid
	deadline := time.After(u.timeoutStop)
	switch mode {
	case "control-group":
		c.killAll(u.killSignal)
		c.killAll(syscall.SIGCONT)
	case "mixed", "process":
		syscall.Kill(main, u.killSignal)
		syscall.Kill(main, syscall.SIGCONT)
	default:
		t.Fatalf("KillMode=%s: not one this emulation knows", mode)
	}
	timedOut := false
	select {
	case <-d.exited:
	case <-deadline:
		timedOut = true
	}
	if timedOut && u.sendSIGKILL {
		t.Logf("the main process outlived TimeoutStopSec=%v: SIGKILL", u.timeoutStop)
		if mode == "control-group" {
			c.killAll(syscall.SIGKILL)
		} else {
			syscall.Kill(main, syscall.SIGKILL)
		}
		<-d.exited
	}
	switch mode {
	case "mixed":
		// The main process is gone: the rest of the cgroup gets SIGKILL
		// (systemd's final SIGKILL step), and systemd waits for the
		// cgroup to empty.
		c.killAll(syscall.SIGKILL)
		for len(procsUnder(c.unified)) > 0 {
			select {
			case <-deadline:
				t.Fatalf("KillMode=mixed: processes %v outlived SIGKILL", procsUnder(c.unified))
			case <-time.After(20 * time.Millisecond):
			}
		}
	case "control-group":
		// Wait for the cgroup to empty, then SIGKILL what is left.
		for len(procsUnder(c.unified)) > 0 && !timedOut {
			select {
			case <-deadline:
				timedOut = true
			case <-time.After(20 * time.Millisecond):
			}
		}
		if len(procsUnder(c.unified)) > 0 && u.sendSIGKILL {
			c.killAll(syscall.SIGKILL)
		}
	}
	return time.Since(start)
}

// runscProcs are the processes of sandbox id: its runsc sandbox and gofer
// (their command lines name its bundle) and the sandbox's children (the
// systrap stubs), each with its cgroup lines.
func runscProcs(d *Daemon, id string) map[int]string {
	out := map[int]string{}
	for pid, cmdline := range processesMentioning(filepath.Join(d.sandboxDir(id), "bundle")) {
		if strings.Contains(cmdline, "runsc-sandbox") || strings.Contains(cmdline, "runsc-gofer") {
			out[pid] = strings.Fields(cmdline)[0]
		}
	}
	for pid, name := range out {
		if name != "runsc-sandbox" {
			continue
		}
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, task := range tasks {
			b, _ := os.ReadFile(task)
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil {
					out[n] = "child of runsc-sandbox"
				}
			}
		}
	}
	return out
}

// reaped waits until the killed processes are reaped, as systemd (PID 1)
// reaps at once the orphans it inherits; the init here reaps about once a
// second, and runsc takes a zombie sandbox process for a running one.
func reaped(t *testing.T, procs map[int]string) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, "the killed sandbox processes reaped", func() bool {
		for pid := range procs {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				return false
			}
		}
		return true
	})
}

// killed waits for pid, signalled by a stop, to stop running. Not at
// once: cgroup.procs leaves out a process as soon as all its threads have
// begun to exit (signal->live, css_task_iter_advance in
// kernel/cgroup/cgroup.c), so the emulated stop can end while a
// runsc-sandbox's threads still tear down its memory, which /proc shows
// as running (seen once in CI). A process the stop missed runs on, and
// fails after TimeoutStopSec.
func killed(t *testing.T, pid int, what string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, what, func() bool { return !running(pid) })
}

// running reports whether pid runs (not gone, not a zombie).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

func cgroupLines(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "0::") || strings.Contains(l, "name=systemd") || strings.Contains(l, ":memory:") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, " ")
}

// TestServiceKillMode (issue 18 item 2): `make install` into a prefix of
// the test's own, `systemd-analyze verify` of the unit it installs, and
// the unit's stop, restart and reload done as systemd does them (above):
// the sandboxes run on through a stop and a restart (KillMode=process) and
// are adopted with their memory, and a reload keeps the PID. The same
// stop with KillMode=control-group (systemd's default) and with mixed
// kills them: where runsc puts its processes (measured, logged) is what
// makes the unit's choice the one that keeps them.
func TestServiceKillMode(t *testing.T) {
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	prefix := t.TempDir()
	if out, err := exec.Command("make", "-s", "-C", root, "install", "PREFIX="+prefix).CombinedOutput(); err != nil {
		t.Fatalf("make install PREFIX=%s: %v\n%s", prefix, err, out)
	}
	unitPath := filepath.Join(prefix, "lib", "systemd", "system", "sandstormd.service")
	for _, f := range []string{"bin/sandstormd", "lib/sandstorm/sandstormd", "lib/sandstorm/runsc", "lib/sandstorm/sandstorm-envd", "bin/sam-node", "lib/systemd/system/sandstormd.service"} {
		if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
			t.Fatalf("make install: %v", err)
		}
	}
	// systemd's own check of the unit, offline: syntax, every setting
	// known, ExecStart's program there. Silence is a pass.
	if out, err := exec.Command("systemd-analyze", "verify", unitPath).CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}
	// DESTDIR stages the same files under another root, naming PREFIX.
	stage := t.TempDir()
	if out, err := exec.Command("make", "-s", "-C", root, "install", "PREFIX=/usr/local", "DESTDIR="+stage).CombinedOutput(); err != nil {
		t.Fatalf("make install DESTDIR=: %v\n%s", err, out)
	}
	staged, err := os.ReadFile(filepath.Join(stage, "usr/local/lib/systemd/system/sandstormd.service"))
	if err != nil || !strings.Contains(string(staged), "ExecStart=/usr/local/bin/sandstormd serve") || strings.Contains(string(staged), stage) {
		t.Fatalf("the staged unit (%v) should name /usr/local, not the stage:\n%s", err, staged)
	}
	if link, err := os.Readlink(filepath.Join(stage, "usr/local/bin/sandstormd")); err != nil || link != "/usr/local/lib/sandstorm/sandstormd" {
		t.Fatalf("staged bin/sandstormd links to %q (%v), want /usr/local/lib/sandstorm/sandstormd", link, err)
	}
	// sandstormd doctor checks the unit it finds.
	out, _ := exec.Command(filepath.Join(prefix, "bin", "sandstormd"), "doctor", "--data-dir", t.TempDir(), "--unit-dir", filepath.Dir(unitPath), "--api", "https://127.0.0.1:1").CombinedOutput()
	if !strings.Contains(string(out), "✓ service") || !strings.Contains(string(out), "KillMode=process and Delegate=yes") {
		t.Fatalf("doctor on the installed unit:\n%s", out)
	}

	u := readSystemdUnit(t, unitPath)
	if u.typ != "notify" || u.notify != "main" || u.execStart == "" || u.execReload == "" {
		t.Fatalf("the unit: %+v", u)
	}
	t.Logf("the unit: KillMode=%s KillSignal=%v TimeoutStopSec=%v SendSIGKILL=%v", u.killMode, u.killSignal, u.timeoutStop, u.sendSIGKILL)
	cg := newUnitCgroup(t, fmt.Sprintf("sandstorm-e2e-%d.service", os.Getpid()))
	ns := newNotifySocket(t)
	d := newDaemon(t)
	runAsUnit(d, u, cg, ns)
	d.Start(t)
	seen := ns.wait(t, 0, d.cmd.Process.Pid, "READY=1")
	hot, frozen, snap, n := d.threeTiers(t)

	// Where runsc's processes are, against where systemd tracks the unit.
	procs := runscProcs(d, hot.ID)
	inUnit := procsUnder(cg.unified)
	for pid, name := range procs {
		t.Logf("hot's %-22s pid %-7d in the unit's cgroup: %-5v  %s", name, pid, slices.Contains(inUnit, pid), cgroupLines(pid))
	}
	if len(procs) < 2 {
		t.Fatalf("found %d runsc processes of the hot sandbox, want its sandbox and gofer at least: %v", len(procs), procs)
	}

	// systemctl restart: a stop with the unit's KillMode, then a start.
	took := stopAsUnit(t, d, u, cg, u.killMode)
	for pid, name := range procs {
		if !running(pid) {
			t.Fatalf("after a stop with KillMode=%s, hot's %s (pid %d) is gone", u.killMode, name, pid)
		}
	}
	t.Logf("stop with KillMode=%s took %v; %d processes left in the unit's cgroup (systemd logs them as left over, and keeps them)", u.killMode, took.Round(time.Millisecond), len(procsUnder(cg.unified)))
	d.Start(t)
	seen = ns.wait(t, seen, d.cmd.Process.Pid, "READY=1")
	d.expectThreeTiers(t, "after a restart as the unit does it", n, hot, frozen, snap)

	// systemctl reload: ExecReload, with the unit's environment.
	main := d.cmd.Process.Pid
	from := ns.count()
	env := map[string]string{}
	for k, v := range u.env {
		env[k] = v
	}
	env["SANDSTORM_DATA_DIR"] = d.DataDir
	argv := command(u.execReload, env)
	reload := exec.Command(argv[0], argv[1:]...)
	reload.Env = os.Environ()
	for k, v := range env {
		reload.Env = append(reload.Env, k+"="+v)
	}
	if out, err := reload.CombinedOutput(); err != nil {
		t.Fatalf("ExecReload (%s): %v\n%s", strings.Join(argv, " "), err, out)
	}
	at := ns.wait(t, from, main, "RELOADING=1")
	seen = ns.wait(t, at, main, "READY=1")
	if d.cmd.Process.Pid != main || !d.running() {
		t.Fatal("the main PID changed across a reload")
	}
	n[hot.ID]++
	expectCount(t, endpoint(t, hot), n[hot.ID], "hot after a reload as the unit does it")

	// The same stop with systemd's default KillMode kills the sandboxes:
	// the test above would fail with it.
	took = stopAsUnit(t, d, u, cg, "control-group")
	for pid, name := range procs {
		killed(t, pid, fmt.Sprintf("after a stop with KillMode=control-group, hot's %s (pid %d) still runs: then the unit's KillMode is not what keeps them", name, pid))
	}
	t.Logf("stop with KillMode=control-group took %v and killed every sandbox process", took.Round(time.Millisecond))
	reaped(t, procs)
	d.Start(t)
	// systemd signals sandstormd and the sandbox together, so which of
	// them notes the death first is a race: the exit watcher of the
	// stopping daemon ("its process exited") or the next start's
	// reconcile ("its processes were gone"). Either way it is detached
	// and says the next request cold-starts it.
	if got := d.get(t, hot.ID); got.Tier != api.TierDetached || !strings.Contains(got.Note, "the next request cold-starts it") {
		t.Fatalf("after KillMode=control-group, hot is %s (%q), want detached: its processes were killed", got.Tier, got.Note)
	}
	expectCount(t, endpoint(t, hot), 1, "hot after KillMode=control-group killed it (a cold start: its memory is gone)")

	// And with mixed.
	hot2 := d.create(t, "web", "hot2")
	procs2 := runscProcs(d, hot2.ID)
	stopAsUnit(t, d, u, cg, "mixed")
	for pid, name := range procs2 {
		killed(t, pid, fmt.Sprintf("after a stop with KillMode=mixed, hot2's %s (pid %d) still runs", name, pid))
	}
	reaped(t, procs2)
	d.Start(t)
	if got := d.get(t, hot2.ID); got.Tier != api.TierDetached {
		t.Fatalf("after KillMode=mixed, hot2 is %s, want detached", got.Tier)
	}
}
