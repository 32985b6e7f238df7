package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/testenv"
	pb "sandstorm/third_party/envd/process"
)

// py is the web demo's Python (the demo rootfs has no shell).
const py = "/usr/bin/python3"

// TestExecAndFiles: commands and files in a real gVisor sandbox through the
// CLI and the API — output, exit status, stdin, user, files both ways —
// and the rules around them: a command in a sandbox that is snapshotted
// wakes it, a command left running is in the sandbox's memory through a
// snapshot and is reconnected to after the wake, paths name the sandbox's
// files and never the host's, a command reaches nothing its sandbox may
// not, and another sandbox cannot reach envd.
func TestExecAndFiles(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	sb := d.create(t, "web", "ex")
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}

	r := cli(t, env, "sandbox", "exec", "ex", "--env", "GREETING=hi", "--cwd", "/tmp", "--",
		py, "-c", "import os,sys; print(os.environ['GREETING'], os.getuid(), os.getcwd()); sys.stderr.write('to stderr\\n'); sys.exit(3)")
	if r.Code != 3 || r.Stdout != "hi 0 /tmp\n" || r.Stderr != "to stderr\n" {
		t.Fatalf("exec: exit %d stdout %q stderr %q; want 3, %q, %q", r.Code, r.Stdout, r.Stderr, "hi 0 /tmp\n", "to stderr\n")
	}
	r = cli(t, env, "sandbox", "exec", "ex", "--user", "nobody", "--", py, "-c", "import os; print(os.getuid())")
	r.ok(t, "exec as nobody", `^65534\n$`)
	in := exec.Command(sandstormdBin, "sandbox", "exec", "ex", "-i", "--", py, "-c", "import sys; print(sys.stdin.read().upper(), end='')")
	in.Env = append(os.Environ(), env...)
	in.Stdin = strings.NewReader("through stdin")
	if out, err := in.Output(); err != nil || string(out) != "THROUGH STDIN" {
		t.Errorf("exec -i: %q %v", out, err)
	}
	// -t: a terminal in the sandbox, from a terminal here (script(1)
	// gives sandstormd one), 80x24 when this one has no size.
	tty := exec.Command("script", "-qec", sandstormdBin+` sandbox exec ex -t -- `+py+` -c "import os; print(os.isatty(0), os.isatty(1), os.get_terminal_size())"`, "/dev/null")
	tty.Env = append(os.Environ(), env...)
	if out, err := tty.Output(); err != nil || !strings.Contains(string(out), "True True os.terminal_size(columns=80, lines=24)") {
		t.Errorf("exec -t: %q %v", out, err)
	}
	cli(t, env, "sandbox", "exec", "nosuch", "--", py).fails(t, "exec in no sandbox", "not found")
	r = cli(t, env, "sandbox", "exec", "ex", "--", "/no/such/binary")
	if r.Code != 127 || !strings.Contains(r.Stderr, "/no/such/binary") {
		t.Errorf("exec of a missing binary: exit %d stderr %q; want 127, as a shell gives", r.Code, r.Stderr)
	}
	for cmd, want := range map[string]int{"nosuchcmd": 127, "/etc/passwd": 126} {
		if r := cli(t, env, "sandbox", "exec", "ex", "--", cmd); r.Code != want || !strings.Contains(r.Stderr, cmd) {
			t.Errorf("exec %s: exit %d stderr %q; want %d, as a shell gives", cmd, r.Code, r.Stderr, want)
		}
	}

	// Settings at create: env for its commands, labels to list by, a
	// lifetime at whose end it is deleted.
	cli(t, env, "sandbox", "create", "web", "--name", "lab", "--env", "FROM_CREATE=yes", "--label", "team=qa", "--lifetime", "1h").ok(t, "create with settings")
	d.track(d.get(t, "lab").ID)
	cli(t, env, "sandbox", "exec", "lab", "--", py, "-c", "import os; print(os.environ['FROM_CREATE'])").ok(t, "exec sees the create's env", `^yes\n$`)
	cli(t, env, "sandbox", "ls", "--label", "team=qa").ok(t, "ls --label", `lab`)
	if r := cli(t, env, "sandbox", "ls", "--label", "team=dev"); strings.Contains(r.Stdout, "lab") {
		t.Errorf("ls --label team=dev lists lab: %s", r.Stdout)
	}
	// Its own idle timer, where the node's freeze nothing.
	cli(t, env, "sandbox", "create", "web", "--name", "sleepy", "--freeze-after", "1s").ok(t, "create with its own idle timer")
	sleepy := d.get(t, "sleepy")
	d.track(sleepy.ID)
	if sleepy.Idle == nil || sleepy.Idle.FreezeAfter != "1s" {
		t.Errorf("sleepy's idle timers: %+v", sleepy.Idle)
	}
	d.waitTier(t, sleepy.ID, api.TierFrozen, 20*time.Second)
	if l := d.get(t, "lab"); l.Tier != api.TierHot {
		t.Errorf("lab, on the node's timers (none), is %s", l.Tier)
	}
	if r := cli(t, env, "sandbox", "create", "web", "--name", "bad", "--freeze-after", "soon"); r.Code != 2 || !strings.Contains(r.Stderr, "freeze_after") {
		t.Errorf("a bad idle timer: exit %d, stderr %q; want a usage error (exit 2) naming freeze_after", r.Code, r.Stderr)
	}
	cli(t, env, "sandbox", "create", "web", "--name", "brief", "--lifetime", "1s").ok(t, "create with a 1 s lifetime")
	d.track(d.get(t, "brief").ID)
	testenv.WaitFor(t, 15*time.Second, "brief deleted at its lifetime's end", func() bool {
		_, err := d.C.Sandbox(context.Background(), "brief")
		return client.StatusOf(err) == http.StatusNotFound
	})

	// Files, both ways, 4 MiB of random bytes.
	data, local := cpBothWays(t, env, "ex", "/work/in/data.bin", 4<<20, "")
	r = cli(t, env, "sandbox", "exec", "ex", "--", py, "-c", "import hashlib; print(len(open('/work/in/data.bin','rb').read()))")
	r.ok(t, "the sandbox sees the copied file", fmt.Sprintf(`^%d\n$`, len(data)))

	// A directory, both ways.
	tree := filepath.Join(t.TempDir(), "tree")
	os.MkdirAll(filepath.Join(tree, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(tree, "top.txt"), []byte("top"), 0o644)
	os.WriteFile(filepath.Join(tree, "a", "b", "deep.txt"), []byte("deep"), 0o644)
	cli(t, env, "sandbox", "cp", tree, "ex:/work/tree").ok(t, "cp a directory in")
	cli(t, env, "sandbox", "exec", "ex", "--", py, "-c", "print(open('/work/tree/a/b/deep.txt').read())").ok(t, "the copied tree", `^deep\n$`)
	out := filepath.Join(t.TempDir(), "out")
	cli(t, env, "sandbox", "cp", "ex:/work/tree", out).ok(t, "cp a directory out")
	if b, _ := os.ReadFile(filepath.Join(out, "a", "b", "deep.txt")); string(b) != "deep" {
		t.Errorf("the tree came back without a/b/deep.txt: %q", b)
	}

	// Paths are the sandbox's: .., an absolute path and a symlink out all
	// name its own files. Its /etc/passwd is the demo's, not the host's:
	// both are Debian's, so the sandbox's gets a line of its own first.
	hostPasswd, _ := os.ReadFile("/etc/passwd")
	const mark = "sandboxmark:x:4242:4242::/nonexistent:/usr/sbin/nologin\n"
	cli(t, env, "sandbox", "exec", "ex", "--user", "root", "--", py, "-c", "import os; os.symlink('/etc', '/tmp/etc-link'); open('/etc/passwd', 'a').write('"+strings.TrimSuffix(mark, "\n")+"\\n')").ok(t, "make a symlink, mark /etc/passwd")
	for _, p := range []string{"/etc/passwd", "../../../../etc/passwd", "/tmp/etc-link/passwd", "/tmp/../../etc/passwd"} {
		r := cli(t, env, "sandbox", "cp", "ex:"+p, "-")
		r.ok(t, "cp out "+p, `nobody:x:65534`)
		if r.Stdout == string(hostPasswd) || strings.Contains(string(hostPasswd), mark) || !strings.HasSuffix(r.Stdout, mark) {
			t.Errorf("%s read %q: not the sandbox's own /etc/passwd", p, r.Stdout)
		}
	}

	// A command reaches nothing its sandbox may not: the node's own
	// address (the host side of its veth), here the API's port.
	port := strings.TrimPrefix(d.API[strings.LastIndex(d.API, ":"):], ":")
	sbAddr := netip.MustParseAddr(sb.Address)
	host := sbAddr.Prev().String() // the host side of its /30 (netns)
	r = cli(t, env, "sandbox", "exec", "ex", "--", py, "-c", fmt.Sprintf(
		"import socket; s=socket.socket(); s.settimeout(3)\ntry:\n s.connect(('%s', %s)); print('CONNECTED')\nexcept Exception as e: print('refused', type(e).__name__)", host, port))
	if r.Code != 0 || strings.Contains(r.Stdout, "CONNECTED") {
		t.Errorf("a command reached the node at %s:%s: exit %d %q %q", host, port, r.Code, r.Stdout, r.Stderr)
	}

	// Another sandbox cannot reach this one's envd.
	other := d.create(t, "web", "other")
	// Its connection is taken by its own boundary (the node redirects
	// every TCP connection leaving a sandbox there), which refuses it: a
	// reset right after the handshake. Reached would be a server waiting
	// for its request (the read times out) or answering.
	r = cli(t, env, "sandbox", "exec", "other", "--", py, "-c", fmt.Sprintf(
		"import socket; s=socket.socket(); s.settimeout(3)\ntry:\n s.connect(('%s', 49983))\nexcept Exception as e: print('refused', type(e).__name__); raise SystemExit\ntry:\n s.recv(1); print('CONNECTED')\nexcept socket.timeout: print('CONNECTED')\nexcept Exception as e: print('refused', type(e).__name__)", sb.Address))
	if r.Code != 0 || strings.Contains(r.Stdout, "CONNECTED") {
		t.Errorf("sandbox %s reached the envd of %s: exit %d %q %q", other.Name, sb.Name, r.Code, r.Stdout, r.Stderr)
	}

	// In a sandbox whose envd was started on first use (runsc exec), a
	// command survives a freeze but not a snapshot: gVisor ends what
	// runsc exec started at a restore. envd itself comes back.
	counter := &pb.ProcessConfig{Cmd: py, Args: []string{"-u", "-c", "import time\nn=0\nwhile True:\n n+=1; print(n); time.sleep(0.05)"}}
	pid, last := startCounter(t, d.C.Envd("ex", ""), counter, "early")
	d.transition(t, sb.ID, "freeze", api.TierFrozen)
	if next := connectCounter(t, d.C.Envd("ex", ""), "early"); next <= last {
		t.Errorf("after a freeze the command printed %d, had printed %d", next, last)
	}
	d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
	if l, err := d.C.Envd("ex", "").Process.List(context.Background(), connect.NewRequest(&pb.ListRequest{})); err != nil || len(l.Msg.Processes) != 0 {
		t.Errorf("after a snapshot of a sandbox whose envd was exec'd: %v %v, want envd back with no commands", l, err)
	}
	_ = pid

	// A template that runs envd as its init: its commands are in every
	// checkpoint. A command left running is reconnected to after the
	// wake from a snapshot, its memory kept: it counts on from where it
	// was.
	tp := api.TemplateRequest{Name: "webi", RootfsDir: webRootfs, Process: api.Process{Args: webDemo.Args, Env: webDemo.Env, Envd: &api.Envd{}}, Ports: webDemo.Ports}
	if _, err := d.C.CreateTemplate(ctxT(t), tp); err != nil {
		t.Fatal(err)
	}
	sb = d.create(t, "webi", "init")
	expectCount(t, endpoint(t, sb), 1, "the template's process, under envd")
	e := d.C.Envd("init", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tag := "counter"
	pid, last = startCounter(t, e, counter, tag)
	d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
	l, err := e.Process.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatalf("list after the snapshot: %v", err)
	}
	if got := d.get(t, sb.ID); got.Tier != api.TierHot || got.LastWakeFrom != api.TierSnapshot {
		t.Errorf("after an envd call: tier %s woken from %q, want hot from snapshot", got.Tier, got.LastWakeFrom)
	}
	found := false
	for _, p := range l.Msg.Processes {
		found = found || (p.Pid == pid && p.GetTag() == tag)
	}
	if !found {
		t.Fatalf("the running command (pid %d) is not listed after the wake: %v", pid, l.Msg.Processes)
	}
	if next := connectCounter(t, e, tag); next <= last {
		t.Errorf("after the wake the command printed %d, had printed %d: not the same process counting on", next, last)
	}
	expectCount(t, endpoint(t, sb), 2, "the template's process, its memory kept")
	if _, err := e.Process.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if l, _ := e.Process.List(ctx, connect.NewRequest(&pb.ListRequest{})); len(l.Msg.Processes) != 0 {
		// The kill's end reaches envd's table a moment later.
		testenv.WaitFor(t, 10*time.Second, "the killed command gone from the list", func() bool {
			l, err := e.Process.List(ctx, connect.NewRequest(&pb.ListRequest{}))
			return err == nil && len(l.Msg.Processes) == 0
		})
	}

	// A command in a detached sandbox cold-starts it, and envd with it.
	d.transition(t, sb.ID, "detach", api.TierDetached)
	cli(t, env, "sandbox", "cp", local, "init:/work/in/data.bin").ok(t, "cp in")
	d.transition(t, sb.ID, "detach", api.TierDetached)
	cli(t, env, "sandbox", "exec", "init", "--", py, "-c", "print(open('/work/in/data.bin','rb').read(3) != b'')").ok(t, "exec after a detach (its volume kept)", `^True\n$`)
	if got := d.get(t, sb.ID); got.LastWakeFrom != api.TierDetached {
		t.Errorf("after exec in a detached sandbox: woken from %q", got.LastWakeFrom)
	}
}

