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
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, err
	}
	file, v2, err := cpuCgroupFile(string(data))
	if err != nil {
		return 0, err
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return parseCPUUsage(raw, v2)
}

// cpuCgroupFile is the file holding the CPU usage of the cgroup a
// /proc/<pid>/cgroup text names: cpuacct.usage (ns) of the v1 cpuacct
// hierarchy if there is one, else cpu.stat (usage_usec) of the unified
// one. The root cgroup is refused: it would be the whole machine's.
func cpuCgroupFile(text string) (file string, v2 bool, err error) {
	var unified string
	for _, line := range strings.Split(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpuacct" {
				if parts[2] == "/" {
					return "", false, errors.New("the sandbox is in the root cpuacct cgroup")
				}
				// cpu and cpuacct are often mounted together, as
				// "cpu,cpuacct"; the mount point has the controllers' names.
				return filepath.Join("/sys/fs/cgroup", parts[1], parts[2], "cpuacct.usage"), false, nil
			}
		}
		if parts[0] == "0" {
			unified = parts[2]
		}
	}
	if unified == "" || unified == "/" {
		return "", false, errors.New("the sandbox has no cpu cgroup of its own")
	}
	for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		f := filepath.Join(root, unified, "cpu.stat")
		if _, err := os.Stat(f); err == nil {
			return f, true, nil
		}
	}
	return "", false, errors.New("the sandbox's cgroup has no cpu.stat")
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
