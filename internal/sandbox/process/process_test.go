package process

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sandbox"

	"sandstorm/internal/sandbox/sandboxtest"
)

// These tests need root: they create network namespaces, veths, cgroups and
// mount namespaces for real. They use 10.195.0.0/16 (outside the 10.200-254 range the e2e daemons pick from) and namespaces and links
// named sst-*/vst-* that they delete again.

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests must run as root (they create namespaces and cgroups)")
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// testNet is a network namespace with a veth to the host: the host side has
// HostIP, eth0 inside has SandboxIP.
type testNet struct {
	Name      string // netns name; path /var/run/netns/<Name>
	Path      string
	SandboxIP string
}

// newTestNet creates a uniquely named netns with lo up and, if withVeth, a
// veth pair on a random /30 of 10.195.0.0/16. Cleanup deletes both.
func newTestNet(t *testing.T, withVeth bool) testNet {
	t.Helper()
	requireRoot(t)
	suffix := fmt.Sprintf("%d%04x", os.Getpid()%10000, rand.IntN(1<<16))
	n := testNet{Name: "sst-" + suffix, Path: "/var/run/netns/sst-" + suffix}
	run(t, "ip", "netns", "add", n.Name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.Name).Run() })
	run(t, "ip", "-n", n.Name, "link", "set", "lo", "up")
	if !withVeth {
		return n
	}
	host := "vst-" + suffix // ≤ 15 chars
	base := rand.IntN(1<<14) * 4
	hostIP := fmt.Sprintf("10.195.%d.%d", base/256, base%256+1)
	n.SandboxIP = fmt.Sprintf("10.195.%d.%d", base/256, base%256+2)
	run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", n.Name)
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	run(t, "ip", "addr", "add", hostIP+"/30", "dev", host)
	run(t, "ip", "link", "set", host, "up")
	run(t, "ip", "-n", n.Name, "addr", "add", n.SandboxIP+"/30", "dev", "eth0")
	run(t, "ip", "-n", n.Name, "link", "set", "eth0", "up")
	return n
}

// newBundle builds an OCI bundle whose rootfs holds the host's static
// busybox, a /www with index.html (content returned) and whose process is
// sh -c script.
func newBundle(t *testing.T, script string) (bundle, index string) {
	t.Helper()
	bundle = t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	sandboxtest.BusyboxRootfs(t, rootfs, []string{"bin", "proc", "dev", "tmp", "www"},
		[]string{"sh", "httpd", "hostname", "cat", "ls", "sleep", "echo", "id", "tr", "head", "wc", "true"})
	index = fmt.Sprintf("hello from %s\n", filepath.Base(bundle))
	if err := os.WriteFile(filepath.Join(rootfs, "www", "index.html"), []byte(index), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: "rootfs"},
		Hostname: "sbx-test",
		Process: &specs.Process{
			Args: []string{"/bin/sh", "-c", script},
			Env:  []string{"PATH=/bin", "GREETING=hi there"},
			Cwd:  "/www",
		},
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return bundle, index
}

// httpdScript records what the sandbox sees into /www, leaves a background
// child (to check nothing escapes Remove) and execs httpd as PID 1.
const httpdScript = `echo "container starting"
echo $$ > /www/pid
hostname > /www/hostname
echo "$GREETING" > /www/env
pwd > /www/cwd
if ls "$HOSTSECRET" > /dev/null 2>&1; then echo visible; else echo hidden; fi > /www/secret
ls /dev | tr '\n' ' ' > /www/dev
echo ok > /dev/null && head -c 8 /dev/urandom | wc -c > /www/urandom
sleep 1000 &
exec httpd -f -p 8000 -h /www`

func newSpec(t *testing.T, n testNet, bundle string) sandbox.Spec {
	return sandbox.Spec{
		ID:      fmt.Sprintf("t-%d-%x", os.Getpid()%100000, rand.Uint32()),
		Bundle:  bundle,
		Netns:   n.Path,
		LogPath: filepath.Join(t.TempDir(), "container.log"),
	}
}

// client never uses a proxy: the traffic must stay on the test's veth.
var client = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

func get(url string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), err
}

// getEventually retries until the server answers (httpd binds its port a
// moment after Start returns); the 15 s bound only keeps a broken test from
// hanging.
func getEventually(t *testing.T, url string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		body, err := get(url, 2*time.Second)
		if err == nil {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustState(t *testing.T, b *Backend, spec sandbox.Spec, want sandbox.State) {
	t.Helper()
	got, err := b.State(context.Background(), spec)
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	if got != want {
		t.Fatalf("State = %s, want %s", got, want)
	}
}

func cgroupPids(t *testing.T, dir string) []int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		p, _ := strconv.Atoi(f)
		pids = append(pids, p)
	}
	return pids
}

