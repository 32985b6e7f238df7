package daemon

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTakeLock: the data dir's lock is refused at once while the daemon in
// sandstormd.pid lives; when that daemon is dead but something it started
// still holds the lock (a child between fork and exec, here another open
// of the file in this process), it is waited for, and taken once let go —
// or refused, naming the dead PID, when it never is.
func TestTakeLock(t *testing.T) {
	dir := t.TempDir()
	holder, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	writePID := func(pid int) {
		if err := os.WriteFile(filepath.Join(dir, "sandstormd.pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	defer func(old time.Duration) { lockHandback = old }(lockHandback)

	// A live holder: refused with its stop command, not waited for.
	lockHandback = time.Hour
	writePID(os.Getpid())
	if f, err := takeLock(dir); err == nil {
		f.Close()
		t.Fatal("took a lock a live daemon holds")
	} else if want := "kill " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}

	// A dead holder whose child never lets go: refused after the wait.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	writePID(dead.Process.Pid)
	lockHandback = 200 * time.Millisecond
	if f, err := takeLock(dir); err == nil {
		f.Close()
		t.Fatal("took a lock still held")
	} else if !strings.Contains(err.Error(), "has exited") || !strings.Contains(err.Error(), "fuser") {
		t.Errorf("error %q: want it to say the holder exited and how to find what holds the lock", err)
	}

	// A dead holder whose child lets go while takeLock waits: taken.
	lockHandback = 10 * time.Second
	go func() {
		time.Sleep(100 * time.Millisecond)
		holder.Close()
	}()
	f, err := takeLock(dir)
	if err != nil {
		t.Fatalf("the lock was let go, but: %v", err)
	}
	f.Close()
}
