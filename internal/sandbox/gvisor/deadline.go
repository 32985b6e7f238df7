package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"sandstorm/internal/sandbox"
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
	control: sandbox.ControlTimeout, run: sandbox.RunTimeout, delete: sandbox.DeleteTimeout, kill: sandbox.KillTimeout,
	checkpointBase: sandbox.CheckpointBase, restoreBase: sandbox.RestoreBase, rate: sandbox.CheckpointRate,
	waitDelay: sandbox.WaitDelay,
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
	// wait is the exec.Cmd's sandbox.WaitDelay.
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
