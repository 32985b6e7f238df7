package reclaim

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// withSwap makes sure a swap area is active for the test, adding a 256 MiB
// swap file (removed afterwards) when the machine has none.
func withSwap(t *testing.T) {
	t.Helper()
	if SwapActive() {
		return
	}
	f := filepath.Join(t.TempDir(), "swap")
	for _, args := range [][]string{
		{"fallocate", "-l", "256M", f}, {"chmod", "600", f}, {"mkswap", f}, {"swapon", f},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("swapoff", f).Run() })
	if !SwapActive() {
		t.Fatal("swapon succeeded but /proc/swaps lists nothing")
	}
}

// TestProcessSqueezesAFrozenCgroup puts a process holding 32 MiB of shared
// memory (like gVisor's memory file) into its own v1 memory cgroup, freezes
// it, and checks Process moves most of it out to swap and leaves the limit
// as it was.
func TestProcessSqueezesAFrozenCgroup(t *testing.T) {
	withSwap(t)
	wasOn, err := EnableZswap()
	if err != nil {
		t.Fatal(err)
	}
	if !wasOn {
		// A global kernel setting: the suite leaves the host as it found it.
		t.Cleanup(func() { DisableZswap() })
	}
	mem := "/sys/fs/cgroup/memory/sstest-reclaim"
	frz := "/sys/fs/cgroup/freezer/sstest-reclaim"
	for _, d := range []string{mem, frz} {
		os.Mkdir(d, 0o755)
	}
	cmd := exec.Command("python3", "-c", `
import mmap, sys
m = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_SHARED)
for i in range(0, len(m), 4096): m[i] = 1
print("ready", flush=True)
sys.stdin.read()
`)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(frz, "freezer.state"), []byte("THAWED"), 0o644)
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(mem)
		os.Remove(frz)
	})
	for _, d := range []string{mem, frz} {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(pid), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Touch the pages again so they are charged to the new cgroup.
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("child said %q", line)
	}
	os.WriteFile(filepath.Join(mem, "memory.move_charge_at_immigrate"), []byte("3"), 0o644)
	os.WriteFile(filepath.Join(mem, "cgroup.procs"), []byte(pid), 0o644)
	if err := os.WriteFile(filepath.Join(frz, "freezer.state"), []byte("FROZEN"), 0o644); err != nil {
		t.Fatal(err)
	}
	limitBefore, _ := os.ReadFile(filepath.Join(mem, "memory.limit_in_bytes"))
	r, err := Process(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cgroup %s: %d MiB before, %d MiB after", r.Cgroup, r.Before>>20, r.After>>20)
	if r.Cgroup != mem {
		t.Fatalf("found cgroup %s, want %s", r.Cgroup, mem)
	}
	if r.Before < 30<<20 {
		t.Fatalf("before = %d bytes; the 32 MiB were not charged to the cgroup", r.Before)
	}
	if r.After > r.Before/2 {
		t.Fatalf("after = %d of %d bytes: less than half went to swap", r.After, r.Before)
	}
	limitAfter, _ := os.ReadFile(filepath.Join(mem, "memory.limit_in_bytes"))
	if string(limitAfter) != string(limitBefore) {
		t.Fatalf("limit changed: %s -> %s", limitBefore, limitAfter)
	}
}

func TestPageCache(t *testing.T) {
	v1 := "cache 100\nactive_file 1\ninactive_file 2\ntotal_active_file 4096\ntotal_inactive_file 8192\ntotal_shmem 7\n"
	v2 := "anon 10\nfile 12288\nactive_file 4096\ninactive_file 8192\nshmem 7\n"
	if got := pageCache(v1, false); got != 12288 {
		t.Errorf("v1: %d, want the hierarchical totals 12288", got)
	}
	if got := pageCache(v2, true); got != 12288 {
		t.Errorf("v2: %d, want 12288", got)
	}
	if got := pageCache("garbage\n", true); got != 0 {
		t.Errorf("unreadable: %d", got)
	}
}
