package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"
)

// Deadlines of the commands this backend runs. Every one is enforced inside
// the backend, whatever context the caller passes (context.Background()
// included); a caller's earlier deadline still wins.
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
	RemoveTimeout = 2*DeleteTimeout + KillTimeout + 2*WaitDelay + cgroupBusyWait
)

// deadlines are the deadlines one Backend uses: the constants above, or
// shorter ones in tests.
type deadlines struct {
	control, run, delete, kill  time.Duration
	checkpointBase, restoreBase time.Duration
	rate                        int64 // bytes per second
	waitDelay                   time.Duration
}

var defaultDeadlines = deadlines{
	control: ControlTimeout, run: RunTimeout, delete: DeleteTimeout, kill: KillTimeout,
	checkpointBase: CheckpointBase, restoreBase: RestoreBase, rate: CheckpointRate,
	waitDelay: WaitDelay,
}

func (b *Backend) dl() deadlines {
	if b.deadlines != nil {
		return *b.deadlines
	}
	return defaultDeadlines
}

// sized is base plus the time to move size bytes at the allowed rate, to
// the millisecond.
func (d deadlines) sized(base time.Duration, size int64) time.Duration {
	return (base + time.Duration(float64(size)/float64(d.rate)*float64(time.Second))).Round(time.Millisecond)
}

// TimeoutError is returned when a command ran out of time and was killed.
// It wraps context.DeadlineExceeded, so a caller can tell "no answer" (the
// sandbox's state is unknown) from an answer.
type TimeoutError struct {
	// Command is what was run, e.g. "runsc state 3f2a…".
	Command string
	// After is how long it ran before it was killed; Limit is its
	// deadline.
	After, Limit time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("%s: timed out after %s (deadline %s), killed", e.Command, e.After.Round(time.Millisecond), e.Limit)
}

func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// command is one external command with its deadline.
type command struct {
	// what names it in errors: "runsc state <id>".
	what   string
	limit  time.Duration
	name   string
	args   []string
	stdout io.Writer
	stderr io.Writer
	// wait is the exec.Cmd's WaitDelay.
	wait time.Duration
	// verb is runsc's subcommand ("run", "checkpoint", …), and observe,
	// when set, hears how each run went (Backend.Observe).
	verb    string
	observe Observer
}

// run runs c, killing it (SIGKILL) when its deadline passes or ctx ends. On
// timeout the error is a *TimeoutError; on cancellation it wraps ctx's error
// and says after how long.
func (c command) run(ctx context.Context) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.name, c.args...)
	cmd.Stdout, cmd.Stderr = c.stdout, c.stderr
	cmd.WaitDelay = c.wait
	err := cmd.Run()
	if c.observe != nil {
		c.observe(c.verb, time.Since(start), err)
	}
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		after := time.Since(start)
		if errors.Is(cerr, context.DeadlineExceeded) {
			limit := c.limit
			if dl, ok := ctx.Deadline(); ok {
				// The caller's deadline may have been earlier.
				limit = min(limit, dl.Sub(start).Round(time.Millisecond))
			}
			return &TimeoutError{Command: c.what, After: after, Limit: limit}
		}
		return fmt.Errorf("%s: %w after %s, killed", c.what, cerr, after.Round(time.Millisecond))
	}
	return err
}

// cutShort reports whether err is a command that ran out of time or was
// cancelled (and so was killed).
func cutShort(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
