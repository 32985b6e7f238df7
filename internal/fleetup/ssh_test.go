package fleetup

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/internal/testenv"
)

// The remote scripts run here in sh, as ssh runs them on a host (sh -s,
// the script on stdin): the same quoting, the same commands.

func runScript(t *testing.T, script string) (string, string, error) {
	t.Helper()
	cmd := exec.Command("sh", "-s")
	var out, errb strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(script), &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// testLayout is a remote dir with a quote in its parent (t.TempDir's),
// which CheckRemoteDir would refuse but the scripts must survive anyway.
func testLayout(t *testing.T) layout {
	base := filepath.Join(t.TempDir(), "it's")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return layout{Dir: filepath.Join(base, "remote"), Node: "10-0-0-5"}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && len(b) > 0
}

// TestStartStopScripts: the start script runs its command detached and
// prints the PID of the command itself; inspect sees it running; stop
// stops that PID and, with purge, removes the node's files and, once no
// other PID file is left, bin/ and the dir.
func TestStartStopScripts(t *testing.T) {
	l := testLayout(t)
	if _, errs, err := runScript(t, inspectScript(l, "")); err != nil {
		t.Fatalf("inspect: %v %s", err, errs)
	}
	if fi, err := os.Stat(l.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("inspect made %s: %v %v", l.Dir, fi, err)
	}
	// Something that runs until stopped, with the data dir as an argument
	// of its own, as sandstormd serve --data-dir has.
	args := []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done", l.dataDir()}
	out, errs, err := runScript(t, startScript(l, args))
	if err != nil {
		t.Fatalf("start: %v %s", err, errs)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("start printed %q", out)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	cl, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if !strings.Contains(string(cl), l.dataDir()) {
		t.Fatalf("PID %d is %q, not the command started", pid, cl)
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("the node is not in a session of its own: sid %d", sid)
	}
	out, _, _ = runScript(t, inspectScript(l, ""))
	if kv := keyValues(out); kv["running"] != strconv.Itoa(pid) {
		t.Errorf("inspect with the node running: %q", out)
	}
	if _, errs, err := runScript(t, startScript(l, args)); err == nil || !strings.Contains(errs, "already runs") {
		t.Errorf("a second start: %v %s", err, errs)
	}

	// Binaries in bin/, as the install leaves them, and another node's
	// PID file: purge keeps bin/ for it.
	os.MkdirAll(filepath.Join(l.Dir, "bin"), 0o755)
	os.WriteFile(l.bin(), []byte("x"), 0o755)
	os.WriteFile(l.envd(), []byte("x"), 0o755)
	os.WriteFile(l.runsc(), []byte("x"), 0o755)
	os.WriteFile(l.samNode(), []byte("x"), 0o755)
	os.MkdirAll(l.dataDir(), 0o700)
	other := filepath.Join(l.Dir, "other.pid")
	os.WriteFile(other, []byte("1\n"), 0o600)
	out, errs, err = runScript(t, stopScript(l, pid, true, true))
	if err != nil || !strings.Contains(out, "stopped") || !strings.Contains(out, "purged") {
		t.Fatalf("stop: %v %q %s", err, out, errs)
	}
	if alive(pid) {
		t.Errorf("PID %d still runs after stop", pid)
	}
	for _, p := range []string{l.pidFile(), l.dataDir(), l.log()} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left after purge", p)
		}
	}
	if _, err := os.Stat(l.bin()); err != nil {
		t.Errorf("bin/ removed while another node's PID file is there: %v", err)
	}
	os.Remove(other)
	out, _, err = runScript(t, stopScript(l, pid, true, false))
	if err != nil || !strings.Contains(out, "gone") {
		t.Errorf("a second stop: %v %q", err, out)
	}
	if _, err := os.Stat(l.bin()); err == nil {
		t.Error("purge with no PID file left kept bin/sandstormd")
	}
	if _, err := os.Stat(l.envd()); err == nil {
		t.Error("purge with no PID file left kept bin/sandstorm-envd")
	}
	if _, err := os.Stat(l.samNode()); err == nil {
		t.Error("purge with no PID file left kept bin/sam-node")
	}
	if _, err := os.Stat(l.runsc()); err != nil {
		t.Error("purge removed a runsc fleet up had not put there")
	}
}

