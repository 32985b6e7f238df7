package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"sandstorm/internal/reclaim"
	"sandstorm/internal/sandbox"
)

// TestMemoryKeepsTheCgroup: Memory reads a running sandbox's process and
// cgroup from runsc's state once and keeps them, so the next reading does
// not parse the state file again; once the process is gone the kept entry
// is dropped and the answer is Gone, from the state file as before. The
// "sandbox" here is a sleep whose pid a state file names, in whatever
// memory cgroup this test runs in.
func TestMemoryKeepsTheCgroup(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if _, err := reclaim.CgroupOf(cmd.Process.Pid); err != nil {
		t.Fatalf("no memory cgroup to read for a child process here: %v", err)
	}
	b := &Backend{Root: t.TempDir()}
	spec := sandbox.Spec{ID: "c1"}
	state := writeState(t, b, cmd.Process.Pid)
	ms, err := b.Memory(context.Background(), spec)
	if err != nil || ms.Gone || ms.UsageBytes <= 0 {
		t.Fatalf("a running process: %+v, %v", ms, err)
	}
	// The state file is unreadable now: only the kept entry can answer.
	os.WriteFile(b.stateFile("c1"), []byte("{"), 0o600)
	if ms, err := b.Memory(context.Background(), spec); err != nil || ms.UsageBytes <= 0 {
		t.Fatalf("the second reading did not come from the kept cgroup: %+v, %v", ms, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	os.WriteFile(b.stateFile("c1"), []byte(state), 0o600)
	ms, err = b.Memory(context.Background(), spec)
	if err != nil || !ms.Gone {
		t.Fatalf("after the process died: %+v, %v", ms, err)
	}
	if _, kept := liveCgroups.Load(b.liveKey("c1")); kept {
		t.Error("a dead process's cgroup is still kept")
	}
}

// TestTakenLeavesOutThePageCache: a process in a memory cgroup of its own
// writes a 64 MiB file. The page cache is charged to its cgroup, so
// Memory's usage counts it; Taken — what admission counts — does not,
// since MemAvailable counts it as available (a restore's image is read so
// into the sandbox's cgroup).
func TestTakenLeavesOutThePageCache(t *testing.T) {
	dir := testCgroup(t, "memory")
	file := filepath.Join(t.TempDir(), "cached")
	cmd := exec.Command("sh", "-c", `read go && dd if=/dev/zero of="$0" bs=1M count=64 status=none && sleep 60`, file)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(file)
	})
	enterCgroup(t, dir, cmd.Process.Pid)
	b := &Backend{Root: t.TempDir()}
	spec := sandbox.Spec{ID: "c1"}
	writeState(t, b, cmd.Process.Pid)
	fmt.Fprintln(in, "go") // dd runs now, in the new cgroup
	var usage, taken int64
	for deadline := time.Now().Add(20 * time.Second); ; {
		ms, err := b.Memory(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if taken, err = b.Taken(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
		if usage = ms.UsageBytes; usage >= 64<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s its cgroup holds %d MiB, want the 64 MiB file it wrote", usage>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if taken > usage-60<<20 {
		t.Errorf("usage %d MiB, taken %d MiB: the 64 MiB of page cache was counted as taken", usage>>20, taken>>20)
	}
}