// cpBothWays copies size random bytes into sandbox name at path with
// `sandstormd sandbox cp` and back out, and checks they come back as they
// went; where says where the sandbox is, for the failures. It returns the
// bytes and the local file they were copied from.
func cpBothWays(t *testing.T, env []string, name, path string, size int, where string) ([]byte, string) {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	local := filepath.Join(t.TempDir(), "data.bin")
	os.WriteFile(local, data, 0o644)
	cli(t, env, "sandbox", "cp", local, name+":"+path).ok(t, "cp in"+where)
	back := filepath.Join(t.TempDir(), "back.bin")
	cli(t, env, "sandbox", "cp", name+":"+path, back).ok(t, "cp out"+where)
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Errorf("the file came back different%s (%d bytes, want %d)", where, len(got), len(data))
	}
	return data, local
}

func lastLine(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[len(f)-1]
}

func firstLine(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// startCounter starts cfg (a counter printing 1, 2, … a line at a time)
// with tag, reads until it has printed 5, and leaves it running with no
// stream attached; it returns its PID and the last number read.
func startCounter(t *testing.T, e *client.Envd, cfg *pb.ProcessConfig, tag string) (uint32, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := e.Process.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: cfg, Tag: &tag}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("start: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	last := 0
	for last < 5 && st.Receive() {
		fmt.Sscan(lastLine(string(st.Msg().GetEvent().GetData().GetStdout())), &last)
	}
	if last < 5 {
		t.Fatalf("the counter printed %d: %v", last, st.Err())
	}
	return pid, last
}

// connectCounter attaches to the counter tagged tag and returns the
// first number it prints.
func connectCounter(t *testing.T, e *client.Envd, tag string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := e.Process.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	next := 0
	for next == 0 && cs.Receive() {
		fmt.Sscan(firstLine(string(cs.Msg().GetEvent().GetData().GetStdout())), &next)
	}
	if next == 0 {
		t.Fatalf("connect to %s: no output (%v)", tag, cs.Err())
	}
	return next
}

// TestDaemonKilledMidCommand: sandstormd killed with SIGKILL while a
// command streams leaves no process of its own behind (no runsc exec, no
// forwarder), and after the restart the sandbox answers, the command — in
// the sandbox, which ran on — is still there to reconnect to, and a new
// command runs. In both envd modes: exec'd on first use, and as init.
func TestDaemonKilledMidCommand(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	tp := api.TemplateRequest{Name: "webi", RootfsDir: webRootfs, Process: api.Process{Args: webDemo.Args, Env: webDemo.Env, Envd: &api.Envd{}}, Ports: webDemo.Ports}
	if _, err := d.C.CreateTemplate(ctxT(t), tp); err != nil {
		t.Fatal(err)
	}
	counter := &pb.ProcessConfig{Cmd: py, Args: []string{"-u", "-c", "import time\nn=0\nwhile True:\n n+=1; print(n); time.sleep(0.05)"}}
	ids := map[string]string{}
	before := map[string]map[int]string{}
	for _, name := range []string{"exec", "init"} {
		tmpl := map[string]string{"exec": "web", "init": "webi"}[name]
		sb := d.create(t, tmpl, "k-"+name)
		ids[name] = sb.ID
		before[name] = processesMentioning(sb.ID)
		// A command streaming when the daemon dies.
		e := d.C.Envd(sb.ID, "")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := e.Process.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: counter, Tag: &name}))
		if err != nil {
			t.Fatal(err)
		}
		if !st.Receive() || !st.Receive() {
			t.Fatalf("%s: the command did not start streaming: %v", name, st.Err())
		}
		defer st.Close()
	}
	d.Kill(t)
	for name, id := range ids {
		for pid, cl := range processesMentioning(id) {
			if _, ok := before[name][pid]; !ok {
				t.Errorf("%s: after sandstormd's SIGKILL, process %d is left: %.200s", name, pid, cl)
			}
		}
	}
	d.Start(t)
	for name, id := range ids {
		expectCount(t, endpoint(t, d.get(t, id)), 1, name+": its process after the restart")
		e := d.C.Envd(id, "")
		if next := connectCounter(t, e, name); next < 2 {
			t.Errorf("%s: reconnected, the command printed %d", name, next)
		}
		env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
		cli(t, env, "sandbox", "exec", id, "--", py, "-c", "print('after')").ok(t, name+": a command after the restart", `^after\n$`)
	}
}

