package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"sandstorm/internal/bench"
)

// The seed's density rule: copies are started one after another, each
// waited for until it answers, for as long as the runtime has memory
// left. Every runtime gets the same memory: budget MiB of the host's
// MemAvailable (the seed's 1.9 GB nodes kept 512 MiB back, so 1,400 MiB
// is its budget), counted from before the runtime's first copy, so what
// its daemons and shims cost counts as well as the copies.

// stopReason is why density stops before starting another copy, or "":
// the pure rule, apart from the loop that measures.
func stopReason(baseAvailMiB, availMiB, budgetMiB int64, started, maxCopies int) string {
	switch {
	case baseAvailMiB-availMiB >= budgetMiB:
		return fmt.Sprintf("its memory is used: MemAvailable %d MiB, %d below the start (budget %d)", availMiB, baseAvailMiB-availMiB, budgetMiB)
	case maxCopies > 0 && started >= maxCopies:
		return fmt.Sprintf("%d copies, as many as asked for", maxCopies)
	}
	return ""
}

// densityResult is what one runtime held.
type densityResult struct {
	// Copies is how many ran and answered within the budget: the copy
	// whose start used it up is not counted.
	Copies int
	// UsedMiB is MemAvailable's drop with every copy started running,
	// the last one too; PerCopyMiB is it over their number.
	UsedMiB    int64
	PerCopyMiB float64
	// Answered is how many of the counted copies answered again once
	// the last one was started, of Recalled called: fewer than Copies
	// when the run was interrupted, which is not a copy failing (a run
	// stopped mid-recall once read as 259 of 2,600 answering).
	Answered, Recalled int
	Ended              string
	// Started are every copy started, for Close to stop.
	Started []instance
}

// densityEnv is what density needs of the host: its memory, and a way to
// wait for a copy's first answer.
type densityEnv struct {
	availMiB func() (int64, error)
	answer   func(ctx context.Context, url string, deadline time.Time) error
	// noRecall skips calling every copy again at the end: tiered, where
	// that is one cold start per detached copy (thousands, one at a
	// time), and --pick samples them instead.
	noRecall bool
	// settle is how long to wait after a copy first answers before memory
	// is read: a program may still be growing.
	settle func(ctx context.Context)
	log    func(format string, args ...any)
}

// density starts copies of prog on rt until stopReason says so or a copy
// fails to start or answer.
func density(ctx context.Context, rt runtime, prog program, budgetMiB int64, maxCopies int, env densityEnv) (densityResult, error) {
	var res densityResult
	base, err := env.availMiB()
	if err != nil {
		return res, err
	}
	var usedBefore int64
	for i := 0; ctx.Err() == nil; i++ {
		avail, err := env.availMiB()
		if err != nil {
			return res, err
		}
		if why := stopReason(base, avail, budgetMiB, i, maxCopies); why != "" {
			res.Ended = why
			res.UsedMiB = base - avail
			if i > 0 && base-avail >= budgetMiB {
				res.Copies = i - 1 // the last one did not fit
			} else {
				res.Copies = i
			}
			break
		}
		usedBefore = base - avail
		in, err := rt.Start(ctx, prog, i)
		if err != nil {
			res.Ended = fmt.Sprintf("copy %d did not start: %v", i, err)
			res.Copies, res.UsedMiB = i, usedBefore
			break
		}
		res.Started = append(res.Started, in)
		if err := env.answer(ctx, in.URL, time.Now().Add(2*time.Minute)); err != nil {
			res.Ended = fmt.Sprintf("copy %d did not answer: %v", i, err)
			res.Copies, res.UsedMiB = i, usedBefore
			break
		}
		env.settle(ctx)
		if (i+1)%10 == 0 {
			env.log("%s %s: %d copies, MemAvailable %d MiB below the start", rt.Name(), prog.Name, i+1, base-avail)
		}
	}
	if res.Ended == "" { // ctx ended: what ran so far
		res.Ended = "interrupted"
		res.Copies = len(res.Started)
		if avail, err := env.availMiB(); err == nil {
			res.UsedMiB = base - avail
		}
	}
	// UsedMiB was read with len(Started) copies running when the rule
	// stopped it, and with Copies running when a copy failed.
	if n := len(res.Started); n > 0 {
		running := res.Copies
		if res.UsedMiB >= budgetMiB {
			running = n
		}
		res.PerCopyMiB = float64(res.UsedMiB) / float64(max(running, 1))
	}
	for _, in := range res.Started[:res.Copies] {
		if env.noRecall || ctx.Err() != nil {
			break
		}
		err := env.answer(ctx, in.URL, time.Now().Add(10*time.Second))
		if ctx.Err() != nil {
			break // not called to the end: neither answered nor failed
		}
		res.Recalled++
		if err == nil {
			res.Answered++
		}
	}
	return res, ctx.Err()
}

// pollAnswer GETs url every interval until it answers 200 (the seed
// polled every 50 ms) or the deadline passes.
func pollAnswer(hc *http.Client, interval time.Duration) func(ctx context.Context, url string, deadline time.Time) error {
	return func(ctx context.Context, url string, deadline time.Time) error {
		return bench.PollAnswer(ctx, hc, url, deadline, func(time.Duration) time.Duration { return interval })
	}
}
