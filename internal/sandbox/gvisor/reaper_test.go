package gvisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestReapRunsc: a child named "exe" (as runsc's sandbox and gofer are)
// is reaped once it exits, whether it was first seen running or already a
// zombie, and forgotten when it is; a child os/exec started is left for
// its own Wait, which still gets its exit status.
func TestReapRunsc(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal("no sleep binary on PATH (coreutils)")
	}
	exe := filepath.Join(t.TempDir(), "exe")
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(secs string) int {
		pid, err := syscall.ForkExec(exe, []string{"exe", secs}, &syscall.ProcAttr{})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	other := exec.Command(sleep, "0.2")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	running := start("0.3") // seen running first, then exits
	reapRunsc()
	if _, known := runscKids.Load(running); !known {
		t.Fatalf("a running exe child is not known after a scan")
	}
	zombie := start("0") // exits before the next scan sees it
	gone := func(pid int) bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		return os.IsNotExist(err)
	}
	// Forgotten is waited for with the rest: another test's reaper may
	// have reaped it and not yet dropped it (CI saw that race once).
	forgotten := func(pid int) bool { _, known := runscKids.Load(pid); return !known }
	deadline := time.Now().Add(10 * time.Second)
	for !(gone(running) && gone(zombie) && forgotten(running)) {
		if time.Now().After(deadline) {
			t.Fatalf("exe children not reaped and forgotten: %d gone %v forgotten %v, %d gone %v", running, gone(running), forgotten(running), zombie, gone(zombie))
		}
		reapRunsc()
		time.Sleep(10 * time.Millisecond)
	}
	if err := other.Wait(); err != nil {
		t.Errorf("os/exec's child: %v (the reaper took it)", err)
	}
}
