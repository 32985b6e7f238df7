package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/bench/raw"
)

// The raw series time runsc itself, outside sandstormd, on what sandstormd
// would run (internal/bench/raw: the node's bundle, runsc flags and
// network), with the first answer polled with the same client as the
// sandstormd series, on the gateway's dial schedule (runner.rawFirstAnswer);
// the ratio tables measure what the node adds on top.

// ensureRaw sets up the raw environment on first use.
func (r *runner) ensureRaw(ctx context.Context) (*raw.Env, error) {
	if r.raw != nil {
		return r.raw, nil
	}
	var avoid []netip.Prefix
	if p, err := netip.ParsePrefix(r.cfg.subnet); err == nil {
		avoid = append(avoid, p.Masked())
	}
	e, err := raw.New(ctx, r.cfg.runsc, r.cfg.platform, r.runID, avoid, r.cfg.timeout)
	if err != nil {
		return nil, err
	}
	r.raw = e
	be, nw := e.Backend(), e.Net()
	r.res.Params["raw"] = map[string]any{
		"runsc_root": be.Root, "flags": be.Flags(), "netns": nw.Name, "veth": nw.HostIf,
		"host_addr": nw.Host.String(), "sandbox_addr": nw.Sandbox.String(),
		"bundle":   "node.PrepareBundle: overlay of the template's rootfs, the node's OCI spec (writeSpec), the daemon's memory limit",
		"commands": "runsc <flags> run -detach -bundle B ID | pause ID | resume ID | checkpoint --image-path=I ID | restore -detach -image-path=I -bundle B ID, exec'd directly",
	}
	fmt.Fprintf(os.Stderr, "raw runsc: root %s, network %s (%s ↔ %s)\n", be.Root, nw.Name, nw.Host, nw.Sandbox)
	return e, nil
}

// rawEnvFor is the raw environment for series s, nil when s has nothing
// to do: this pass has no share of it, or the environment could not be
// set up (s is then skipped, saying why).
func (r *runner) rawEnvFor(ctx context.Context, s *series) *raw.Env {
	if s.done() {
		return nil
	}
	e, err := r.ensureRaw(ctx)
	if err != nil {
		s.main.Skipped = err.Error()
		return nil
	}
	return e
}

// rawBoxFor lays out a new raw container of template t.
func (r *runner) rawBoxFor(e *raw.Env, purpose, t string) (*raw.Box, error) {
	def, ok := r.tmplDef[t]
	if !ok {
		return nil, fmt.Errorf("template %s: its definition is unknown", t)
	}
	limit, ok := r.limitMiB[t]
	if !ok {
		limit = def.MemoryMiB
		if limit <= 0 {
			limit = raw.NodeDefaultMemoryMiB
		}
		r.res.Note("raw %s/%s: no sandstormd sandbox of the template was seen before it, so its memory limit (%d MiB) is the template's or the node's default, not read from the daemon", purpose, t, limit)
		r.limitMiB[t] = limit
	}
	return e.NewBox(t, raw.Template(def), int64(limit), "")
}

