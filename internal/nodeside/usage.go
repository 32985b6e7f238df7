package nodeside

import (
	"context"
	"io/fs"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/sandbox"
)

// cpuWindow is how long a first reading of a sandbox's CPU watches it,
// when the node has no earlier reading to take a difference from; and
// cpuFresh how old an earlier reading may be to serve instead.
const (
	cpuWindow = 200 * time.Millisecond
	cpuFresh  = 2 * time.Minute
)

// diskFresh is how long one walk of a sandbox's upper layer is served
// again: a walk stats every file it wrote, so a caller polling metrics
// every second does not walk it every second.
const diskFresh = 10 * time.Second

// cpuReadings keeps the last CPU reading of each sandbox (a share of the
// cores is a difference of two readings of its cgroup's counter) and its
// last complete disk walk.
type cpuReadings struct {
	mu   sync.Mutex
	last map[string]cpuReading
	disk map[string]diskReading
}

type diskReading struct {
	at    time.Time
	bytes int64
}

// diskBytes is what sandbox id wrote under upper: a walk at most
// diskFresh old. A walk cut short by ctx is answered but not kept.
func (c *cpuReadings) diskBytes(ctx context.Context, id, upper string) int64 {
	now := time.Now()
	c.mu.Lock()
	if d, ok := c.disk[id]; ok && now.Sub(d.at) < diskFresh {
		c.mu.Unlock()
		return d.bytes
	}
	c.mu.Unlock()
	n, whole := treeBytes(ctx, upper)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disk == nil {
		c.disk = map[string]diskReading{}
	}
	for k, d := range c.disk { // forget sandboxes no one asks about
		if now.Sub(d.at) > cpuFresh {
			delete(c.disk, k)
		}
	}
	if whole {
		c.disk[id] = diskReading{at: now, bytes: n}
	}
	return n
}

type cpuReading struct {
	at  time.Time
	cpu time.Duration
}

// swap records r for id and answers the one it replaces, if it is fresh
// and of the same run (a restored sandbox's counter starts again).
func (c *cpuReadings) swap(id string, r cpuReading) (cpuReading, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]cpuReading{}
	}
	for k, v := range c.last { // forget sandboxes no one asks about
		if r.at.Sub(v.at) > cpuFresh {
			delete(c.last, k)
		}
	}
	prev, ok := c.last[id]
	c.last[id] = r
	return prev, ok && prev.cpu <= r.cpu && r.at.After(prev.at)
}

// Usage implements nodeapi.Node: the sandbox's cgroup (CPU and memory,
// when it runs: hot or frozen) and its overlay's upper layer (disk).
func (l *Side) Usage(ctx context.Context, id string) (api.Usage, error) {
	sb, err := l.N.Get(ctx, id)
	if err != nil {
		return api.Usage{}, err
	}
	u := api.Usage{At: time.Now(), Tier: sb.Tier, CPUCount: runtime.NumCPU(), MemLimitBytes: int64(sb.MemoryMiB) << 20}
	if sb.Tier == api.TierHot || sb.Tier == api.TierFrozen {
		spec := sandbox.Spec{ID: sb.ID}
		if mr, ok := l.N.Backend().(sandbox.MemoryReporter); ok {
			if ms, err := mr.Memory(ctx, spec); err == nil && !ms.Gone {
				u.MemBytes = ms.UsageBytes
				if taken, err := mr.Taken(ctx, spec); err == nil && taken <= ms.UsageBytes {
					u.MemBytes, u.MemCacheBytes = taken, ms.UsageBytes-taken
				}
			}
		}
		if sb.Tier == api.TierHot {
			u.CPUPct = l.cpuPct(ctx, sb.ID, u.CPUCount)
		}
	}
	upper := l.N.Dir(sb.ID).Upper()
	u.DiskBytes = l.cpu.diskBytes(ctx, sb.ID, upper)
	var st unix.Statfs_t
	if unix.Statfs(upper, &st) == nil {
		u.DiskLimitBytes = u.DiskBytes + int64(st.Bavail)*st.Bsize
	}
	return u, nil
}

// cpuPct is the share of cpus cores sandbox id used since the last
// reading, or over cpuWindow from now; 0 when it cannot be read.
func (l *Side) cpuPct(ctx context.Context, id string, cpus int) float64 {
	cr, ok := l.N.Backend().(sandbox.CPUReporter)
	if !ok {
		return 0
	}
	read := func() (cpuReading, bool) {
		d, err := cr.CPU(id)
		return cpuReading{at: time.Now(), cpu: d}, err == nil
	}
	now, ok := read()
	if !ok {
		return 0
	}
	prev, fresh := l.cpu.swap(id, now)
	if !fresh {
		t := time.NewTimer(cpuWindow)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return 0
		case <-t.C:
		}
		prev = now
		if now, ok = read(); !ok {
			return 0
		}
		l.cpu.swap(id, now)
	}
	wall := now.at.Sub(prev.at)
	if wall <= 0 || now.cpu < prev.cpu || cpus <= 0 {
		return 0
	}
	return min(100, 100*float64(now.cpu-prev.cpu)/float64(wall)/float64(cpus))
}

// treeBytes is the size of the files under dir, as far as it is read
// before ctx ends, and whether it was read whole.
func treeBytes(ctx context.Context, dir string) (n int64, whole bool) {
	whole = true
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file gone while read, or dir not there
		}
		if ctx.Err() != nil {
			whole = false
			return fs.SkipAll
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n, whole
}
