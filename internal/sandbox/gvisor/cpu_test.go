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
	dir := testCgroup(t, "cpuacct")
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	b := &Backend{Root: t.TempDir()}
	writeState(t, b, cmd.Process.Pid)
	// Still in the test's own cgroup: where that is the root one (as on
	// this project's machines), CPU must refuse it.
	if _, _, err := cgroup.Of(os.Getpid(), "cpuacct", "cpu.stat"); errors.Is(err, cgroup.ErrRoot) {
		if d, err := b.CPU("c1"); err == nil {
			t.Errorf("a process in the root cpuacct cgroup: read %v, want an error", d)
		}
	}
	enterCgroup(t, dir, cmd.Process.Pid)
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

// testCgroup makes a cgroup of the test's own in the v1 hierarchy of
// controller (this machine's hybrid layout, the one runsc uses here), and
// removes it once the test and the cleanups it registers after this one
// are done (with its processes gone, it is empty by then).
func testCgroup(t *testing.T, controller string) string {
	t.Helper()
	dir := "/sys/fs/cgroup/" + controller + "/sstest-" + controller + "-" + strconv.Itoa(os.Getpid())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("a %s cgroup for the test (needs root and the v1 %s hierarchy): %v", controller, controller, err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

// enterCgroup moves pid into the cgroup dir.
func enterCgroup(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeState writes b's runsc state of container c1, naming pid as its
// sandbox's process, and returns what it wrote.
func writeState(t *testing.T, b *Backend, pid int) string {
	t.Helper()
	state := fmt.Sprintf(`{"sandbox":{"pid":%d}}`, pid)
	if err := os.WriteFile(b.stateFile("c1"), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	return state
}
