package api

import "time"

// Usage is what one sandbox uses now, as its node measures it from
// outside the sandbox (its cgroup, its writable layer), so that reading
// it neither wakes the sandbox nor counts as activity that keeps it from
// idling. E2B's GET /sandboxes/{id}/metrics answers it.
type Usage struct {
	At   time.Time `json:"at"`
	Tier Tier      `json:"tier"`
	// CPUCount is how many of the node's cores the sandbox may run on.
	CPUCount int `json:"cpu_count"`
	// CPUPct is the share of those cores it used, 0–100: over the time
	// since the node last read it, or over a short window of the read's
	// own. 0 out of the hot tier: a frozen sandbox runs nothing.
	CPUPct float64 `json:"cpu_pct"`
	// MemBytes is the memory it takes from the node now (its cgroup's
	// charge less page cache) and MemCacheBytes that page cache; both 0
	// in the snapshot and detached tiers, where it holds no memory.
	MemBytes      int64 `json:"mem_bytes"`
	MemCacheBytes int64 `json:"mem_cache_bytes"`
	// MemLimitBytes is its memory limit.
	MemLimitBytes int64 `json:"mem_limit_bytes"`
	// DiskBytes is what it wrote to its filesystem (its overlay's upper
	// layer, from a walk of it at most 10 s old); DiskLimitBytes is that
	// plus what the node's disk has free.
	DiskBytes      int64 `json:"disk_bytes"`
	DiskLimitBytes int64 `json:"disk_limit_bytes"`
}
