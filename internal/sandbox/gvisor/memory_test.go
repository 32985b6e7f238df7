package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

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
	state := fmt.Sprintf(`{"sandbox":{"pid":%d}}`, cmd.Process.Pid)
	if err := os.WriteFile(b.stateFile("c1"), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
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
