package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
)

// step is what one part of a wake sample came to: go on to the next
// part, start the sample again, or end the series (with the error, if
// any, that ends it).
type step int

const (
	proceed step = iota
	again
	finished
)

// failed is a failed attempt: again, unless the series has failed too
// often (series.fail says when).
func failed(stop bool) (step, error) {
	if stop {
		return finished, nil
	}
	return again, nil
}

// missed is series.miss's answer as a step.
func missed(stop bool, err error) (step, error) {
	if stop {
		return finished, err
	}
	return again, nil
}

// wakeRun is one wake series: a sandbox put into a tier through the API,
// and the one request that wakes it, timed from the client and from the
// node.
type wakeRun struct {
	r    *runner
	op   tierOp
	name string
	s    *series
	// cl, node and enter always; cpu and finish for the snapshot tier;
	// dcpu when the run knows the daemon's process.
	cl, node, enter, cpu, finish, dcpu *bench.Series
	sb                                 api.Sandbox
	url                                string
	// prev is the app's request counter after the last answer, -1 when
	// unknown (after a failure the sandbox may have been re-created cold).
	prev int
}

// measureWake measures the wake from op's tier for template t.
func (r *runner) measureWake(ctx context.Context, t string, op tierOp) error {
	w := r.newWake(t, op)
	if w.s.done() {
		return nil // this pass has no share of it
	}
	sb, err := r.ready(ctx, string(op.tier), t)
	if err != nil {
		return w.s.skip(ctx, err)
	}
	defer func() { r.remove(ctx, sb.ID) }()
	w.sb = sb
	w.url, _ = r.endpoint(sb)
	w.prev = 1 // the app's request counter after ready's first answer
	for !w.s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if st, err := w.sample(ctx); st == finished {
			return err
		}
	}
	return nil
}

func (r *runner) newWake(t string, op tierOp) *wakeRun {
	name := "wake-" + string(op.tier) + "/" + t
	w := &wakeRun{r: r, op: op, name: name}
	w.cl = r.res.AddSeries(name+"/client",
		fmt.Sprintf("GET / through the gateway to a %s sandbox: the wake and the answer (client)", op.tier), seeds[name+"/client"])
	w.node = r.res.AddSeries(name+"/node",
		fmt.Sprintf("the node's own time for that wake from %s (last_wake_ms afterwards)", op.tier), seeds[name+"/node"])
	w.enter = r.res.AddSeries(op.op+"/"+t+"/api",
		fmt.Sprintf("POST /v1/sandboxes/{id}/%s round trip, hot → %s (client)", op.op, op.tier), "")
	if op.tier == api.TierSnapshot {
		w.cpu = r.res.AddSeries(name+"/sandbox-cpu", restoreCPUDesc, "")
		w.finish = r.res.AddSeries(op.op+"/"+t+"/finish",
			"from the snapshot's answer until the node has removed the stopped container and the network namespace, which it does after answering (the wake is timed only after it; raw-checkpoint/…/delete is raw runsc's removal)", "")
	}
	w.dcpu = r.daemonCPUSeries(name)
	w.s = &series{r: r, main: w.cl, name: name, n: r.upTo(r.cfg.wakeN)}
	return w
}

// sample is one wake: hot, into the tier, settled, woken, recorded.
func (w *wakeRun) sample(ctx context.Context) (step, error) {
	if st, err := w.serving(ctx); st != proceed {
		return st, err
	}
	if err := sleep(ctx, w.r.cfg.settle); err != nil {
		return finished, err
	}
	t0 := time.Now()
	in, err := w.r.c.Transition(ctx, w.sb.ID, w.op.op)
	enterD := time.Since(t0)
	if st, err := w.entered(ctx, in, err); st != proceed {
		return st, err
	}
	if w.finish != nil && w.r.nodeRunsc != nil {
		// As raw runsc's restore starts from a removed container, the
		// wake starts from a snapshot the node has finished.
		fd, ferr := w.r.settled(ctx, w.sb.ID, t0.Add(enterD))
		if ferr != nil {
			return missed(w.s.miss(ctx, "%v", ferr))
		}
		w.finish.AddDuration(fd)
	}
	if err := sleep(ctx, w.r.cfg.dwell); err != nil {
		return finished, err
	}
	after, body, d, st, err := w.wake(ctx, in)
	if st != proceed {
		return st, err
	}
	w.record(after, body, d, enterD)
	return proceed, nil
}

