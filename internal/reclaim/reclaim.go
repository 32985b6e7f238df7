// Package reclaim squeezes a frozen sandbox's memory out to swap — into
// zswap when it is enabled — as the Sandstorm seed's frozen tier does ("its
// cold pages squeezed into zswap"). It works on the memory cgroup of a
// process, cgroup v1 (this machine: hybrid, memory on v1) or v2.
//
// gVisor's application memory is a shared-memory file, which the kernel
// reclaims only at high swappiness (others measured 99.5 % at
// vm.swappiness=100), so the cgroup's swappiness is raised to 100 first.
package reclaim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"sandstorm/internal/cgroup"
)

// Result says how much memory the cgroup held before and after, in bytes.
type Result struct {
	Cgroup        string
	Before, After int64
}

// SwapActive reports whether any swap area is on (/proc/swaps); without one
// there is nowhere to squeeze pages to.
func SwapActive() bool {
	data, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return false
	}
	return len(strings.Split(strings.TrimSpace(string(data)), "\n")) > 1
}

// EnableZswap turns zswap on (a global kernel setting) and reports whether
// it was already on.
func EnableZswap() (wasOn bool, err error) {
	const p = "/sys/module/zswap/parameters/enabled"
	b, err := os.ReadFile(p)
	if err != nil {
		return false, fmt.Errorf("zswap not available in this kernel: %w", err)
	}
	if strings.TrimSpace(string(b)) == "Y" {
		return true, nil
	}
	return false, os.WriteFile(p, []byte("1"), 0o644)
}

// DisableZswap turns zswap off again (what a caller that found it off and
// turned it on puts back).
func DisableZswap() error {
	return os.WriteFile("/sys/module/zswap/parameters/enabled", []byte("0"), 0o644)
}

// Process reclaims as much as the kernel can of the memory cgroup that pid
// belongs to. Call it only on a frozen (paused) cgroup: its pages are cold
// by construction, and nothing faults them back in until it is resumed.
func Process(pid int) (Result, error) {
	dir, v2, err := memoryCgroup(pid)
	if err != nil {
		return Result{}, err
	}
	r := Result{Cgroup: dir}
	if v2 {
		r.Before = readInt(filepath.Join(dir, "memory.current"))
		// memory.reclaim asks for a number of bytes; asking for all of it
		// reclaims what can be, then reports EAGAIN for the rest.
		err = os.WriteFile(filepath.Join(dir, "memory.reclaim"), []byte(strconv.FormatInt(r.Before, 10)), 0o644)
		r.After = readInt(filepath.Join(dir, "memory.current"))
		if err != nil && !errors.Is(err, syscall.EAGAIN) {
			return r, fmt.Errorf("memory.reclaim in %s: %w", dir, err)
		}
		return r, nil
	}
	// cgroup v1 has no memory.reclaim: lowering the limit makes the kernel
	// reclaim down to it synchronously (EBUSY when it cannot get that low),
	// then the old limit goes back.
	os.WriteFile(filepath.Join(dir, "memory.swappiness"), []byte("100"), 0o644)
	r.Before = readInt(filepath.Join(dir, "memory.usage_in_bytes"))
	limitPath := filepath.Join(dir, "memory.limit_in_bytes")
	old, err := os.ReadFile(limitPath)
	if err != nil {
		return r, err
	}
	os.WriteFile(limitPath, []byte("1"), 0o644) // EBUSY expected: as low as it goes
	if err := os.WriteFile(limitPath, []byte(strings.TrimSpace(string(old))), 0o644); err != nil {
		// Never leave a sandbox at a limit it cannot run under.
		os.WriteFile(limitPath, []byte("-1"), 0o644)
	}
	r.After = readInt(filepath.Join(dir, "memory.usage_in_bytes"))
	return r, nil
}

// memoryCgroup finds the directory of pid's memory cgroup: the v1 memory
// hierarchy if there is one, else the v2 cgroup with memory.reclaim. The
// root cgroup is refused: that would squeeze the whole machine.
func memoryCgroup(pid int) (dir string, v2 bool, err error) {
	dir, v2, err = cgroup.Of(pid, "memory", "memory.reclaim")
	if errors.Is(err, cgroup.ErrRoot) {
		return "", false, fmt.Errorf("%w; refusing to reclaim the whole machine", err)
	}
	return dir, v2, err
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}