// nsPid returns the last NSpid entry of /proc/<pid>/status: the PID the
// process has in its own PID namespace.
func nsPid(t *testing.T, pid int) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			f := strings.Fields(rest)
			return f[len(f)-1]
		}
	}
	t.Fatal("no NSpid line")
	return ""
}

// checkGone fails unless the cgroup dir is gone and none of pids is a live
// process. Killed processes are reaped asynchronously (by this test's
// Wait goroutine or by init), so zombies count as gone.
func checkGone(t *testing.T, cg string, pids []int, starts map[int]uint64) {
	t.Helper()
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s still exists (stat: %v)", cg, err)
	}
	for _, p := range pids {
		if start, ok := starts[p]; ok && alive(p, start) {
			t.Errorf("process %d survived Remove", p)
		}
	}
}

// startTimes returns the start time of each of pids that still exists
// (httpd forks a short-lived child per connection, which may be gone).
func startTimes(pids []int) map[int]uint64 {
	m := map[int]uint64{}
	for _, p := range pids {
		if st, err := readProcStat(p); err == nil {
			m[p] = st.StartTime
		}
	}
	return m
}

func TestLifecycle(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newTestNet(t, true)
	bundle, index := newBundle(t, httpdScript)
	secret := filepath.Join(bundle, "host-secret")
	if err := os.WriteFile(secret, []byte("no"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Tell the script which host path to probe, via the spec env.
	var cfg specs.Spec
	data, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
	json.Unmarshal(data, &cfg)
	cfg.Process.Env = append(cfg.Process.Env, "HOSTSECRET="+secret)
	data, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644)

	stateDir := t.TempDir()
	b, err := New(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "process" {
		t.Errorf("Name = %q", b.Name())
	}
	spec := newSpec(t, n, bundle)
	t.Cleanup(func() { b.Remove(context.Background(), spec) })
	mustState(t, b, spec, sandbox.StateAbsent)

	hostname, _ := os.Hostname()
	t0 := time.Now()
	if err := b.Start(ctx, spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("Start took %v", time.Since(t0))
	mustState(t, b, spec, sandbox.StateRunning)
	if err := b.Start(ctx, spec); !errors.Is(err, os.ErrExist) {
		t.Errorf("second Start = %v, want ErrExist", err)
	}

	base := "http://" + n.SandboxIP + ":8000/"
	t0 = time.Now()
	if got := getEventually(t, base); got != index {
		t.Fatalf("GET / = %q, want %q", got, index)
	}
	t.Logf("first HTTP answer %v after Start returned", time.Since(t0))

	// What the sandbox saw of itself.
	for file, want := range map[string]string{
		"pid":      "1",        // PID namespace
		"hostname": "sbx-test", // UTS namespace
		"env":      "hi there", // spec env
		"cwd":      "/www",     // spec cwd
		"secret":   "hidden",   // chroot: host files are out of reach
		"dev":      "fd full null random shm stderr stdin stdout tty urandom zero",
		"urandom":  "8",
	} {
		if got := strings.TrimSpace(getEventually(t, base+file)); got != want {
			t.Errorf("inside the sandbox %s = %q, want %q", file, got, want)
		}
	}
	if h, _ := os.Hostname(); h != hostname {
		t.Errorf("host hostname changed from %q to %q", hostname, h)
	}

	rec, err := b.readRecord(spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := nsPid(t, rec.Pid); got != "1" {
		t.Errorf("recorded pid %d is PID %s in its namespace, want 1", rec.Pid, got)
	}
	pids := cgroupPids(t, rec.Cgroup)
	if len(pids) < 2 || !slices.Contains(pids, rec.Pid) {
		t.Errorf("cgroup.procs = %v, want httpd (%d) and its sleep child", pids, rec.Pid)
	}
	starts := startTimes(pids)
	if self, _ := os.ReadFile("/proc/self/cgroup"); strings.Contains(string(self), cgroupParent) {
		t.Errorf("the test process itself ended up in %s", self)
	}
	logData, _ := os.ReadFile(spec.LogPath)
	if !strings.Contains(string(logData), "container starting") {
		t.Errorf("log %s lacks the container's stdout: %q", spec.LogPath, logData)
	}

	// Pause: a request must not be answered.
	t0 = time.Now()
	if err := b.Pause(ctx, spec); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("Pause took %v", time.Since(t0))
	mustState(t, b, spec, sandbox.StatePaused)
	if err := b.Pause(ctx, spec); err != nil {
		t.Errorf("second Pause: %v", err)
	}
	if body, err := get(base, 500*time.Millisecond); err == nil {
		t.Fatalf("paused container answered %q", body)
	}

	t0 = time.Now()
	if err := b.Resume(ctx, spec); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	t.Logf("Resume took %v", time.Since(t0))
	mustState(t, b, spec, sandbox.StateRunning)
	if got := getEventually(t, base); got != index {
		t.Fatalf("after Resume GET / = %q", got)
	}

	if ids, err := b.List(ctx); err != nil || !slices.Contains(ids, spec.ID) {
		t.Errorf("List = %v, %v; want it to contain %s", ids, err, spec.ID)
	}

	// Remove a paused container: cgroup.kill must work on frozen tasks.
	if err := b.Pause(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := b.Remove(ctx, spec); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	t.Logf("Remove (paused) took %v", time.Since(t0))
	checkGone(t, rec.Cgroup, pids, starts)
	mustState(t, b, spec, sandbox.StateAbsent)
	if err := b.Remove(ctx, spec); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if ids, _ := b.List(ctx); slices.Contains(ids, spec.ID) {
		t.Errorf("List after Remove = %v", ids)
	}
	if err := b.Pause(ctx, spec); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Pause after Remove = %v, want ErrNotFound", err)
	}
}

// TestHelperDaemon is not a test: TestSurvivesDaemonDeath runs the test
// binary again with SANDSTORM_TEST_DAEMON set, and this plays a daemon that
// starts a container and is then SIGKILLed.
func TestHelperDaemon(t *testing.T) {
	arg := os.Getenv("SANDSTORM_TEST_DAEMON")
	if arg == "" {
		return
	}
	var req struct {
		StateDir string
		Spec     sandbox.Spec
	}
	if err := json.Unmarshal([]byte(arg), &req); err != nil {
		fmt.Println("bad request:", err)
		os.Exit(2)
	}
	b, err := New(req.StateDir)
	if err == nil {
		err = b.Start(context.Background(), req.Spec)
	}
	if err != nil {
		fmt.Println("start:", err)
		os.Exit(1)
	}
	fmt.Println("started")
	select {} // wait to be killed
}

func TestSurvivesDaemonDeathAndAdoption(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newTestNet(t, true)
	bundle, index := newBundle(t, httpdScript)
	stateDir := t.TempDir()
	spec := newSpec(t, n, bundle)

	req, _ := json.Marshal(map[string]any{"StateDir": stateDir, "Spec": spec})
	daemon := exec.Command(os.Args[0], "-test.run=^TestHelperDaemon$")
	daemon.Env = append(os.Environ(), "SANDSTORM_TEST_DAEMON="+string(req))
	out, err := daemon.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "started\n" {
		daemon.Process.Kill()
		daemon.Wait()
		t.Fatalf("helper daemon: %q", line)
	}
	// Adopt-and-remove also on failure paths below.
	t.Cleanup(func() {
		if b, err := New(stateDir); err == nil {
			b.Remove(context.Background(), spec)
		}
	})
	daemon.Process.Signal(syscall.SIGKILL)
	daemon.Wait()

	base := "http://" + n.SandboxIP + ":8000/"
	if got := getEventually(t, base); got != index {
		t.Fatalf("after the daemon died GET / = %q", got)
	}

	b2, err := New(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	mustState(t, b2, spec, sandbox.StateRunning)
	if ids, err := b2.List(ctx); err != nil || !slices.Equal(ids, []string{spec.ID}) {
		t.Fatalf("List = %v, %v; want [%s]", ids, err, spec.ID)
	}
	// The adopted container is fully controllable.
	if err := b2.Pause(ctx, spec); err != nil {
		t.Fatal(err)
	}
	mustState(t, b2, spec, sandbox.StatePaused)
	if err := b2.Resume(ctx, spec); err != nil {
		t.Fatal(err)
	}
	getEventually(t, base)

	rec, err := b2.readRecord(spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	pids := cgroupPids(t, rec.Cgroup)
	starts := startTimes(pids)
	if err := b2.Remove(ctx, spec); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	checkGone(t, rec.Cgroup, pids, starts)
	mustState(t, b2, spec, sandbox.StateAbsent)
}

func TestStoppedState(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newTestNet(t, false)
	bundle, _ := newBundle(t, "exec sleep 1000")
	b, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	spec := newSpec(t, n, bundle)
	t.Cleanup(func() { b.Remove(context.Background(), spec) })
	if err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	rec, err := b.readRecord(spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Killing PID 1 of the namespace ends the container.
	if err := syscall.Kill(rec.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := b.State(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if st == sandbox.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("State = %s after killing init, want stopped", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.Pause(ctx, spec); err == nil || errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Pause of a stopped container = %v, want a 'stopped' error", err)
	}
	if ids, _ := b.List(ctx); !slices.Contains(ids, spec.ID) {
		t.Errorf("List = %v, want the stopped %s", ids, spec.ID)
	}
	// A stopped container can be started again under the same ID.
	if err := b.Start(ctx, spec); err != nil {
		t.Fatalf("restart: %v", err)
	}
	mustState(t, b, spec, sandbox.StateRunning)
	if err := b.Remove(ctx, spec); err != nil {
		t.Fatal(err)
	}
	checkGone(t, rec.Cgroup, nil, nil)
	mustState(t, b, spec, sandbox.StateAbsent)
}

func TestStartFailureLeavesNothing(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newTestNet(t, false)
	b, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bundle, _ := newBundle(t, "true")
	cfgPath := filepath.Join(bundle, "config.json")
	var cfg specs.Spec
	data, _ := os.ReadFile(cfgPath)
	json.Unmarshal(data, &cfg)
	cfg.Process.Args = []string{"/bin/no-such-program"}
	data, _ = json.Marshal(cfg)
	os.WriteFile(cfgPath, data, 0o644)

	spec := newSpec(t, n, bundle)
	err = b.Start(ctx, spec)
	if err == nil {
		t.Fatal("Start of a missing program succeeded")
	}
	t.Logf("Start error: %v", err)
	if !strings.Contains(err.Error(), "no-such-program") {
		t.Errorf("error does not carry the log tail: %v", err)
	}
	mustState(t, b, spec, sandbox.StateAbsent)
	checkGone(t, b.cgroupDir(spec.ID), nil, nil)

	// A netns path that is not a namespace fails the same way.
	good, _ := newBundle(t, "exec sleep 1000")
	bad := spec
	bad.Bundle, bad.Netns = good, filepath.Join(t.TempDir(), "not-a-netns")
	os.WriteFile(bad.Netns, nil, 0o644)
	if err := b.Start(ctx, bad); err == nil {
		b.Remove(ctx, bad)
		t.Fatal("Start with a bogus netns succeeded")
	}
	mustState(t, b, bad, sandbox.StateAbsent)
	checkGone(t, b.cgroupDir(bad.ID), nil, nil)

	if err := b.Start(ctx, sandbox.Spec{ID: "../escape", Bundle: good, Netns: n.Path, LogPath: spec.LogPath}); err == nil {
		t.Error("Start accepted ID ../escape")
	}
}

func TestCheckpointNotSupported(t *testing.T) {
	requireRoot(t)
	b, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	caps := b.Capabilities()
	if !caps.Pause || caps.Checkpoint || caps.Why == "" {
		t.Errorf("Capabilities = %+v, want Pause, no Checkpoint and a reason", caps)
	}
	t.Logf("Why: %s", caps.Why)
	spec := sandbox.Spec{ID: "nope"}
	if err := b.Checkpoint(context.Background(), spec, t.TempDir()); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("Checkpoint = %v, want ErrNotSupported", err)
	}
	if err := b.Restore(context.Background(), spec, t.TempDir()); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("Restore = %v, want ErrNotSupported", err)
	}
}

func TestCgroup2FromMountinfo(t *testing.T) {
	const hybrid = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 30 0:33 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
`
	if got, ok := cgroup2FromMountinfo(strings.NewReader(hybrid)); !ok || got != "/sys/fs/cgroup/unified" {
		t.Errorf("hybrid: %q %v", got, ok)
	}
	const escaped = "40 30 0:37 / /mnt/my\\040cg rw - cgroup2 none rw\n"
	if got, ok := cgroup2FromMountinfo(strings.NewReader(escaped)); !ok || got != "/mnt/my cg" {
		t.Errorf("escaped: %q %v", got, ok)
	}
	if _, ok := cgroup2FromMountinfo(strings.NewReader("36 30 0:33 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n")); ok {
		t.Error("v1 only: found a cgroup2 mount")
	}
	mnt, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cgroup v2 at %s", mnt)
}

func TestSummarizeCRIU(t *testing.T) {
	// criu 3.17.1 on a Debian 12 VM with kernel 6.18.
	const out = `Error (criu/util.c:642): exited, status=1
Error (criu/util.c:642): exited, status=1
Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds
Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable
Error (criu/kerndat.c:1615): kerndat_vdso_fill_symtable failed when initializing kerndat.
Error (criu/crtools.c:260): Could not initialize kernel features detection.
`
	want := "vdso: Unexpected rt vDSO area bounds; vdso: Failed to fill self vdso symtable"
	if got := summarizeCRIU(out); got != want {
		t.Errorf("summarizeCRIU = %q, want %q", got, want)
	}
}
