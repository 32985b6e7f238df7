package reclaim

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Cgroup is the memory cgroup a process belongs to (cgroup v1's memory
// hierarchy, or v2's unified one).
type Cgroup struct {
	Dir string
	V2  bool
}

// CgroupOf finds pid's memory cgroup; the root cgroup is refused.
func CgroupOf(pid int) (Cgroup, error) {
	dir, v2, err := memoryCgroup(pid)
	return Cgroup{Dir: dir, V2: v2}, err
}

// Usage is the memory charged to the cgroup now, in bytes.
func (c Cgroup) Usage() int64 {
	if c.V2 {
		return readInt(filepath.Join(c.Dir, "memory.current"))
	}
	return readInt(filepath.Join(c.Dir, "memory.usage_in_bytes"))
}

// PageCache is the part of Usage that is page cache, in bytes: files
// read or written from the cgroup (a sandbox's rootfs, the checkpoint
// image its runsc writes or reads: both are charged to the sandbox's
// cgroup, measured in issue 19's flood). The kernel takes it back when it
// needs memory, and /proc/meminfo's MemAvailable counts it as available.
// It is memory.stat's active and inactive file pages (v1: their
// hierarchical totals); 0 when they cannot be read.
func (c Cgroup) PageCache() int64 {
	b, err := os.ReadFile(filepath.Join(c.Dir, "memory.stat"))
	if err != nil {
		return 0
	}
	return pageCache(string(b), c.V2)
}

// pageCache sums the file LRU lines of a memory.stat.
func pageCache(stat string, v2 bool) int64 {
	active, inactive := "total_active_file", "total_inactive_file"
	if v2 {
		active, inactive = "active_file", "inactive_file"
	}
	var sum int64
	for _, line := range strings.Split(stat, "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok || (k != active && k != inactive) {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			sum += n
		}
	}
	return sum
}

// Procs lists the pids in the cgroup.
func (c Cgroup) Procs() []int {
	b, err := os.ReadFile(filepath.Join(c.Dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
