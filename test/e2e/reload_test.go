package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// egressProbe runs beside the web demo's server in a sandbox: every 20 ms
// it sends a DNS query over UDP to its boundary (the resolver in its
// /etc/resolv.conf) and opens a TCP connection to the boundary's SOCKS5
// port and reads the method selection, logging each outcome and how long
// it took to /srv/egress.log (in the sandbox's volume, so the test reads
// it from the host; /tmp is a tmpfs). A connect that is refused or times out is "refused";
// one accepted and then reset is "reset" (a flow open across a reload is
// cut, as documented); a query with no answer in 30 s is "timeout".
const egressProbe = `
import errno, os, runpy, socket, struct, threading, time
def probe():
    ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
    q = struct.pack('>HHHHHH', 0x5353, 0x0100, 1, 0, 0, 0) + b'\x05probe\x07example\x00' + struct.pack('>HH', 1, 1)
    out = open('/srv/egress.log', 'a', buffering=1)
    while True:
        t = time.monotonic()
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(30)
            s.sendto(q, (ns, 53)); s.recvfrom(512); s.close(); r = 'ok'
        except socket.timeout:
            r = 'timeout'
        except Exception as e:
            r = 'error-' + type(e).__name__
        out.write('dns %.2f %s\n' % ((time.monotonic() - t) * 1000, r))
        t = time.monotonic()
        c = socket.socket(); c.settimeout(30)
        try:
            c.connect((ns, 1080))
            try:
                c.sendall(b'\x05\x01\x00'); r = 'ok' if c.recv(2) == b'\x05\x00' else 'reset'
            except (ConnectionResetError, BrokenPipeError):
                r = 'reset'
        except socket.timeout:
            r = 'timeout'
        except ConnectionRefusedError:
            r = 'refused'
        except Exception as e:
            r = 'error-' + type(e).__name__
        c.close()
        out.write('socks %.2f %s\n' % ((time.monotonic() - t) * 1000, r))
        time.sleep(0.02)
def guarded():
    try:
        probe()
    except Exception:
        import traceback; traceback.print_exc()
threading.Thread(target=guarded, daemon=True).start()
runpy.run_path('/srv/app.py', run_name='__main__')
`

// reload runs `sandstormd reload` for d (what ExecReload runs) and returns
// how long it took.
func (d *Daemon) reload(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	out, err := exec.Command(sandstormdBin, "reload", "--data-dir", d.DataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("sandstormd reload: %v: %s\nlog:\n%s", err, out, d.logTail(40))
	}
	return time.Since(start)
}

// ppid returns the parent of pid.
func ppid(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatalf("no PPid in /proc/%d/status", pid)
	return 0
}

// zombies lists pid's children that have exited and not been reaped.
func zombies(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			st, err := os.ReadFile("/proc/" + f + "/stat")
			if i := strings.LastIndexByte(string(st), ')'); err == nil && i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				n, _ := strconv.Atoi(f)
				out = append(out, n)
			}
		}
	}
	return out
}

// traffic is one client loop's record.
type traffic struct {
	name     string
	mu       sync.Mutex
	ok       int
	failures []string
	longest  time.Duration
}

func (tr *traffic) record(took time.Duration, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if err != nil {
		tr.failures = append(tr.failures, fmt.Sprintf("%s after %v", err, took.Round(time.Millisecond)))
		return
	}
	tr.ok++
	tr.longest = max(tr.longest, took)
}

// curlOnce runs curl with args (a new connection each time) and checks its
// exit status and, for HTTP, the status code.
func curlOnce(args []string, wantExit int, wantCode string) (time.Duration, error) {
	start := time.Now()
	base := []string{"-sS", "--max-time", "60", "-o", "/dev/null", "-w", "%{http_code}"}
	if !slices.Contains(args, "--proxy") {
		base = append(base, "--noproxy", "*") // no proxy from the environment
	}
	cmd := exec.Command("curl", append(base, args...)...)
	out, err := cmd.Output()
	took := time.Since(start)
	exit := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		exit = ee.ExitCode()
	} else if err != nil {
		return took, err
	}
	if exit != wantExit {
		return took, fmt.Errorf("curl %s: exit %d, want %d (%s)", strings.Join(args, " "), exit, wantExit, ee.Stderr)
	}
	if wantCode != "" && string(out) != wantCode {
		return took, fmt.Errorf("curl %s: HTTP %s, want %s", strings.Join(args, " "), out, wantCode)
	}
	return took, nil
}

