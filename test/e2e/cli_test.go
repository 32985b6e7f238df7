package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/pki"
	"sandstorm/internal/testenv"
)

// cliResult is one run of the sandstormd CLI.
type cliResult struct {
	Stdout, Stderr string
	Code           int
}

// cli runs sandstormd with args and extra environment entries.
func cli(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sandstormdBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := cliResult{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
	default:
		t.Fatalf("sandstormd %v: %v", args, err)
	}
	return res
}

// ok checks the run succeeded and its stdout matches every pattern.
func (r cliResult) ok(t *testing.T, what string, patterns ...string) {
	t.Helper()
	if r.Code != 0 {
		t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, r.Code, r.Stdout, r.Stderr)
	}
	for _, p := range patterns {
		if !regexp.MustCompile(p).MatchString(r.Stdout) {
			t.Fatalf("%s: stdout does not match %q:\n%s", what, p, r.Stdout)
		}
	}
}

// fails checks the run exited 1 with stderr matching pattern.
func (r cliResult) fails(t *testing.T, what, pattern string) {
	t.Helper()
	if r.Code != 1 || !regexp.MustCompile(pattern).MatchString(r.Stderr) {
		t.Fatalf("%s: exit %d, stderr %q; want exit 1 and stderr matching %q", what, r.Code, r.Stderr, pattern)
	}
}