// TestExecInFleet: commands and files reach a sandbox on a paired node,
// through the seam (mutual TLS to the node, streamed both ways): output,
// exit status, stdin, a file each way, and a command left running
// reconnected to.
func TestExecInFleet(t *testing.T) {
	far := fleetMachine(t, 9, "--memory-reserve", "0")
	m := startDaemon(t, masterOnly)
	if r := m.raw(t, "POST", "/v1/nodes", m.Token, "application/json", strings.NewReader(fmt.Sprintf(`{"address": %q, "pairing_code": %q}`, far.listen, far.code()))); r.Status != http.StatusCreated {
		t.Fatalf("pair %s: HTTP %d %s", far.name, r.Status, r.Body)
	}
	m.registerWeb(t, "web")
	sb := m.create(t, "web", "far-ex")
	// Run before the node's own cleanup: the master lets go of the node
	// while its namespace is still there.
	t.Cleanup(func() {
		m.C.Do(context.Background(), "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
		m.raw(t, "DELETE", "/v1/nodes/"+far.name, m.Token, "", nil)
	})
	if sb.Node != far.name {
		t.Fatalf("the sandbox is on %s, want %s", sb.Node, far.name)
	}
	env := []string{"SANDSTORM_API=" + m.API, "SANDSTORM_DATA_DIR=" + m.DataDir, "SANDSTORM_TOKEN="}
	r := cli(t, env, "sandbox", "exec", "far-ex", "--", py, "-c", "import sys; print('on the node'); sys.exit(4)")
	if r.Code != 4 || r.Stdout != "on the node\n" {
		t.Errorf("exec on a paired node: exit %d stdout %q stderr %q", r.Code, r.Stdout, r.Stderr)
	}
	in := exec.Command(sandstormdBin, "sandbox", "exec", "far-ex", "-i", "--", py, "-c", "import sys; print(len(sys.stdin.read()))")
	in.Env = append(os.Environ(), env...)
	in.Stdin = strings.NewReader(strings.Repeat("x", 1<<20))
	if out, err := in.Output(); err != nil || string(out) != "1048576\n" {
		t.Errorf("exec -i of 1 MiB on a paired node: %q %v", out, err)
	}
	cpBothWays(t, env, "far-ex", "/work/d.bin", 2<<20, ", on a paired node")
	counter := &pb.ProcessConfig{Cmd: py, Args: []string{"-u", "-c", "import time\nn=0\nwhile True:\n n+=1; print(n); time.sleep(0.05)"}}
	e := m.C.Envd("far-ex", "")
	_, last := startCounter(t, e, counter, "far")
	if next := connectCounter(t, e, "far"); next <= last {
		t.Errorf("reconnected on the paired node, the command printed %d after %d", next, last)
	}
}

// TestEnvdUpgrade: a new envd binary (an upgrade of sandstormd) loses no
// sandbox's memory. A sandbox snapshotted with a command running under the
// old envd wakes after the restart with that command still counting, its
// bundle still mounting the old build; the warm image is made again with
// the new build, so new sandboxes get it; and once no sandbox mounts the
// old build, the next start removes it.
func TestEnvdUpgrade(t *testing.T) {
	d := startDaemon(t)
	warm := &api.Warm{Pool: 1, Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}}
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "webw", RootfsDir: webRootfs,
		Process: api.Process{Args: webDemo.Args, Env: webDemo.Env, Envd: &api.Envd{}}, Ports: webDemo.Ports, Warm: warm}); err != nil {
		t.Fatal(err)
	}
	counter := &pb.ProcessConfig{Cmd: py, Args: []string{"-u", "-c", "import time\nn=0\nwhile True:\n n+=1; print(n); time.sleep(0.05)"}}
	a := d.create(t, "webw", "up-a")
	_, last := startCounter(t, d.C.Envd(a.ID, ""), counter, "c")
	d.transition(t, a.ID, "snapshot", api.TierSnapshot)
	oldBuild := envdMountOf(t, d.sandboxDir(a.ID))

	// Another build: the same binary with bytes after its end (which an
	// ELF loader ignores), so another SHA-256.
	bin, err := os.ReadFile(filepath.Join(workDir, "sandstorm-envd"))
	if err != nil {
		t.Fatal(err)
	}
	newBin := filepath.Join(t.TempDir(), "sandstorm-envd")
	if err := os.WriteFile(newBin, append(bin, []byte("another build")...), 0o755); err != nil {
		t.Fatal(err)
	}
	d.Restart(t, "--envd", newBin)

	if next := connectCounter(t, d.C.Envd(a.ID, ""), "c"); next <= last {
		t.Errorf("after the upgrade, the command from before the snapshot printed %d (it had printed %d): its memory is lost", next, last)
	}
	if got := envdMountOf(t, d.sandboxDir(a.ID)); got != oldBuild {
		t.Errorf("the woken sandbox mounts %s, want the build its image was made with (%s)", got, oldBuild)
	}
	waitLog(t, d.LogPath, `msg="warm image made again" template=webw why="holds another envd build"`, 2*time.Minute)
	b := d.create(t, "webw", "up-b")
	if got := envdMountOf(t, d.sandboxDir(b.ID)); got == oldBuild || got == "" {
		t.Errorf("a sandbox made after the upgrade mounts %q, want the new build", got)
	}
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	cli(t, env, "sandbox", "exec", b.ID, "--", py, "-c", "print('new')").ok(t, "a command in a sandbox of the new build", `^new\n$`)

	d.deleteSandbox(t, a.ID)
	if _, err := os.Stat(oldBuild); err != nil {
		t.Fatalf("the old build went before the restart: %v", err)
	}
	d.Restart(t, "--envd", newBin)
	if _, err := os.Stat(oldBuild); !os.IsNotExist(err) {
		t.Errorf("the old build %s is kept with no sandbox mounting it (%v)", oldBuild, err)
	}
	cli(t, env, "sandbox", "exec", b.ID, "--", py, "-c", "print('still')").ok(t, "a command after the old build is removed", `^still\n$`)
}

// envdMountOf is the host directory a sandbox's bundle mounts envd from.
func envdMountOf(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "bundle", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Mounts []struct{ Destination, Source string }
	}
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Mounts {
		if m.Destination == "/.sandstorm" {
			return m.Source
		}
	}
	return ""
}
