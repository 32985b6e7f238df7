package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
)

// Filler creates sandboxes through a master, Parallel at a time, the way a
// well-behaved client does (issue 15: bench/fill, bench/fleet and
// bench/flood each had a copy of this loop, and none read Retry-After): a
// create refused with 503 is tried again after the answer's Retry-After,
// until it is made, its refusals or its time run out, or the fill stops.
type Filler struct {
	Client   *client.Client
	Parallel int
	// Count is how many creates to make; Request the i-th (1, 2, …).
	Count   int
	Request func(i int) api.SandboxRequest
	// MaxRefusals bounds how many 503s one create takes before it gives up
	// (0: no bound); RetryFor how long it goes on being tried (0: none).
	MaxRefusals int
	RetryFor    time.Duration
	// Refused, if set, is told of every 503 as it comes (how long it took).
	Refused func(i int, took time.Duration)
	// Again, if set, is asked after each 503 whether to try create i
	// again (within MaxRefusals and RetryFor): false gives it up.
	Again func(i int, a Answer) bool
	// Done is told how each create ended; it returns true to stop the whole
	// fill (the creates under way still end and are told).
	Done func(i int, a Answer) (stop bool)
}

// Named is a Filler's Request: sandboxes of template named by format
// (with the create's number, as fmt.Sprintf), e.g. Named("web", "f%05d").
func Named(template, format string) func(i int) api.SandboxRequest {
	return func(i int) api.SandboxRequest {
		return api.SandboxRequest{Template: template, Name: fmt.Sprintf(format, i)}
	}
}

// Answer is how one create ended.
type Answer struct {
	Sandbox api.Sandbox
	// Err is the last answer's error (nil: made); GaveUp says a 503 was
	// the last and it was not tried again.
	Err    error
	GaveUp bool
	// Took is the last attempt's time, Refusals the 503s before it.
	Took     time.Duration
	Refusals int
}

// Run makes the creates and returns when they are done, Done said stop,
// or ctx ends.
func (f *Filler) Run(ctx context.Context) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex // Done and Refused are called one at a time
	for w := 0; w < max(f.Parallel, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1))
				if i > f.Count {
					return
				}
				a := f.create(ctx, i, &mu)
				if ctx.Err() != nil && a.Err != nil {
					return // the fill stopped under it: not an answer
				}
				mu.Lock()
				halt := f.Done != nil && f.Done(i, a)
				mu.Unlock()
				if halt {
					stop()
				}
			}
		}()
	}
	wg.Wait()
}

// create makes create i, trying a 503 again after its Retry-After.
func (f *Filler) create(ctx context.Context, i int, mu *sync.Mutex) Answer {
	req := f.Request(i)
	var giveUp time.Time
	if f.RetryFor > 0 {
		giveUp = time.Now().Add(f.RetryFor)
	}
	var a Answer
	for {
		t0 := time.Now()
		a.Sandbox, a.Err = f.Client.CreateSandbox(ctx, req)
		a.Took = time.Since(t0)
		wait, refused := client.RetryAfterOf(a.Err)
		if !refused {
			return a
		}
		a.Refusals++
		if f.Refused != nil {
			mu.Lock()
			f.Refused(i, a.Took)
			mu.Unlock()
		}
		if f.MaxRefusals > 0 && a.Refusals > f.MaxRefusals || !giveUp.IsZero() && time.Now().Add(wait).After(giveUp) ||
			f.Again != nil && !f.Again(i, a) {
			a.GaveUp = true
			return a
		}
		select {
		case <-ctx.Done():
			return a
		case <-time.After(wait):
		}
	}
}

// CallSample calls k of sbs picked at random (all of them if k is more),
// parallel at a time, with call (which says how long the call itself took),
// and tells done how each went, one at a time; it returns how many it
// picked. The fill benchmarks' second half: whatever tier each is in, the
// call wakes it.
func CallSample(ctx context.Context, sbs []api.Sandbox, k, parallel int, call func(context.Context, api.Sandbox) (time.Duration, error), done func(sb api.Sandbox, took time.Duration, err error)) int {
	picks := rand.Perm(len(sbs))
	if len(picks) > k {
		picks = picks[:k]
	}
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < max(parallel, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(picks) {
					return
				}
				sb := sbs[picks[i]]
				took, err := call(ctx, sb)
				mu.Lock()
				done(sb, took, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return len(picks)
}