// serving makes the sandbox hot and, after a failure, waits until its
// app answers, so that every sample starts from a serving sandbox.
func (w *wakeRun) serving(ctx context.Context) (step, error) {
	if err := w.r.ensureHot(ctx, w.sb.ID); err != nil {
		if client.StatusOf(err) == http.StatusNotFound {
			w.cl.Skipped = fmt.Sprintf("the sandbox disappeared: %v", err)
			return finished, nil
		}
		w.prev = -1
		return failed(w.s.fail("%v", err))
	}
	if w.prev >= 0 {
		return proceed, nil
	}
	_, _, body, err := w.r.firstAnswer(ctx, w.url, time.Now())
	if err != nil {
		return missed(w.s.miss(ctx, "sandbox not answering before the sample: %v", err))
	}
	if c, ok := parseCount(body); ok {
		w.prev = c
	}
	return proceed, nil
}

// entered checks the transition's answer: the tier asked for, or a
// failure (a failed transition may re-create the sandbox cold).
func (w *wakeRun) entered(ctx context.Context, in api.Sandbox, err error) (step, error) {
	if err != nil {
		if ctx.Err() != nil {
			return finished, ctx.Err()
		}
		var ae *client.Error
		if errors.As(err, &ae) && ae.Body.Code == api.CodeNotSupported {
			w.cl.Skipped = fmt.Sprintf("the daemon cannot %s: %v", w.op.op, err)
			return finished, nil
		}
		w.prev = -1
		return failed(w.s.fail("%s: %v", w.op.op, err))
	}
	if in.Tier != w.op.tier {
		w.prev = -1
		return failed(w.s.fail("%s answered tier %q, want %q (note: %s)", w.op.op, in.Tier, w.op.tier, in.Note))
	}
	return proceed, nil
}

// wake sends the one request that wakes the sandbox and checks that the
// node recorded a new wake from the tier.
func (w *wakeRun) wake(ctx context.Context, in api.Sandbox) (api.Sandbox, string, time.Duration, step, error) {
	dc0, dcOK := w.r.daemonCPU()
	status, body, d, err := w.r.get(ctx, w.url)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("HTTP %d: %s", status, bench.OneLine(body))
	}
	if err != nil {
		w.prev = -1
		st, serr := missed(w.s.miss(ctx, "wake request: %v", err))
		return api.Sandbox{}, "", 0, st, serr
	}
	w.r.addDaemonCPU(w.dcpu, dc0, dcOK)
	after, err := w.r.c.Sandbox(ctx, w.sb.ID)
	if err == nil && (after.LastWakeFrom != w.op.tier || after.LastWakeMs == in.LastWakeMs && in.LastWakeFrom == w.op.tier) {
		err = fmt.Errorf("the node recorded no new wake from %s (last_wake_from %q, last_wake_ms %v)", w.op.tier, after.LastWakeFrom, after.LastWakeMs)
	}
	if err != nil {
		w.prev = -1
		st, serr := missed(w.s.miss(ctx, "%v", err))
		return api.Sandbox{}, "", 0, st, serr
	}
	return after, body, d, proceed, nil
}

// record keeps a good sample and checks the app's counter: kept across a
// wake that keeps memory, 1 after one that starts the app cold.
func (w *wakeRun) record(after api.Sandbox, body string, d, enterD time.Duration) {
	w.s.ok()
	w.cl.AddDuration(d)
	w.node.Add(after.LastWakeMs)
	if w.cpu != nil && w.r.nodeRunsc != nil {
		w.r.readCPU(w.cpu, w.r.nodeRunsc, w.sb.ID)
	}
	w.enter.AddDuration(enterD)
	count, ok := parseCount(body)
	switch {
	case !ok:
		w.cl.Note("answer %q has no count=N", bench.OneLine(body))
	case w.op.keepsMemory && w.prev > 0 && count != w.prev+1:
		w.cl.Note("memory state lost: the app's counter went %d → %d across the wake", w.prev, count)
	case !w.op.keepsMemory && count != 1:
		w.cl.Note("counter %d after a cold start, want 1", count)
	}
	if ok {
		w.prev = count
	} else {
		w.prev = -1
	}
	w.r.progress(w.name, len(w.cl.SamplesMs), w.s.n, "client %s ms, node %s ms (%s took %s ms)",
		bench.FormatMs(bench.Ms(d)), bench.FormatMs(after.LastWakeMs), w.op.op, bench.FormatMs(bench.Ms(enterD)))
}