// TestCLI drives a daemon with the sandstormd template and sandbox
// commands, and checks the help and doctor output.
func TestCLI(t *testing.T) {
	d := startDaemon(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}

	args := []string{"template", "create", "cliweb", "--rootfs-dir", webRootfs, "--port", "8000"}
	for _, e := range webDemo.Env {
		args = append(args, "--env", e)
	}
	args = append(append(args, "--"), webDemo.Args...)
	cli(t, env, args...).ok(t, "template create", `template cliweb registered`)
	cli(t, env, "template", "ls").ok(t, "template ls", `(?m)^NAME\s+PORTS`, `(?m)^cliweb\s+\[8000\]\s+/usr/bin/python3 /srv/app.py\s+\S+\s+-$`)

	r := cli(t, env, "sandbox", "create", "cliweb", "--name", "cli1")
	r.ok(t, "sandbox create", `cli1 \([0-9a-f]{12}\) hot`, `8000→http://127\.0\.0\.1:\d+`)
	id := regexp.MustCompile(`cli1 \(([0-9a-f]{12})\)`).FindStringSubmatch(r.Stdout)[1]
	d.track(id)
	ep := regexp.MustCompile(`8000→(http://127\.0\.0\.1:\d+)`).FindStringSubmatch(r.Stdout)[1]

	cli(t, env, "sandbox", "ls").ok(t, "sandbox ls", `(?m)^ID\s+NAME\s+TEMPLATE\s+NODE\s+TIER`, `(?m)^`+id+`\s+cli1\s+cliweb\s+local\s+hot\s`)
	r = cli(t, env, "sandbox", "ls", "--json")
	r.ok(t, "sandbox ls --json")
	var sbs []api.Sandbox
	if err := json.Unmarshal([]byte(r.Stdout), &sbs); err != nil || len(sbs) != 1 || sbs[0].ID != id || sbs[0].Tier != api.TierHot {
		t.Fatalf("sandbox ls --json: %v %+v", err, sbs)
	}

	for _, step := range []struct{ op, tier string }{
		{"freeze", "frozen"}, {"wake", "hot"}, {"snapshot", "snapshot"}, {"wake", "hot"}, {"detach", "detached"},
	} {
		cli(t, env, "sandbox", step.op, "cli1").ok(t, "sandbox "+step.op, `(?m)^cli1: `+step.tier+` \(`)
		if got := d.get(t, id); string(got.Tier) != step.tier {
			t.Fatalf("after sandbox %s the API says %q, want %s", step.op, got.Tier, step.tier)
		}
	}
	if n := curlCount(t, ep); n != 1 {
		t.Fatalf("curl to the detached sandbox answered count=%d, want 1", n)
	}
	r = cli(t, env, "sandbox", "get", "cli1")
	r.ok(t, "sandbox get", `"tier": "hot"`, `"last_wake_from": "detached"`)
	// What it uses, read from outside: a hot sandbox has memory; reading
	// it leaves it where it was.
	cli(t, env, "sandbox", "usage", "cli1").ok(t, "sandbox usage", `(?m)^tier +hot$`, `(?m)^memory +[1-9][0-9.]* MiB of `, `(?m)^cpu +[0-9.]+% of [1-9]`)
	r = cli(t, env, "sandbox", "logs", "cli1")
	r.ok(t, "sandbox logs", `listening on 0\.0\.0\.0:8000`, `(?m)^--- \S+ sandstorm: restoring from its snapshot`, `(?m)^--- \S+ sandstorm: detached`)
	// The cold start after the detach shows as a second start.
	if n := strings.Count(r.Stdout, "sandstorm: started from template cliweb"); n != 2 {
		t.Errorf("sandbox logs shows %d starts, want 2 (create, and the cold start after detach):\n%s", n, r.Stdout)
	}
	// --timestamps: the node's marks, and (once the index has caught up
	// with its last write, within ms) the demo's own line after its
	// cold start, have times.
	stampRE := regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z listening on 0\.0\.0\.0:8000`)
	testenv.WaitFor(t, 10*time.Second, "the demo's line has a time in sandbox logs --timestamps", func() bool {
		return stampRE.MatchString(cli(t, env, "sandbox", "logs", "--timestamps", "cli1").Stdout)
	})
	cli(t, env, "sandbox", "logs", "-t", "cli1").ok(t, "sandbox logs -t", `(?m)^\d{4}-\d\d-\d\dT\S+Z --- sandstorm: started from template cliweb`)
	// --follow prints what is appended while it runs.
	fctx, fcancel := context.WithTimeout(context.Background(), time.Minute)
	defer fcancel()
	follower := exec.CommandContext(fctx, sandstormdBin, "sandbox", "logs", "--follow", "cli1")
	follower.Env = append(os.Environ(), env...)
	var fout testenv.SyncBuffer
	follower.Stdout = &fout
	if err := follower.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the follower prints the log so far", func() bool { return strings.Contains(fout.String(), "listening on") })
	cli(t, env, "sandbox", "detach", "cli1").ok(t, "sandbox detach while following")
	testenv.WaitFor(t, 30*time.Second, "the follower prints the detach", func() bool { return strings.Count(fout.String(), "sandstorm: detached") == 2 })
	fcancel()
	follower.Wait()
	if n := curlCount(t, ep); n != 1 {
		t.Fatalf("after the second detach: count=%d, want 1", n)
	}

	cli(t, env, "sandbox", "freeze", "no-such-sandbox").fails(t, "freeze of an unknown sandbox", `HTTP 404`)
	cli(t, env, "sandbox", "create", "no-such-template").fails(t, "create from an unknown template", `HTTP 404`)
	cli(t, env, "template", "rm", "cliweb").fails(t, "template rm of a template in use", `HTTP 409\): template "cliweb" is in use by 1 sandbox\(es\); delete them first`)
	cli(t, append(env, "SANDSTORM_TOKEN=wrong"), "sandbox", "ls").fails(t, "sandbox ls with a wrong token", `HTTP 401.*came from SANDSTORM_TOKEN.*--data-dir \(or SANDSTORM_DATA_DIR\)`)
	// A token file of another daemon: the 401 names the file it read.
	other := t.TempDir()
	os.MkdirAll(other+"/pki", 0o700)
	os.WriteFile(other+"/pki/api-token", []byte("not-this-daemons\n"), 0o600)
	cli(t, []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + other, "SANDSTORM_TOKEN=", "SANDSTORM_CA=" + client.CAFile(d.DataDir)}, "sandbox", "ls").fails(t, "sandbox ls with another daemon's token file",
		`HTTP 401.*came from `+regexp.QuoteMeta(other+"/pki/api-token"))
	// Another daemon's CA: the CLI does not talk to (or send its token to)
	// a server it cannot verify, and says what to do.
	os.WriteFile(client.CAFile(other), otherCA(t), 0o644)
	cli(t, []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + other, "SANDSTORM_TOKEN="}, "sandbox", "ls").fails(t, "sandbox ls trusting another CA",
		`certificate signed by unknown authority.*from another CA than `+regexp.QuoteMeta(client.CAFile(other))+`.*--ca`)
	// A transition that does not apply says so once, with the name used.
	cli(t, env, "sandbox", "detach", "cli1").ok(t, "sandbox detach")
	r = cli(t, env, "sandbox", "freeze", "cli1")
	r.fails(t, "freeze of a detached sandbox", `conflict \(HTTP 409\): sandbox cli1 \(`+id+`\) is detached`)
	if strings.Contains(r.Stderr, "conflict: conflict") {
		t.Errorf("doubled error text: %q", r.Stderr)
	}
	// Usage mistakes exit 2 and say where to look.
	for _, args := range [][]string{{"sandbox", "bogus"}, {"template", "bogus"}, {"sandbox", "exec"}, {"bogus"}, {"sandbox", "ls", "--bogus"}, {"sandbox", "get"}} {
		if r := cli(t, env, args...); r.Code != 2 || !strings.Contains(r.Stderr, "--help") {
			t.Errorf("sandstormd %v: exit %d, stderr %q; want exit 2 and a pointer to --help", args, r.Code, r.Stderr)
		}
	}
	// Mistakes the CLI can see before asking the daemon, said as such.
	for _, args := range [][]string{
		{"sandbox", "egress", "cli1", "--limit", "-1"},
		{"secret", "create", "ip", "--host", "192.0.2.1", "--from-file", "/etc/hostname"},
	} {
		if r := cli(t, env, args...); r.Code != 2 || !strings.Contains(r.Stderr, "--help") || strings.Contains(r.Stderr, "HTTP") {
			t.Errorf("sandstormd %v: exit %d, stderr %q; want exit 2 before the daemon is asked", args, r.Code, r.Stderr)
		}
	}

	cli(t, env, "sandbox", "rm", "cli1").ok(t, "sandbox rm", `(?m)^removed cli1$`)
	d.assertGone(t, id)
	r = cli(t, env, "sandbox", "ls")
	r.ok(t, "sandbox ls after rm")
	if strings.Contains(r.Stdout, "cli1") {
		t.Fatalf("sandbox ls still lists cli1 after rm:\n%s", r.Stdout)
	}
	cli(t, env, "template", "rm", "cliweb").ok(t, "template rm")
	if r := cli(t, env, "template", "ls"); strings.Contains(r.Stdout, "cliweb") {
		t.Fatalf("template ls still lists cliweb after rm:\n%s", r.Stdout)
	}

	cli(t, nil, "--help").ok(t, "sandstormd --help", `--data-dir`, `serve`, `doctor`, `template`, `sandbox`)
	r = cli(t, nil, "serve", "--help")
	r.ok(t, "sandstormd serve --help")
	for _, f := range []string{"--master", "--node", "--data-dir", "--listen", "--backend", "--subnet",
		"--gateway-listen", "--gateway-ports", "--memory-reserve", "--max-wakes", "--wake-admission",
		"--ready-timeout", "--freeze-after", "--snapshot-after", "--detach-after", "--max-upload"} {
		if !strings.Contains(r.Stdout, f+" ") {
			t.Errorf("sandstormd serve --help does not mention %s", f)
		}
	}
	r = cli(t, nil, "sandbox", "--help")
	r.ok(t, "sandstormd sandbox --help", `--api`, `--json`)
	for _, c := range []string{"create", "ls", "get", "rm", "logs", "clone", "freeze", "snapshot", "detach", "wake"} {
		if !regexp.MustCompile(`(?m)^\s+` + c + `\s`).MatchString(r.Stdout) {
			t.Errorf("sandstormd sandbox --help does not list %s", c)
		}
	}

	// A warm template and a clone, from the CLI.
	args = []string{"template", "create", "cliwarm", "--rootfs-dir", webRootfs, "--port", "8000", "--warm-probe", "/healthz", "--reseed-signal", "SIGUSR1"}
	for _, e := range webDemo.Env {
		args = append(args, "--env", e)
	}
	args = append(append(args, "--"), webDemo.Args...)
	cli(t, env, args...).ok(t, "template create --warm-probe", `template cliwarm registered`, `its warm image is made; 1 sandbox\(es\) kept ready`)
	cli(t, env, "template", "ls").ok(t, "template ls with a warm template", `(?m)^cliwarm\s.*\sprobe /healthz, reseed SIGUSR1, pool 1$`)
	r = cli(t, env, "sandbox", "create", "cliwarm", "--name", "w1")
	r.ok(t, "sandbox create from a warm template", `w1 \([0-9a-f]{12}\) hot`)
	d.track(regexp.MustCompile(`w1 \(([0-9a-f]{12})\)`).FindStringSubmatch(r.Stdout)[1])
	r = cli(t, env, "sandbox", "clone", "w1", "-n", "2")
	r.ok(t, "sandbox clone", `(?m)^w1 was paused [0-9.]+ ms$`, `(?m)^[0-9a-f]{12}\s+w1-1\s`, `(?m)^[0-9a-f]{12}\s+w1-2\s`)
	for _, m := range regexp.MustCompile(`(?m)^([0-9a-f]{12})\s+w1-\d`).FindAllStringSubmatch(r.Stdout, -1) {
		d.track(m[1])
	}
	for _, args := range [][]string{
		{"template", "create", "x", "--rootfs-dir", webRootfs, "--warm-probe", "nope", "--", "/usr/bin/python3"},
		{"template", "create", "x", "--rootfs-dir", webRootfs, "--warm-probe", "/healthz", "--", "/usr/bin/python3"}, // no reseed
		{"sandbox", "clone", "w1", "-n", "0"},
		{"sandbox", "clone", "w1", "--reseed-signal", "SIGKILL"},
	} {
		if r := cli(t, env, args...); r.Code != 2 || !strings.Contains(r.Stderr, "--help") {
			t.Errorf("sandstormd %v: exit %d (%q), want 2 (usage)", args, r.Code, r.Stderr)
		}
	}

	cli(t, []string{"SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_API=" + d.API}, "doctor").ok(t, "sandstormd doctor", `(?m)^✓ runsc\s`, `(?m)^✓ daemon\s+sandstormd answers at `)
	// Nothing listening, and a token the daemon does not know: – and ✗,
	// each with what to do.
	cli(t, []string{"SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_API=https://127.0.0.1:1"}, "doctor").ok(t, "sandstormd doctor, no daemon", `(?m)^– daemon\s+no sandstormd answers`, `fix: start one`)
	// A ✗ exits 1 (issue 15: doctor said ✗ and exited 0).
	wrong := cli(t, []string{"SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_API=" + d.API, "SANDSTORM_TOKEN=wrong"}, "doctor")
	wrong.fails(t, "sandstormd doctor, wrong token", `1 check\(s\) marked ✗ failed`)
	if !regexp.MustCompile(`(?m)^✗ daemon\s+sandstormd at \S+ refuses the token from SANDSTORM_TOKEN`).MatchString(wrong.Stdout) {
		t.Errorf("doctor with a wrong token:\n%s", wrong.Stdout)
	}
}

// otherCA is a CA certificate no daemon here uses.
func otherCA(t *testing.T) []byte {
	t.Helper()
	c, _, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