// measureRawStart times runsc run -detach of a fresh container to its
// first answer, polled as measureStart polls the gateway, and reads its
// memory then.
func (r *runner) measureRawStart(ctx context.Context, t string) error {
	name := "raw-start/" + t
	cl := r.res.AddSeries(name+"/client",
		"runsc run -detach started → first HTTP 200 from the sandbox's own address (polled on the gateway's dial schedule, gateway.DialInterval, same client as the gateway series; no sandstormd)", "")
	cmdS := r.res.AddSeries(name+"/runsc",
		"the runsc run -detach command alone (it returns once the container runs, before the app listens)", "")
	cpu := r.res.AddSeries(name+"/sandbox-cpu", cpuDesc, "")
	s := &series{r: r, main: cl, name: name, n: r.upTo(r.cfg.startN)}
	e := r.rawEnvFor(ctx, s)
	if e == nil {
		return nil
	}
	url := e.URL(r.cfg.port)
	mem := r.mem.get(t, "raw")
	for !s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := r.rawBoxFor(e, "start", t)
		var t0 time.Time
		var runD, d time.Duration
		var attempts int
		var body string
		if err == nil {
			t0, runD, err = e.Run(ctx, b)
		}
		if err == nil {
			d, attempts, body, err = r.rawFirstAnswer(ctx, url, t0)
		}
		if err == nil {
			r.readCPU(cpu, e.Backend(), b.ID())
			mem.read(ctx, e.Backend(), b.ID())
		}
		if b != nil {
			if rerr := e.Remove(ctx, b); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove: %w", rerr))
			}
		}
		if err != nil {
			if stop, serr := s.miss(ctx, "%v", err); stop {
				return serr
			}
			continue
		}
		s.ok()
		cl.AddDuration(d)
		cmdS.AddDuration(runD)
		if c, ok := parseCount(body); !ok || c != 1 {
			cl.Note("first answer %q: want count=1 from a fresh sandbox", bench.OneLine(body))
		}
		r.progress(name, len(cl.SamplesMs), s.n, "first answer %s ms (runsc run %s ms, %d poll(s))",
			bench.FormatMs(bench.Ms(d)), bench.FormatMs(bench.Ms(runD)), attempts)
	}
	return nil
}

// measureRawHot times GET / straight to a raw sandbox that stays hot, on
// a new TCP connection each time: hot/T/client less this is what the
// gateway's hop costs a request.
func (r *runner) measureRawHot(ctx context.Context, t string) error {
	name := "raw-hot/" + t
	cl := r.res.AddSeries(name+"/client",
		"GET / straight to a raw runsc sandbox's own address, new TCP connection each request (client; no sandstormd); compare hot/"+t+"/client", "")
	s := &series{r: r, main: cl, name: name, n: r.upTo(r.cfg.hotN)}
	e := r.rawEnvFor(ctx, s)
	if e == nil {
		return nil
	}
	b, _, err := r.rawReady(ctx, e, "hot", t)
	if err != nil {
		return s.skip(ctx, err)
	}
	defer e.Remove(ctx, b)
	return r.timeHot(ctx, s, e.URL(r.cfg.port), nil)
}

// rawReady starts a raw container of t for a series and waits for its
// first answer; it returns the container and the app's request counter.
func (r *runner) rawReady(ctx context.Context, e *raw.Env, purpose, t string) (*raw.Box, int, error) {
	b, err := r.rawBoxFor(e, purpose, t)
	if err == nil {
		var t0 time.Time
		if t0, _, err = e.Run(ctx, b); err == nil {
			var body string
			if _, _, body, err = r.firstAnswer(ctx, e.URL(r.cfg.port), t0); err == nil {
				c, _ := parseCount(body)
				return b, c, nil
			}
		}
	}
	if b != nil {
		e.Remove(ctx, b)
	}
	return nil, 0, fmt.Errorf("a raw %s sandbox never answered: %w", t, err)
}

// rawWake is one of the two raw wake measurements: the transition into
// the tier (pause, checkpoint) and the command that leaves it (resume,
// restore).
type rawWake struct {
	series string // raw-pause or raw-restore
	enter  string // runsc command into the tier: pause or checkpoint
	leave  string // and out of it: resume or restore
	tier   api.Tier
}

var (
	rawPause   = rawWake{"raw-pause", "pause", "resume", api.TierFrozen}
	rawRestore = rawWake{"raw-restore", "checkpoint", "restore", api.TierSnapshot}
)