// TestStopScriptSparesAnotherProcess: a PID that is not this node's now
// (its command line does not name the data dir) is never signalled.
func TestStopScriptSparesAnotherProcess(t *testing.T) {
	l := testLayout(t)
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out, errs, err := runScript(t, stopScript(l, cmd.Process.Pid, false, true))
	if err != nil || !strings.Contains(out, "gone") {
		t.Errorf("stop: %v %q %s", err, out, errs)
	}
	if !alive(cmd.Process.Pid) {
		t.Error("stop signalled a process that is not the node")
	}
}

func TestStopScriptWithoutPurgeKeepsData(t *testing.T) {
	l := testLayout(t)
	os.MkdirAll(l.dataDir(), 0o700)
	os.WriteFile(l.log(), []byte("log"), 0o600)
	if out, errs, err := runScript(t, stopScript(l, 999999999, false, true)); err != nil || strings.Contains(out, "purged") {
		t.Fatalf("stop: %v %q %s", err, out, errs)
	}
	for _, p := range []string{l.dataDir(), l.log()} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed without purge", p)
		}
	}
}

// TestCodeScript: it waits for the code file while the node runs, prints
// the code, and says at once when the node has exited.
func TestCodeScript(t *testing.T) {
	l := testLayout(t)
	os.MkdirAll(l.Dir, 0o700)
	cmd := exec.Command("sh", "-c", "while :; do sleep 0.05; done", l.dataDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	done := make(chan struct{})
	var out, errs string
	var err error
	go func() { out, errs, err = runScript(t, codeScript(l, cmd.Process.Pid)); close(done) }()
	os.MkdirAll(filepath.Dir(l.codeFile()), 0o700)
	os.WriteFile(l.codeFile(), []byte("abcd-efgh\n"), 0o600)
	testenv.Within(t, done, 20*time.Second, "the code script did not see the code")
	if err != nil || strings.TrimSpace(out) != "abcd-efgh" {
		t.Errorf("code: %v %q %s", err, out, errs)
	}
	cmd.Process.Kill()
	cmd.Wait()
	os.Remove(l.codeFile())
	os.WriteFile(l.log(), []byte("boom: the last words\n"), 0o600)
	out, errs, err = runScript(t, codeScript(l, cmd.Process.Pid))
	if err == nil || out != "" || !strings.Contains(errs, "exited") || !strings.Contains(errs, "boom: the last words") {
		t.Errorf("code of an exited node: %v %q %s", err, out, errs)
	}
}

// TestInstallScript: staged files land in bin/ executable and root's
// (a stage under sudo is the login user's), the stage is gone, and a copy
// whose sha256 is not the local one's is refused.
func TestInstallScript(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root; this test must run there")
		}
		t.Skip("the install script runs as root on a host (it makes the binaries root's)")
	}
	l := testLayout(t)
	stage := filepath.Join(t.TempDir(), "stage")
	os.MkdirAll(stage, 0o700)
	os.WriteFile(filepath.Join(stage, "sandstormd"), []byte("binary"), 0o600)
	os.Chown(filepath.Join(stage, "sandstormd"), 65534, 65534) // a login user's copy
	sum := sha256.Sum256([]byte("binary"))
	if _, errs, err := runScript(t, installScript(l, stage, []staged{{"sandstormd", hex.EncodeToString(sum[:])}})); err != nil {
		t.Fatalf("install: %v %s", err, errs)
	}
	if fi, err := os.Stat(l.bin()); err != nil || fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("installed: %v %v (want mode 0755, root's)", fi, err)
	}
	if _, err := os.Stat(stage); err == nil {
		t.Error("the stage is left")
	}
	out, _, _ := runScript(t, inspectScript(l, ""))
	if kv := keyValues(out); kv["sandstormd"] != hex.EncodeToString(sum[:]) || kv["runsc"] != "" {
		t.Errorf("inspect after install: %q", out)
	}
	os.MkdirAll(stage, 0o700)
	os.WriteFile(filepath.Join(stage, "runsc"), []byte("truncated"), 0o600)
	if _, errs, err := runScript(t, installScript(l, stage, []staged{{"runsc", hex.EncodeToString(sum[:])}})); err == nil || !strings.Contains(errs, "differs") {
		t.Errorf("a corrupt copy: %v %s", err, errs)
	}
	if _, err := os.Stat(l.runsc()); err == nil {
		t.Error("a corrupt copy was installed")
	}
}

