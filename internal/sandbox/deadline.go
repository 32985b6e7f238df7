package sandbox

import "time"

// Deadlines of the commands a backend runs (internal/sandbox/gvisor, which
// enforces every one whatever context its caller passes, context.Background()
// included; a caller's earlier deadline still wins). They live here, with
// the Backend interface, because the master's deadlines for its calls to a
// node are built on them (internal/nodeapi): the seam depends on the
// abstract runtime, not on gVisor, and there is one table.
//
// Measured on the target VM (2 cores, Debian 12, runsc 2022-12 on ptrace,
// unloaded, runsc's state under /tmp; by hand and with BenchmarkRunscCommands):
//
//	runsc state, pause, resume      16–48 ms
//	runsc run -detach (busybox)     100–410 ms
//	runsc checkpoint, 64 MiB        136–510 ms  (incompressible data: 65 MiB image)
//	runsc checkpoint, 512 MiB       670–980 ms  (≈ 600 MiB/s)
//	runsc restore, 64 / 512 MiB     160–230 / 340–480 ms
//	runsc delete -force             ~40 ms (stopped) to 125–225 ms (running)
//	                                reaped by sandstormd; 1.3–1.8 s when init
//	                                reaps the sandbox (about once a second)
//	nft -f (the node's table)       14–22 ms
//
// The deadlines are one to two orders of magnitude above those: on a node
// short of memory the kernel has evicted the 24 MB runsc binary and the
// rootfs from the page cache, every page fault waits for the disk and the
// sandbox itself is being reclaimed, so a healthy command can be 10–50×
// slower than here. A false timeout is not free either (the node settles the
// sandbox as unknown), so they err on the long side — but all are finite.
const (
	// ControlTimeout bounds runsc state, pause and resume: one round trip
	// on the sandbox's control socket (17–48 ms measured).
	ControlTimeout = 10 * time.Second
	// RunTimeout bounds runsc run -detach: gofer and sandbox started, the
	// container's init running (100–410 ms measured).
	RunTimeout = 30 * time.Second
	// DeleteTimeout bounds one runsc delete -force (40–225 ms; 1.8 s at
	// worst without the subreaper, waiting for init to reap the sandbox).
	DeleteTimeout = 10 * time.Second
	// KillTimeout is how long processes SIGKILLed by Remove may take to be
	// gone: the kernel frees a sandbox's memory as it exits, ~1 s per few
	// GiB.
	KillTimeout = 10 * time.Second
	// CheckpointBase + the sandbox's memory at CheckpointRate bounds runsc
	// checkpoint, which writes all of the sandbox's memory to the image:
	// 64 MiB in 0.14–0.5 s, 512 MiB in 0.7–1 s (≈ 600 MiB/s) measured;
	// the rate allowed is 20× slower than that, for a disk that is busy
	// writing the pages the kernel evicts. 64 MiB: 22 s; 1 GiB: 52 s.
	CheckpointBase = 20 * time.Second
	// RestoreBase + the image's size at CheckpointRate bounds runsc
	// restore, which reads the whole image (64 MiB in 0.2 s, 512 MiB in
	// 0.35–0.5 s measured).
	RestoreBase = 20 * time.Second
	// CheckpointRate is the slowest disk throughput, in bytes per second,
	// that checkpoint and restore deadlines allow for.
	CheckpointRate = 32 << 20
	// FallbackMemory is the memory size assumed for a sandbox whose memory
	// cgroup cannot be read (148 s for a checkpoint).
	FallbackMemory = 4 << 30
	// WaitDelay bounds how long Wait waits, once a command has exited or
	// was killed, for its output pipes to close: a child it left behind
	// that holds them open must not hold the caller forever.
	WaitDelay = 2 * time.Second
	// RemoveTimeout is the longest Remove can take: a delete that hangs,
	// the kill, the second delete, the WaitDelays, and waiting for the
	// killed sandbox's cgroups to empty. When the sandbox
	// process or its gofer is stopped (SIGSTOP), Remove goes straight to
	// the kill and takes tens of milliseconds (31 ms measured).
	RemoveTimeout = 2*DeleteTimeout + KillTimeout + 2*WaitDelay + CgroupBusyWait
)

// CgroupBusyWait is how long removeCgroups waits for the last processes
// of a killed sandbox to leave its cgroups.
const CgroupBusyWait = 2 * time.Second