// TestReloadUnderTraffic (issue 18 item 3): `sandstormd reload` re-executes
// the daemon in place under steady traffic — curl to a hot sandbox's port,
// to the Host-routed listener and to the API, SOCKS5 through a boundary's
// Unix socket, a keep-alive client, and a sandbox's own DNS and SOCKS5
// traffic to its boundary over its veth — and no connection is refused or
// lost; sandboxes in every tier are adopted (snapshotted and frozen ones
// woken through connections that arrived during the reload, their memory
// intact); the PID stays the same, and sandstormd stays the parent and
// reaper of its sandboxes.
func TestReloadUnderTraffic(t *testing.T) {
	hostListen := testenv.FreeAddr(t)
	d := startDaemon(t, "--gateway-host-listen", hostListen)
	d.registerWeb(t, "web")
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{
		Name: "egress", RootfsDir: webRootfs, Ports: webDemo.Ports,
		Process: api.Process{Args: []string{"/usr/bin/python3", "-c", egressProbe}, Env: webDemo.Env},
	}); err != nil {
		t.Fatal(err)
	}
	hot := d.create(t, "web", "hot")
	byHost := d.create(t, "web", "byhost")
	snap := d.create(t, "web", "snap")
	frozen := d.create(t, "web", "frozen")
	det := d.create(t, "web", "det")
	eg := d.create(t, "egress", "eg")
	pid := d.cmd.Process.Pid
	if p := ppid(t, d.sandboxPid(t, hot.ID)); p != pid {
		t.Fatalf("hot's runsc sandbox has parent %d, want sandstormd (%d), its subreaper", p, pid)
	}
	count := map[string]int{}
	for _, sb := range []api.Sandbox{snap, frozen, det} {
		count[sb.ID] = getCount(t, endpoint(t, sb))
	}
	d.transition(t, snap.ID, "snapshot", api.TierSnapshot)
	d.transition(t, frozen.ID, "freeze", api.TierFrozen)
	d.transition(t, det.ID, "detach", api.TierDetached)

	hostURL := fmt.Sprintf("http://8000-byhost.sandbox.localhost:%s/", strings.Split(hostListen, ":")[1])
	_, hostPort, _ := net.SplitHostPort(hostListen)
	sock := filepath.Join(d.sandboxDir(hot.ID), "agent.sock")
	loops := []struct {
		tr  *traffic
		run func() (time.Duration, error)
	}{
		{&traffic{name: "curl to a hot sandbox's gateway port"}, func() (time.Duration, error) {
			return curlOnce([]string{endpoint(t, hot) + "/"}, 0, "200")
		}},
		{&traffic{name: "curl to the Host-routed listener"}, func() (time.Duration, error) {
			return curlOnce([]string{"--resolve", "8000-byhost.sandbox.localhost:" + hostPort + ":127.0.0.1", hostURL}, 0, "200")
		}},
		{&traffic{name: "curl to the API"}, func() (time.Duration, error) {
			return curlOnce([]string{"--cacert", filepath.Join(d.DataDir, "pki", "ca.pem"), "-H", "Authorization: Bearer " + d.Token, d.API + "/v1/node"}, 0, "200")
		}},
		// The boundary answers SOCKS5 and refuses the name by policy:
		// curl exit 97. A refused connect to the socket would be exit 7.
		{&traffic{name: "curl through a boundary's agent.sock"}, func() (time.Duration, error) {
			return curlOnce([]string{"--proxy", "socks5h://localhost" + sock, "http://example.com/"}, 97, "")
		}},
	}
	// A keep-alive client: Go's transport, as most HTTP clients, sends a
	// request again on a new connection when its kept one turns out
	// closed before it wrote anything (RFC 9112 §9.3.1); a reload closes
	// idle kept connections and ends each in-flight one after its
	// answer, with Connection: close.
	kept := &traffic{name: "Go keep-alive client to a hot sandbox"}
	keptClient := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 60 * time.Second}
	defer keptClient.CloseIdleConnections()
	loops = append(loops, struct {
		tr  *traffic
		run func() (time.Duration, error)
	}{kept, func() (time.Duration, error) {
		start := time.Now()
		resp, err := keptClient.Get(endpoint(t, hot) + "/")
		if err != nil {
			return time.Since(start), err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && (resp.StatusCode != 200 || !strings.HasPrefix(string(body), "count=")) {
			err = fmt.Errorf("HTTP %d %q", resp.StatusCode, body)
		}
		return time.Since(start), err
	}})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l.tr.record(l.run())
			}
		}()
	}
	stopLoops := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoops()
	waitOK := func(n int) {
		for _, l := range loops {
			testenv.WaitFor(t, 60*time.Second, l.tr.name+" answered", func() bool {
				l.tr.mu.Lock()
				defer l.tr.mu.Unlock()
				return l.tr.ok >= n || len(l.tr.failures) > 0
			})
		}
	}
	waitOK(3)

	// Round 1: a reload with no traffic to the sandboxes in the other
	// tiers: each is adopted in its tier, then answers with its memory.
	took := d.reload(t)
	t.Logf("reload 1 took %v (the CLI, SIGHUP to serving)", took.Round(time.Millisecond))
	for _, c := range []struct {
		sb   api.Sandbox
		tier api.Tier
	}{{hot, api.TierHot}, {byHost, api.TierHot}, {eg, api.TierHot}, {snap, api.TierSnapshot}, {frozen, api.TierFrozen}, {det, api.TierDetached}} {
		if got := d.get(t, c.sb.ID); got.Tier != c.tier {
			t.Errorf("after the reload %s is %s, want %s (adopted in its tier)", c.sb.Name, got.Tier, c.tier)
		}
	}
	count[det.ID] = 0 // detached: a cold start
	for _, sb := range []api.Sandbox{snap, frozen, det} {
		count[sb.ID]++
		expectCount(t, endpoint(t, sb), count[sb.ID], sb.Name+" woken after the reload")
	}

	// Rounds 2 and 3: the snapshotted and frozen sandboxes are called
	// while the reload runs: connections that arrive during it wait, then
	// wake them.
	for round := 2; round <= 3; round++ {
		d.transition(t, snap.ID, "snapshot", api.TierSnapshot)
		d.transition(t, frozen.ID, "freeze", api.TierFrozen)
		paused := strings.Count(readFileString(t, d.LogPath), "reload: listeners paused")
		done := make(chan error, 1)
		go func() {
			out, err := exec.Command(sandstormdBin, "reload", "--data-dir", d.DataDir).CombinedOutput()
			if err != nil {
				err = fmt.Errorf("%v: %s", err, out)
			}
			done <- err
		}()
		// Call as soon as the daemon has paused its listeners.
		testenv.WaitFor(t, 60*time.Second, "the reload paused the listeners", func() bool {
			return strings.Count(readFileString(t, d.LogPath), "reload: listeners paused") > paused
		})
		var bwg sync.WaitGroup
		burst := &traffic{name: fmt.Sprintf("round %d: calls to snapshotted and frozen sandboxes during the reload", round)}
		for _, sb := range []api.Sandbox{snap, frozen} {
			for range 3 {
				bwg.Add(1)
				go func() {
					defer bwg.Done()
					burst.record(curlOnce([]string{endpoint(t, sb) + "/"}, 0, "200"))
				}()
			}
		}
		bwg.Wait()
		if err := <-done; err != nil {
			t.Fatalf("round %d: sandstormd reload: %v\nlog:\n%s", round, err, d.logTail(40))
		}
		if len(burst.failures) > 0 {
			t.Errorf("%s: %d failed: %v", burst.name, len(burst.failures), burst.failures)
		}
		t.Logf("%s: %d answered, longest %v", burst.name, burst.ok, burst.longest.Round(time.Millisecond))
		for _, sb := range []api.Sandbox{snap, frozen} {
			count[sb.ID] += 3
			expectCount(t, endpoint(t, sb), count[sb.ID]+1, sb.Name+": its memory after the calls during the reload")
			count[sb.ID]++
		}
	}
	waitOK(10)
	stopLoops()
	for _, l := range loops {
		if len(l.tr.failures) > 0 {
			t.Errorf("%s: %d of %d failed: %v", l.tr.name, len(l.tr.failures), l.tr.ok+len(l.tr.failures), l.tr.failures)
		}
		t.Logf("%s: %d answered across 3 reloads, longest %v", l.tr.name, l.tr.ok, l.tr.longest.Round(time.Millisecond))
	}

	// The sandbox's own egress: every query answered and every connection
	// to its boundary accepted; only a flow open at the moment of a reload
	// may be reset.
	logPath := filepath.Join(d.sandboxDir(eg.ID), "upper", "srv", "egress.log")
	if _, err := os.Stat(logPath); err != nil {
		t.Fatalf("the egress probe wrote nothing (%v); its console:\n%s", err, d.logs(t, eg.ID))
	}
	log := readFileString(t, logPath)
	outcomes := map[string]int{}
	var longest float64
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		outcomes[f[0]+" "+f[2]]++
		if ms, _ := strconv.ParseFloat(f[1], 64); f[2] == "ok" {
			longest = max(longest, ms)
		}
	}
	t.Logf("the sandbox's egress to its boundary: %v; longest answered %.1f ms", outcomes, longest)
	if outcomes["dns ok"] < 10 || outcomes["socks ok"] < 10 {
		t.Errorf("the egress probe ran too little: %v", outcomes)
	}
	for k, n := range outcomes {
		if !strings.HasSuffix(k, " ok") && k != "socks reset" {
			t.Errorf("the sandbox's egress: %d × %q (only ok, or a reset of a flow open across a reload, are expected)", n, k)
		}
	}

	// The same process throughout, still the sandboxes' parent and reaper.
	if d.cmd.Process.Pid != pid || !d.running() {
		t.Fatalf("sandstormd is not the process it was (%d)", pid)
	}
	if r := readFileString(t, filepath.Join(d.DataDir, "sandstormd.pid")); strings.TrimSpace(r) != strconv.Itoa(pid) {
		t.Fatalf("pid file says %q, want %d", r, pid)
	}
	if p := ppid(t, d.sandboxPid(t, hot.ID)); p != pid {
		t.Fatalf("after the reloads hot's runsc sandbox has parent %d, want %d", p, pid)
	}
	late := d.create(t, "web", "late")
	if p := ppid(t, d.sandboxPid(t, late.ID)); p != pid {
		t.Fatalf("a sandbox created after the reloads has parent %d, want sandstormd (%d): it is no longer the subreaper", p, pid)
	}
	d.transition(t, late.ID, "snapshot", api.TierSnapshot)
	testenv.WaitFor(t, 30*time.Second, "the checkpointed sandbox's processes reaped", func() bool { return len(zombies(pid)) == 0 })
}