// TestInspectRemoteRunsc: with --remote-runsc, inspect reports that
// runsc's version, or that it is missing, instead of a sum of bin/runsc.
func TestInspectRemoteRunsc(t *testing.T) {
	l := testLayout(t)
	runsc := filepath.Join(t.TempDir(), "runsc")
	os.WriteFile(runsc, []byte("#!/bin/sh\necho 'runsc version gvisor.dev/gvisor@v1'\necho 'spec: 1'\n"), 0o755)
	out, errs, err := runScript(t, inspectScript(l, runsc))
	if kv := keyValues(out); err != nil || kv["runsc_version"] != "runsc version gvisor.dev/gvisor@v1" || kv["runsc_missing"] != "" {
		t.Errorf("inspect with a runsc there: %v %q %s", err, out, errs)
	}
	out, _, _ = runScript(t, inspectScript(l, runsc+"-not-there"))
	if kv := keyValues(out); kv["runsc_missing"] != "1" {
		t.Errorf("inspect with no runsc there: %q", out)
	}
}

// fakeSamNode puts in l's bin/ a sam-node that, as "join", writes its
// arguments and what it read on stdin beside bin/ and makes a credential
// (or fails, with fail), and otherwise says it joined the mesh and runs
// until stopped.
func fakeSamNode(t *testing.T, l layout, fail bool) {
	t.Helper()
	os.MkdirAll(filepath.Join(l.Dir, "bin"), 0o755)
	join := `printf '%s\n' "$@" >"$out/join-args"; cat >"$out/join-stdin"; mkdir -p "$dir"; echo '{}' >"$dir/credential.json"; printf '{"name":"x","control_plane_url":"%s","control_plane_name":"sam"}' "$3" >"$dir/member.json"; echo "joined the mesh as x"`
	if fail {
		join = `cat >/dev/null; echo "enrol x with https://10.0.0.1:7600: dial tcp 10.0.0.1:7600: i/o timeout" >&2; exit 1`
	}
	script := "#!/bin/sh\nout=" + shQuote(l.Dir) + "\ndir=" + shQuote(l.meshDir()) + "\n" +
		"if [ \"$1\" = join ]; then " + join + "; exit 0; fi\n" +
		"echo 'sam-node: joined the mesh'\ntrap 'exit 0' TERM\nwhile :; do sleep 0.05; done\n"
	if err := os.WriteFile(l.samNode(), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestSamNodeScript: the script enrols the sam-node with the token on
// sam-node join's stdin — never in its arguments, nor in what the script
// prints — and the control plane's CA in its mesh dir, then starts it
// detached and prints its PID and where its log began; inspect then sees
// it running and a member of the control plane of that CA; stop stops it
// and, with purge, removes its files. A second start while it runs is
// refused; a failed join says what the host must reach.
func TestSamNodeScript(t *testing.T) {
	l := testLayout(t)
	if _, errs, err := runScript(t, inspectScript(l, "")); err != nil {
		t.Fatalf("inspect: %v %s", err, errs)
	}
	fakeSamNode(t, l, false)
	os.WriteFile(l.meshLog(), []byte("an earlier run: sam-node: joined the mesh\n"), 0o600)
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	const token = "samb_AbC-12_xyz"
	join := &meshJoin{URL: "https://10.0.0.1:7600", Name: "10-0-0-5", Token: token, CA: ca, Hint: "(reach 10.0.0.1 on 7600)"}
	args := []string{l.samNode(), "--mesh-dir", l.meshDir(), "--listen", "unix://" + l.meshSocket()}
	script, err := samNodeScript(l, join, args)
	if err != nil {
		t.Fatal(err)
	}
	out, errs, err := runScript(t, script)
	if err != nil {
		t.Fatalf("start: %v %q %s", err, out, errs)
	}
	kv := keyValues(out)
	pid, err := strconv.Atoi(kv["pid"])
	if err != nil {
		t.Fatalf("start printed %q", out)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if strings.Contains(out, token) || strings.Contains(errs, token) {
		t.Errorf("the script printed the token: %q %q", out, errs)
	}
	jargs, _ := os.ReadFile(filepath.Join(l.Dir, "join-args"))
	stdin, _ := os.ReadFile(filepath.Join(l.Dir, "join-stdin"))
	if strings.Contains(string(jargs), token) || !strings.Contains(string(jargs), "--token-file\n-\n") || !strings.Contains(string(jargs), "--control-plane\nhttps://10.0.0.1:7600\n") {
		t.Errorf("join's arguments: %q", jargs)
	}
	if string(stdin) != token+"\n" {
		t.Errorf("join read %q on stdin, want the token", stdin)
	}
	if b, err := os.ReadFile(l.meshDir() + "/control-plane-ca.pem"); err != nil || string(b) != string(ca) {
		t.Errorf("the CA in the mesh dir: %q %v", b, err)
	}
	if fi, err := os.Stat(l.meshDir()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the mesh dir: %v %v", fi, err)
	}
	if off, _ := strconv.Atoi(kv["log_offset"]); off != len("an earlier run: sam-node: joined the mesh\n") {
		t.Errorf("log_offset %q, want the log's size before the start", kv["log_offset"])
	}
	cl, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if !strings.Contains(string(cl), l.meshDir()) {
		t.Fatalf("PID %d is %q, not the sam-node started", pid, cl)
	}
	if _, errs, err := runScript(t, meshWaitScript(l, pid, int64(len("an earlier run: sam-node: joined the mesh\n")))); err != nil {
		t.Errorf("wait for the join: %v %s", err, errs)
	}
	sum := sha256.Sum256(ca)
	out, _, _ = runScript(t, inspectScript(l, ""))
	kv = keyValues(out)
	if kv["mesh_running"] != strconv.Itoa(pid) || kv["mesh_member"] != "1" || kv["mesh_ca"] != hex.EncodeToString(sum[:]) || kv["mesh_url"] != "https://10.0.0.1:7600" {
		t.Errorf("inspect with the sam-node running: %q", out)
	}
	if j, err := meshJoinNeeded(kv, hex.EncodeToString(sum[:]), "https://10.0.0.1:7600", Host{Spec: "h"}, l); j || err != nil {
		t.Errorf("after the join, join again? %v %v", j, err)
	}
	// Running: a second start is refused before any join.
	os.Remove(filepath.Join(l.Dir, "join-args"))
	script, _ = samNodeScript(l, join, args)
	if _, errs, err := runScript(t, script); err == nil || !strings.Contains(errs, "already runs") {
		t.Errorf("a second start: %v %s", err, errs)
	}
	if _, err := os.Stat(filepath.Join(l.Dir, "join-args")); err == nil {
		t.Error("a second start joined before it saw the sam-node running")
	}

	// Stopped, its files kept; then purged.
	out, errs, err = runScript(t, stopMeshScript(l, pid, false))
	if err != nil || !strings.Contains(out, "mesh_stopped") || strings.Contains(out, "purged") {
		t.Fatalf("stop: %v %q %s", err, out, errs)
	}
	if alive(pid) {
		t.Errorf("PID %d still runs after stop", pid)
	}
	if _, err := os.Stat(l.meshPIDFile()); err == nil {
		t.Error("the PID file is left after stop")
	}
	if _, err := os.Stat(l.meshDir() + "/credential.json"); err != nil {
		t.Errorf("stop without purge removed the member: %v", err)
	}
	os.WriteFile(l.meshConfig(), []byte("mcp_servers: []\n"), 0o600)
	out, _, err = runScript(t, stopMeshScript(l, pid, true))
	if err != nil || !strings.Contains(out, "mesh_gone") || !strings.Contains(out, "mesh_purged") {
		t.Errorf("purge: %v %q", err, out)
	}
	for _, p := range []string{l.meshDir(), l.meshLog(), l.meshConfig()} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left after purge", p)
		}
	}

	// A join that fails: the script stops there, saying what to reach.
	fakeSamNode(t, l, true)
	script, _ = samNodeScript(l, join, args)
	out, errs, err = runScript(t, script)
	if err == nil || !strings.Contains(errs, "i/o timeout") || !strings.Contains(errs, "(reach 10.0.0.1 on 7600)") || strings.Contains(out, "pid=") {
		t.Errorf("a failed join: %v %q %s", err, out, errs)
	}
	// Without a join (a member already), it only starts.
	fakeSamNode(t, l, false)
	os.Remove(filepath.Join(l.Dir, "join-args"))
	script, _ = samNodeScript(l, nil, args)
	out, errs, err = runScript(t, script)
	if err != nil || keyValues(out)["pid"] == "" {
		t.Fatalf("start of a member: %v %q %s", err, out, errs)
	}
	p2, _ := strconv.Atoi(keyValues(out)["pid"])
	t.Cleanup(func() { syscall.Kill(p2, syscall.SIGKILL) })
	if _, err := os.Stat(filepath.Join(l.Dir, "join-args")); err == nil {
		t.Error("a member already joined again")
	}
	runScript(t, stopMeshScript(l, p2, true))
}

// TestSamNodeScriptRefusesWhatCouldEscape: a token or CA that could end
// the here-document (or be more than a token) never makes a script.
func TestSamNodeScriptRefusesWhatCouldEscape(t *testing.T) {
	l := layout{Dir: "/var/lib/sf", Node: "n"}
	for _, j := range []meshJoin{
		{Token: "samb_x\nSANDSTORM_FLEET_TOKEN\nreboot", CA: []byte("pem")},
		{Token: "samb_x y", CA: []byte("pem")},
		{Token: "", CA: []byte("pem")},
		{Token: "samb_x", CA: []byte("pem\nSANDSTORM_FLEET_CA\nreboot\n")},
	} {
		if _, err := samNodeScript(l, &j, []string{"x"}); err == nil {
			t.Errorf("token %q, CA %q: a script", j.Token, j.CA)
		}
	}
}

// TestMeshWaitScript: the wait reads the log from where this start of
// the sam-node began — an earlier run's "joined the mesh" does not count
// — and says at once when the sam-node has exited.
func TestMeshWaitScript(t *testing.T) {
	l := testLayout(t)
	os.MkdirAll(l.Dir, 0o700)
	old := "sam-node: joined the mesh (an earlier run)\n"
	os.WriteFile(l.meshLog(), []byte(old+"boom: the last words\n"), 0o600)
	cmd := exec.Command("sh", "-c", "while :; do sleep 0.05; done", l.meshDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	done := make(chan error, 1)
	var errs string
	go func() {
		var err error
		_, errs, err = runScript(t, meshWaitScript(l, cmd.Process.Pid, int64(len(old))))
		done <- err
	}()
	cmd.Process.Kill()
	cmd.Wait()
	if err := testenv.Within(t, done, 30*time.Second, "the wait did not notice the sam-node exit"); err == nil || !strings.Contains(errs, "exited") || !strings.Contains(errs, "boom: the last words") {
		t.Errorf("wait on a sam-node that exited before joining: %v %s", err, errs)
	}
}
