package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

// TestOperatorCommands: the built binary's serve, then its operator's
// commands at --api: policy set (a bad file refused with what is wrong,
// exit non-zero, nothing changed), policy get, keys rotate (--grace; a
// bad --grace is a usage error, exit 2); and the rotation and policy are
// there after serve restarts.
func TestOperatorCommands(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "sam-control-plane")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	data := filepath.Join(tmp, "cp")
	addr := testenv.FreeAddr(t)
	api := "https://" + addr
	serve := func() func() {
		cmd := exec.Command(bin, "--data-dir", data, "serve", "--listen", addr)
		var log bytes.Buffer
		cmd.Stderr = &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				cmd.Process.Signal(syscall.SIGTERM)
				cmd.Wait()
			}
		}
		t.Cleanup(stop)
		testenv.WaitFor(t, 20*time.Second, "serve answers", func() bool {
			_, _, code := run(t, bin, "--data-dir", data, "--api", api, "policy", "get")
			return code == 0
		})
		return stop
	}
	stop := serve()
	op := func(args ...string) (string, string, int) {
		return run(t, bin, append([]string{"--data-dir", data, "--api", api}, args...)...)
	}

	if out, errOut, code := op("policy", "get"); code != 0 || out != "" || !strings.Contains(errOut, "no policy set yet") {
		t.Errorf("policy get before any: %q %q %d", out, errOut, code)
	}
	good := filepath.Join(tmp, "policy.yaml")
	os.WriteFile(good, []byte("roles: [{name: coder, services: [\"inference://*\"]}]\nbindings: [{principal: agent-a, roles: [coder]}]\n"), 0o644)
	if out, _, code := op("policy", "set", good); code != 0 || !strings.Contains(out, "version 1") {
		t.Fatalf("policy set: %q %d", out, code)
	}
	bad := filepath.Join(tmp, "bad.yaml")
	os.WriteFile(bad, []byte("roles: [{name: x, egress: [\"*\"]}]\n"), 0o644)
	if _, errOut, code := op("policy", "set", bad); code == 0 || !strings.Contains(errOut, "nothing changed") {
		t.Errorf("policy set of a bad file: %q %d", errOut, code)
	}
	if _, _, code := op("policy", "set"); code != 2 {
		t.Errorf("policy set with no file: exit %d, want 2", code)
	}
	if _, _, code := op("keys", "rotate", "--grace", "-1m"); code != 2 {
		t.Errorf("keys rotate --grace -1m: exit %d, want 2", code)
	}
	out, _, code := op("keys", "rotate", "--grace", "30m")
	if code != 0 || !strings.Contains(out, "signing with key") {
		t.Fatalf("keys rotate: %q %d", out, code)
	}
	newKey := strings.Fields(out)[3]
	newKey = strings.TrimSuffix(newKey, ";")
	if st, err := os.Stat(filepath.Join(data, "issuer-keys.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("issuer-keys.json: %v %v", err, st.Mode().Perm())
	}
	b, _ := os.ReadFile(filepath.Join(data, "issuer-keys.json"))
	stop()

	serve()
	if out, errOut, code := op("policy", "get"); code != 0 || !strings.Contains(out, "agent-a") || !strings.Contains(errOut, "version 1") {
		t.Errorf("policy get after a restart: %q %q %d", out, errOut, code)
	}
	if !strings.Contains(string(b), `"id":"`+newKey+`"`) {
		t.Errorf("the rotated key %s is not in the saved keys", newKey)
	}
}

// run runs the binary and returns its stdout, stderr and exit code.
func run(t *testing.T, bin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}