// measureRawWake puts one raw container into the tier and brings it back
// again and again: it times the command into the tier, and the command
// out of it to the first answer (polled, same client). Like measureWake it
// checks that the app's counter survived.
func (r *runner) measureRawWake(ctx context.Context, t string, w rawWake) error {
	leaveName := "raw-" + w.leave + "/" + t
	cl := r.res.AddSeries(leaveName+"/client",
		fmt.Sprintf("runsc %s started → first HTTP 200 from the sandbox's own address (polled on the gateway's dial schedule, gateway.DialInterval, same client as the gateway series; no sandstormd); compare wake-%s/%s/client", w.leave, w.tier, t), "")
	leave := r.res.AddSeries(leaveName+"/runsc", fmt.Sprintf("the runsc %s command alone", w.leave), "")
	enter := r.res.AddSeries("raw-"+w.enter+"/"+t+"/runsc", fmt.Sprintf("the runsc %s command alone (hot → %s)", w.enter, w.tier), "")
	var cpu *bench.Series
	if w.leave == "restore" {
		cpu = r.res.AddSeries(leaveName+"/sandbox-cpu", restoreCPUDesc, "")
	}
	s := &series{r: r, main: cl, name: leaveName, n: r.upTo(r.cfg.wakeN)}
	e := r.rawEnvFor(ctx, s)
	if e == nil {
		return nil
	}
	url := e.URL(r.cfg.port)
	b, prev, err := r.rawReady(ctx, e, w.series, t)
	if err != nil {
		return s.skip(ctx, err)
	}
	defer func() {
		if b != nil {
			e.Remove(ctx, b)
		}
	}()
	for !s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := sleep(ctx, r.cfg.settle); err != nil {
			return err
		}
		enterD, leaveD, d, body, err := r.rawCycle(ctx, e, b, w, url)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			stop := s.fail("%v", err)
			// Start over from a fresh container: this one's state is
			// unknown (a failed checkpoint kills it, for one).
			e.Remove(ctx, b)
			if stop {
				b = nil
				return nil
			}
			if b, prev, err = r.rawReady(ctx, e, w.series, t); err != nil {
				b = nil
				cl.Skipped = err.Error()
				return nil
			}
			continue
		}
		s.ok()
		cl.AddDuration(d)
		leave.AddDuration(leaveD)
		if cpu != nil {
			r.readCPU(cpu, e.Backend(), b.ID())
		}
		enter.AddDuration(enterD)
		prev = checkCount(cl, body, prev, w.leave)
		r.progress(leaveName, len(cl.SamplesMs), s.n, "first answer %s ms (runsc %s %s ms, %s %s ms)",
			bench.FormatMs(bench.Ms(d)), w.leave, bench.FormatMs(bench.Ms(leaveD)), w.enter, bench.FormatMs(bench.Ms(enterD)))
	}
	return nil
}

// rawCycle puts the raw container into w's tier and brings it back: the
// command into the tier, the command out of it, and the first answer
// after it (polled from when the command out started).
func (r *runner) rawCycle(ctx context.Context, e *raw.Env, b *raw.Box, w rawWake, url string) (enterD, leaveD, d time.Duration, body string, err error) {
	var t0 time.Time
	var image string
	if w.enter == "pause" {
		_, enterD, err = e.Runsc(ctx, b, "pause", b.ID())
	} else {
		image, enterD, err = e.Checkpoint(ctx, b)
	}
	if err == nil {
		err = sleep(ctx, r.cfg.dwell)
	}
	if err == nil {
		if w.leave == "resume" {
			t0, leaveD, err = e.Runsc(ctx, b, "resume", b.ID())
		} else {
			t0, leaveD, err = e.Restore(ctx, b, image)
		}
	}
	if err == nil {
		d, _, body, err = r.rawFirstAnswer(ctx, url, t0)
	}
	return enterD, leaveD, d, body, err
}

// checkCount notes on cl an answer without the app's counter, or one
// whose counter did not survive the wake (it must be prev+1); it returns
// the counter now, -1 when unknown.
func checkCount(cl *bench.Series, body string, prev int, across string) int {
	count, ok := parseCount(body)
	switch {
	case !ok:
		cl.Note("answer %q has no count=N", bench.OneLine(body))
	case prev > 0 && count != prev+1:
		cl.Note("memory state lost: the app's counter went %d → %d across the %s", prev, count, across)
	}
	if !ok {
		return -1
	}
	return count
}
