package gvisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"sandstorm/internal/cgroup"
)

func TestParseCPUUsage(t *testing.T) {
	if d, err := parseCPUUsage([]byte("123456789\n"), false); err != nil || d != 123456789*time.Nanosecond {
		t.Errorf("v1: %v %v", d, err)
	}
	if d, err := parseCPUUsage([]byte("usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n"), true); err != nil || d != 2500*time.Microsecond {
		t.Errorf("v2: %v %v", d, err)
	}
	if _, err := parseCPUUsage([]byte("user_usec 2000\n"), true); err == nil {
		t.Error("v2 without usage_usec: want an error")
	}
	if _, err := parseCPUUsage([]byte("x"), false); err == nil {
		t.Error("v1 garbage: want an error")
	}
}

// TestCPUReadsTheSandboxCgroup: CPU finds the cgroup of the process that
// runsc's state names and reads what it has used. The "sandbox" is a busy
// shell loop in a v1 cpuacct cgroup of its own (this machine's hybrid
// layout, the one runsc uses here).
func TestCPUReadsTheSandboxCgroup(t *testing.T) {
	dir := "/sys/fs/cgroup/cpuacct/sstest-cpu-" + strconv.Itoa(os.Getpid())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("a cpuacct cgroup for the test (needs root and the v1 cpuacct hierarchy): %v", err)
	}
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(dir)
	})
	b := &Backend{Root: t.TempDir()}
	state := fmt.Sprintf(`{"sandbox":{"pid":%d}}`, cmd.Process.Pid)
	if err := os.WriteFile(b.stateFile("c1"), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	// Still in the test's own cgroup: where that is the root one (as on
	// this project's machines), CPU must refuse it.
	if _, _, err := cgroup.Of(os.Getpid(), "cpuacct", "cpu.stat"); errors.Is(err, cgroup.ErrRoot) {
		if d, err := b.CPU("c1"); err == nil {
			t.Errorf("a process in the root cpuacct cgroup: read %v, want an error", d)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The loop runs from now on in the new cgroup: wait until it has been
	// charged 20 ms there, as CPU reads it.
	for deadline := time.Now().Add(10 * time.Second); ; {
		d, err := b.CPU("c1")
		if err != nil {
			t.Fatal(err)
		}
		if d >= 20*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s of a busy loop its cgroup reads %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
