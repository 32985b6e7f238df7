package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ProcessCPU is the CPU time every thread of process pid has run so far,
// summed from /proc/<pid>/task/*/schedstat (the first field: time on a
// CPU, in nanoseconds; Documentation/scheduler/sched-stats.rst). Unlike
// /proc/<pid>/stat's utime and stime, which count in clock ticks (10 ms
// here), it resolves the few milliseconds a daemon spends on one request.
// A thread that exits between two readings takes its time with it; a Go
// program keeps its threads, so for sandstormd the difference of two
// readings is what it ran in between.
func ProcessCPU(pid int) (time.Duration, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			if os.IsNotExist(err) {
				continue // the thread exited while we listed them
			}
			return 0, err
		}
		ns, err := parseSchedstat(string(b))
		if err != nil {
			return 0, fmt.Errorf("%s/%s/schedstat: %w", dir, t.Name(), err)
		}
		sum += ns
	}
	return sum, nil
}

// parseSchedstat reads the first of schedstat's three fields.
func parseSchedstat(s string) (time.Duration, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return 0, fmt.Errorf("want 3 fields, got %q", strings.TrimSpace(s))
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(ns), nil
}
