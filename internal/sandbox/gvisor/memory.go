package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"sandstorm/internal/reclaim"
	"sandstorm/internal/sandbox"
)

// sandboxPid is the pid of container id's sandbox process (runsc-sandbox),
// from runsc's state file: no runsc command, so it cannot hang.
func (b *Backend) sandboxPid(id string) (int, error) {
	data, err := os.ReadFile(b.stateFile(id))
	if err != nil {
		return 0, err
	}
	var st struct {
		Sandbox *struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(data, &st); err != nil || st.Sandbox == nil || st.Sandbox.Pid <= 0 {
		return 0, fmt.Errorf("runsc state of %s names no sandbox pid", id)
	}
	return st.Sandbox.Pid, nil
}

// SandboxPID is the pid of container id's sandbox process (the sentry),
// from runsc's state.
func (b *Backend) SandboxPID(id string) (int, error) { return b.sandboxPid(id) }

// cgroup is the memory cgroup runsc put container id's sandbox in (runsc
// makes one per sandbox and applies the OCI spec's memory limit to it),
// found through the live sandbox process.
func (b *Backend) cgroup(id string) (reclaim.Cgroup, error) {
	pid, err := b.sandboxPid(id)
	if err != nil {
		return reclaim.Cgroup{}, err
	}
	return reclaim.CgroupOf(pid)
}

// Memory implements sandbox.MemoryReporter. When the sandbox process named
// in runsc's state is dead, it says so, and whether the kernel log shows the
// OOM killer ending it: runsc removes the sandbox's cgroup as soon as the
// sandbox dies, so its oom_kill counter is gone with it.
func (b *Backend) Memory(ctx context.Context, spec sandbox.Spec) (sandbox.MemStat, error) {
	if v, ok := liveCgroups.Load(b.liveKey(spec.ID)); ok {
		lc := v.(liveCgroup)
		if syscall.Kill(lc.pid, 0) == nil {
			if u := lc.cg.Usage(); u > 0 {
				return sandbox.MemStat{UsageBytes: u}, nil
			}
		}
		liveCgroups.Delete(b.liveKey(spec.ID))
	}
	pid, err := b.sandboxPid(spec.ID)
	if err != nil {
		return sandbox.MemStat{}, err
	}
	if syscall.Kill(pid, 0) != nil {
		return sandbox.MemStat{Gone: true, OOMKilled: oomKilledInLog(ctx, spec.ID)}, nil
	}
	cg, err := reclaim.CgroupOf(pid)
	if err != nil {
		return sandbox.MemStat{}, err
	}
	u := cg.Usage()
	if u > 0 {
		liveCgroups.Store(b.liveKey(spec.ID), liveCgroup{pid: pid, cg: cg})
	}
	return sandbox.MemStat{UsageBytes: u}, nil
}

// Taken implements sandbox.MemoryReporter: the cgroup's usage less its
// page cache.
func (b *Backend) Taken(ctx context.Context, spec sandbox.Spec) (int64, error) {
	ms, err := b.Memory(ctx, spec)
	if err != nil {
		return 0, err
	}
	if ms.Gone {
		return 0, fmt.Errorf("sandbox %s: its process is gone", spec.ID)
	}
	v, ok := liveCgroups.Load(b.liveKey(spec.ID))
	if !ok {
		return ms.UsageBytes, nil
	}
	return max(0, ms.UsageBytes-v.(liveCgroup).cg.PageCache()), nil
}

// liveCgroup is a running sandbox's process and memory cgroup, as Memory
// found them (liveCgroups, by runsc root and container ID: a package
// variable, because a Backend is copied for another runsc build). The node reads every hot
// sandbox's memory once a second (node.findKilled) and every starting
// one's for admission: with 330 hot web sandboxes, reading runsc's state
// file (a JSON parse) and /proc/<pid>/cgroup each time was ≈ 10 % of the
// node's CPU samples (perf, bench/fill --awake), now a kill(pid, 0) and
// one read of the usage file. A stale entry cannot pass for a live
// sandbox: runsc removes the sandbox's cgroup when its process dies, so a
// reused pid still leaves the usage unreadable (0), and the slow path
// decides; Start, Restore and Remove drop the entry anyway.
type liveCgroup struct {
	pid int
	cg  reclaim.Cgroup
}

var liveCgroups sync.Map

func (b *Backend) liveKey(id string) string { return b.Root + "\x00" + id }

// dmesgTimeout bounds reading the kernel log (a few ms here).
const dmesgTimeout = 5 * time.Second

// oomKilledInLog reports whether the kernel log has an OOM kill in the
// memory cgroup runsc made for container id ("oom-kill:…,task_memcg=/<id>"
// for a kill by the cgroup's own limit or by the whole machine).
func oomKilledInLog(ctx context.Context, id string) bool {
	ctx, cancel := context.WithTimeout(ctx, dmesgTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "dmesg")
	cmd.WaitDelay = sandbox.WaitDelay
	out, err := cmd.Output()
	if err != nil {
		return false
	}
	return bytes.Contains(out, []byte("task_memcg=/"+id+",")) || bytes.Contains(out, []byte("task_memcg=/"+id+"\n"))
}

// SetOOMScore implements sandbox.OOMScorer: every process in the
// sandbox's cgroup gets adj. Sandboxes this backend launches are born with
// the spec's value (launch sets it before runsc is exec'd); this is for
// one launched otherwise, or whose score should change while it runs.
//
// Stubs are cloned from a stub while the sandbox runs, and a clone keeps
// the value its parent had at that moment, so one cloned while this walks
// cgroup.procs can be missed: it walks again until a pass finds nothing to
// change, a few passes at most, and cannot promise more on a live tree.
func (b *Backend) SetOOMScore(_ context.Context, spec sandbox.Spec, adj int) error {
	cg, err := b.cgroup(spec.ID)
	if err != nil {
		return err
	}
	want := strconv.Itoa(adj)
	for pass := 0; pass < 5; pass++ {
		changed := false
		for _, pid := range cg.Procs() {
			f := "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
			if cur, err := os.ReadFile(f); err == nil && string(bytes.TrimSpace(cur)) != want {
				os.WriteFile(f, []byte(want), 0o644)
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	return nil
}
