// Package memstat takes a running sandbox's memory apart, for the
// benchmarks that compare a restored sandbox with a cold one
// (bench/restoremem): what its memory cgroup says it holds (memory.stat:
// anonymous, file and shmem pages — gVisor's memory file is a memfd, so
// the application's memory is shmem there) and, process by process, what
// each mapping of the sentry, the gofer and the stubs has resident
// (/proc/<pid>/smaps), by kind of mapping.
package memstat

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Snapshot is one reading of a sandbox's memory.
type Snapshot struct {
	// UsageBytes is the cgroup's usage (memory.usage_in_bytes on v1,
	// memory.current on v2): what the node reads.
	UsageBytes int64 `json:"usage_bytes"`
	// Stat is the cgroup's memory.stat, in bytes (its own counters, not
	// the hierarchy's total_ ones).
	Stat map[string]int64 `json:"stat"`
	// Procs is each process in the cgroup.
	Procs []Proc `json:"procs"`
}

// Proc is one process's resident memory by kind of mapping.
type Proc struct {
	PID  int    `json:"pid"`
	Role string `json:"role"` // argv[0]'s base name and first argument
	// RssKiB and PssKiB by kind (Kind).
	RssKiB map[string]int64 `json:"rss_kib"`
	PssKiB map[string]int64 `json:"pss_kib"`
}

// Kind names what a mapping is, from its /proc/<pid>/maps path field:
// "memfd:<name>" for a memfd (gVisor's memory file, systrap's shared
// memory), "anon" for anonymous memory with no name (the Go heap of the
// sentry and gofer among it), "[heap]", "[stack]" and such as they are,
// "binary" for the runsc executable, "file" for any other file (the
// application's files the sentry maps from the host).
func Kind(path, runsc string) string {
	path = strings.TrimSuffix(path, " (deleted)")
	switch {
	case path == "":
		return "anon"
	case strings.HasPrefix(path, "/memfd:"):
		return "memfd:" + strings.TrimPrefix(path, "/memfd:")
	case strings.HasPrefix(path, "["):
		return path
	case runsc != "" && filepath.Base(path) == filepath.Base(runsc):
		return "binary"
	}
	return "file"
}

// Read reads the memory of the cgroup dir (its memory controller's
// directory) and of every process in it; runsc names the runsc binary
// (for Kind).
func Read(cgroupDir string, v2 bool, runsc string) (Snapshot, error) {
	var s Snapshot
	usage := "memory.usage_in_bytes"
	if v2 {
		usage = "memory.current"
	}
	b, err := os.ReadFile(filepath.Join(cgroupDir, usage))
	if err != nil {
		return s, err
	}
	s.UsageBytes, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if b, err = os.ReadFile(filepath.Join(cgroupDir, "memory.stat")); err != nil {
		return s, err
	}
	s.Stat = ParseStat(string(b))
	b, err = os.ReadFile(filepath.Join(cgroupDir, "cgroup.procs"))
	if err != nil {
		return s, err
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		p, err := readProc(pid, runsc)
		if err != nil {
			continue // gone meanwhile
		}
		s.Procs = append(s.Procs, p)
	}
	sort.Slice(s.Procs, func(i, j int) bool { return s.Procs[i].PID < s.Procs[j].PID })
	return s, nil
}

// ParseStat reads memory.stat's "name value" lines.
func ParseStat(text string) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			out[f[0]] = v
		}
	}
	return out
}

func readProc(pid int, runsc string) (Proc, error) {
	p := Proc{PID: pid, RssKiB: map[string]int64{}, PssKiB: map[string]int64{}}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		p.Role = filepath.Base(args[0])
		for _, a := range args[1:] {
			if !strings.HasPrefix(a, "-") {
				p.Role += " " + a
				break
			}
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return p, err
	}
	defer f.Close()
	if err := ParseSmaps(bufio.NewScanner(f), runsc, p.RssKiB, p.PssKiB); err != nil {
		return p, err
	}
	return p, nil
}

// ParseSmaps adds each mapping's Rss and Pss (kB) of a /proc/<pid>/smaps
// text to rss and pss under the mapping's Kind.
func ParseSmaps(sc *bufio.Scanner, runsc string, rss, pss map[string]int64) error {
	kind := ""
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.Contains(f[0], "-") && len(f) >= 5 && !strings.HasSuffix(f[0], ":") {
			// A mapping's header: address perms offset dev inode [path].
			path := ""
			if len(f) >= 6 {
				path = strings.Join(f[5:], " ")
			}
			kind = Kind(path, runsc)
			continue
		}
		if kind == "" || len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Rss:":
			rss[kind] += v
		case "Pss:":
			pss[kind] += v
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if kind == "" {
		return errors.New("no mapping in smaps")
	}
	return nil
}
