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
