package reclaim

import (
	"bufio"
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

// OOMKills is how many processes the kernel has killed in the cgroup for
// want of memory: the oom_kill line of memory.events (v2) or of
// memory.oom_control (v1, kernel 4.13 and later). Either counts kills by
// the cgroup's own limit and by the whole machine running out.
func (c Cgroup) OOMKills() int64 {
	file := "memory.oom_control"
	if c.V2 {
		file = "memory.events"
	}
	f, err := os.Open(filepath.Join(c.Dir, file))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
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