func readFileString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReloadRefusesABinaryThatCannotTakeOver: a binary at sandstormd's
// path that does not speak the handoff protocol (an older sandstormd, or
// something else) is not executed: the reload is refused with the reason,
// and the daemon serves on as it was.
func TestReloadRefusesABinaryThatCannotTakeOver(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandstormd")
	copyExec(t, sandstormdBin, bin)
	os.Symlink(runscBin, filepath.Join(dir, "runsc"))
	d := startDaemon(t, binaryFlag+bin)
	d.registerWeb(t, "web")
	sb := d.create(t, "web", "one")
	n := getCount(t, endpoint(t, sb))
	pid := d.cmd.Process.Pid
	before := exeInode(t, pid)
	// An "upgrade" to a binary that speaks another protocol, put in place
	// as install(1) does: a new file renamed over the path (the running
	// one's inode is then "(deleted)" in /proc/<pid>/exe).
	spare := filepath.Join(dir, "sandstormd.spare")
	copyExec(t, sandstormdBin, spare)
	if err := os.WriteFile(bin+".tmp", []byte("#!/bin/sh\necho 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(spare, "reload", "--data-dir", d.DataDir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refused the reload") || !strings.Contains(string(out), `speaks handoff protocol "0"`) {
		t.Fatalf("reload onto an incompatible binary: %v: %s", err, out)
	}
	if !d.running() || d.cmd.Process.Pid != pid || exeInode(t, pid) != before {
		t.Fatal("the daemon did not serve on as it was after a refused reload")
	}
	expectCount(t, endpoint(t, sb), n+1, "after a refused reload")
	// A real upgrade: a sandstormd renamed over the path. The reload runs
	// it, in the same process.
	if err := os.Rename(spare, bin); err != nil {
		t.Fatal(err)
	}
	want, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	d.reload(t)
	if got := exeInode(t, pid); got != want.Sys().(*syscall.Stat_t).Ino {
		t.Fatalf("after the reload process %d runs inode %d, want the new binary's %d", pid, got, want.Sys().(*syscall.Stat_t).Ino)
	}
	expectCount(t, endpoint(t, sb), n+2, "after the upgrade")
}

// exeInode is the inode of the file process pid runs.
func exeInode(t *testing.T, pid int) uint64 {
	t.Helper()
	fi, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func copyExec(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
