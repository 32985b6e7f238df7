package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sandstorm/internal/cgroup"
)

// CPU is the CPU time the sandbox of container id has used since it
// started: its cgroup's (runsc makes one per sandbox and puts the sentry,
// the gofer and the sentry's stubs in it), so the work the sandbox's
// kernel does for its program and for every packet that reaches it is
// counted, wherever it ran. The benchmarks read it at a sandbox's first
// answer, to compare what a start cost the sandbox under the node and
// under raw runsc (bench/tiers).
func (b *Backend) CPU(id string) (time.Duration, error) {
	pid, err := b.sandboxPid(id)
	if err != nil {
		return 0, err
	}
	// cpuacct.usage (ns) of the v1 cpuacct hierarchy if there is one, else
	// cpu.stat (usage_usec) of the unified one.
	dir, v2, err := cgroup.Of(pid, "cpuacct", "cpu.stat")
	if err != nil {
		return 0, fmt.Errorf("the CPU cgroup of sandbox %s: %w", id, err)
	}
	file := filepath.Join(dir, "cpuacct.usage")
	if v2 {
		file = filepath.Join(dir, "cpu.stat")
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return parseCPUUsage(raw, v2)
}

// parseCPUUsage reads cpuacct.usage (nanoseconds) or, v2, the usage_usec
// line of cpu.stat.
func parseCPUUsage(raw []byte, v2 bool) (time.Duration, error) {
	if !v2 {
		ns, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpuacct.usage: %w", err)
		}
		return time.Duration(ns), nil
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cpu.stat: %w", err)
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, errors.New("cpu.stat has no usage_usec")
}
