package sandbox

import (
	"context"
	"syscall"
	"time"
)

// MemStat is what a sandbox's memory cgroup says about it.
type MemStat struct {
	// UsageBytes is the memory charged to the sandbox's cgroup now, in
	// bytes (0 when it is gone).
	UsageBytes int64
	// Gone: the sandbox's process is no longer alive; OOMKilled: the
	// kernel's OOM killer is what ended it.
	Gone, OOMKilled bool
}

// MemoryReporter is implemented by backends that can read a running
// sandbox's memory cgroup. The node uses it to account for sandboxes that
// are still filling their memory and to notice one the kernel killed.
type MemoryReporter interface {
	Memory(ctx context.Context, spec Spec) (MemStat, error)
	// Taken is what the sandbox takes from the node's MemAvailable, in
	// bytes: its cgroup's usage less the page cache charged to it, which
	// MemAvailable counts as available. Admission counts this, not the
	// usage: a restore reads its image through the page cache of the
	// sandbox's cgroup, so the usage reached what the sandbox had been
	// promised while half its memory was still to come (issue 19's flood
	// fell 146 MiB below its reserve so). Reading it costs a parse of
	// memory.stat, so Memory, read for every hot sandbox each second,
	// does not.
	Taken(ctx context.Context, spec Spec) (int64, error)
}

// CPUReporter is implemented by backends that can read how much CPU
// time a running sandbox has used since it started (its cgroup's), for
// what a sandbox uses (api.Usage).
type CPUReporter interface {
	CPU(id string) (time.Duration, error)
}

// OOMScorer is implemented by backends that can set the kernel's OOM score
// of every process of a running sandbox, so that if the kernel has to kill
// something it kills a sandbox, never the node's own daemons or sshd.
type OOMScorer interface {
	SetOOMScore(ctx context.Context, spec Spec, adj int) error
}

// Signaller is implemented by backends that can send a signal to a
// running container's init process (a warm sandbox's reseed).
type Signaller interface {
	Signal(ctx context.Context, spec Spec, sig syscall.Signal) error
}

// Execer is implemented by backends that can run a command inside a
// running container to its end, returning what it printed.
type Execer interface {
	Exec(ctx context.Context, spec Spec, args []string) ([]byte, error)
}

// Cloner is implemented by backends that can checkpoint a container and
// leave it as it was (running, or paused if it was paused): the image a
// clone's children are restored from.
type Cloner interface {
	CheckpointRunning(ctx context.Context, spec Spec, imageDir string) error
}
