package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
)

// The warm-start and clone series: sandboxes made by restoring a
// checkpoint rather than by starting the app. warm-start restores the
// image a warm template took when it was registered; clone restores one
// taken from a running parent.

// warmRequest is the registration of template def's warm copy as name:
// the same rootfs, process, ports, memory limit and principal, warmed up
// until GET probe on port answers, and reseeded by signal. Only the warm
// part differs, so that warm-start and start compare the same app.
func warmRequest(def api.Template, name string, port int, probe, signal string) api.TemplateRequest {
	return api.TemplateRequest{
		Name: name, RootfsDir: def.Rootfs, Process: def.Process, Ports: def.Ports,
		MemoryMiB: def.MemoryMiB, Principal: def.Principal,
		// A pool of one: the warm-pool series takes from it; warm-start's
		// named creates restore the image themselves, as ever.
		Warm: &api.Warm{Probe: api.Probe{Port: port, Path: probe}, Reseed: api.Reseed{Signal: signal}, Pool: 1},
	}
}

// registerWarm registers template t's warm copy (<its name>-warm) and
// returns its name and how long the registration took: the node starts the
// app, waits for the probe and checkpoints it before it answers, so this
// is the time the warm image took to make.
func (r *runner) registerWarm(ctx context.Context, t string) (string, time.Duration, error) {
	def, ok := r.tmplDef[t]
	if !ok {
		return "", 0, fmt.Errorf("template %s: its definition is unknown", t)
	}
	reg := r.tmpl[t] + "-warm"
	req := warmRequest(def, reg, r.cfg.port, r.cfg.warmProbe, r.cfg.reseedSignal)
	// The node bounds the probe by its ready timeout (30 s by default);
	// a minute more covers the start and the checkpoint.
	actx, cancel := context.WithTimeout(ctx, r.cfg.timeout+time.Minute)
	defer cancel()
	t0 := time.Now()
	_, err := r.c.CreateTemplate(actx, req)
	d := time.Since(t0)
	if err != nil {
		return "", d, fmt.Errorf("register the warm copy %s of %s: %w", reg, t, err)
	}
	r.ownTemplates = append(r.ownTemplates, reg)
	r.res.Params["template_"+t+"_warm"] = map[string]any{"registered_as": reg, "of": r.tmpl[t], "warm": req.Warm, "rootfs": req.RootfsDir}
	fmt.Fprintf(os.Stderr, "registered warm template %s in %s ms\n", reg, bench.FormatMs(bench.Ms(d)))
	return reg, d, nil
}

// measureWarmStart makes t's warm copy, recording how long that took, and
// then measures its starts exactly as measureStart measures the cold ones.
func (r *runner) measureWarmStart(ctx context.Context, t string) error {
	reg, ok := r.warmReg[t] // made once per run, in the first round
	if !ok {
		build := r.res.AddSeries("warm-image/"+t+"/api",
			"POST /v1/templates of the warm copy round trip: the node starts the app, waits for its probe (GET "+r.cfg.warmProbe+") and checkpoints it, once per run (client)", "")
		var d time.Duration
		var err error
		reg, d, err = r.registerWarm(ctx, t)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			build.Fail("%v", err)
			build.Skipped = err.Error()
			r.res.AddSeries("warm-start/"+t+"/client", r.warmKind("").clientDesc, seeds["warm-start/"+t+"/client"]).Skipped = "no warm template: " + err.Error()
			fmt.Fprintf(os.Stderr, "[warm-start/%s] skipped: %v\n", t, err)
			reg = ""
		} else {
			build.AddDuration(d)
		}
		r.warmReg[t] = reg
	}
	if reg == "" {
		return nil
	}
	if err := r.measureCreate(ctx, t, r.warmKind(reg)); err != nil {
		return err
	}
	return r.measureCreate(ctx, t, r.poolKind(reg))
}

// cloneCalls is how many requests a clone's parent answers before it is
// cloned, its first answer included: the demo's in-memory counter then
// stands at cloneCalls, and a child, restored from that memory, must
// answer cloneCalls+1.
const cloneCalls = 4

// measureClone makes a parent of template t, calls it, and clones it into
// --clone-n children, --clone-rounds times (a new parent each time). It
// records the node's own figures (the parent's pause, each child's time),
// the clone call as the client sees it, and each child's first answer
// through the gateway, which must count on from the parent's. Every
// sandbox it made is deleted before the next round.
func (r *runner) measureClone(ctx context.Context, t string) error {
	name := "clone/" + t
	k := r.cfg.cloneN
	call := r.res.AddSeries(name+"/api",
		fmt.Sprintf("POST /v1/sandboxes/{id}/clone {count: %d} round trip: the parent's pause and every child's restore and reseed, one after another (client)", k), "")
	pause := r.res.AddSeries(name+"/parent-pause",
		"how long the parent was paused (parent_pause_ms: pause, runsc checkpoint --leave-running, copy of its volume, resume), one sample per clone (node)", "")
	child := r.res.AddSeries(name+"/child",
		"each child's own time (child_ms: rootfs, network, boundary, runsc restore of the clone image, reseed), one sample per child (node)", "")
	first := r.res.AddSeries(name+"/child-first-answer",
		"GET / through the gateway to each child once the clone call has returned, polled every "+r.cfg.poll.String()+" (client; children one after another, each timed on its own)", "")
	s := &series{r: r, main: call, name: name, n: r.upTo(r.cfg.cloneRounds)}
	if s.done() {
		return nil // this pass has no share of it
	}
	mem := r.mem.get(t, "clone-child")
	reseed := &api.Reseed{Signal: r.cfg.reseedSignal}
	for !s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		parent, url, prev, err := r.cloneParent(ctx, t)
		if err != nil {
			if parent.ID != "" {
				r.remove(ctx, parent.ID)
			}
			if stop, serr := s.miss(ctx, "parent: %v", err); stop {
				return serr
			}
			continue
		}
		t0 := time.Now()
		res, err := r.c.Clone(ctx, parent.ID, api.CloneRequest{Count: k, Reseed: reseed})
		d := time.Since(t0)
		if err != nil {
			// Children made before a failure stay: find them by name.
			if rerr := r.removeClone(ctx, parent); rerr != nil {
				call.Note("cleanup after a failed clone: %v", rerr)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ae *client.Error
			if errors.As(err, &ae) && ae.Body.Code == api.CodeNotSupported {
				call.Skipped = fmt.Sprintf("the daemon cannot clone: %v", err)
				return nil
			}
			if s.fail("clone: %v", err) {
				return nil
			}
			continue
		}
		for _, c := range res.Children {
			r.sandboxes[c.ID] = true
		}
		s.ok()
		call.AddDuration(d)
		pause.Add(res.ParentPauseMs)
		for _, ms := range res.ChildMs {
			child.Add(ms)
		}
		if len(res.Children) != k || len(res.ChildMs) != k {
			call.Note("asked for %d children, got %d (and %d child times)", k, len(res.Children), len(res.ChildMs))
		}
		firsts, err := r.childFirsts(ctx, res.Children, prev, first, mem)
		if err != nil {
			return err
		}
		// The parent keeps serving from its own memory, as if not cloned.
		if status, body, _, err := r.get(ctx, url); err != nil || status != http.StatusOK {
			call.Note("the parent did not answer after the clone: HTTP %d, %v", status, err)
		} else if n, ok := parseCount(body); !ok || n != prev+1 {
			call.Note("the parent answered %q after the clone, want count=%d", bench.OneLine(body), prev+1)
		}
		var childMs []string
		for _, ms := range res.ChildMs {
			childMs = append(childMs, bench.FormatMs(ms))
		}
		r.progress(name, len(call.SamplesMs), s.n, "clone of %d: call %s ms, parent paused %s ms, children [%s] ms, first answers [%s] ms",
			k, bench.FormatMs(bench.Ms(d)), bench.FormatMs(res.ParentPauseMs), strings.Join(childMs, " "), strings.Join(firsts, " "))
		for _, c := range res.Children {
			if err := r.remove(ctx, c.ID); err != nil {
				call.Note("%v", err)
			}
		}
		if err := r.remove(ctx, parent.ID); err != nil {
			call.Note("%v", err)
		}
	}
	return nil
}

// cloneParent is a hot parent of template t that has answered
// cloneCalls requests, and its address; prev is its counter.
func (r *runner) cloneParent(ctx context.Context, t string) (parent api.Sandbox, url string, prev int, err error) {
	parent, err = r.ready(ctx, "clone", t)
	if err == nil {
		url, _ = r.endpoint(parent)
		if prev, err = r.calls(ctx, url, cloneCalls-1); err == nil && prev != cloneCalls {
			err = fmt.Errorf("the parent counted %d requests, want %d", prev, cloneCalls)
		}
	}
	if err == nil {
		err = r.ensureHot(ctx, parent.ID)
	}
	return parent, url, prev, err
}

// childFirsts times each child's first answer through the gateway, one
// after another, and checks that it counts on from the parent's memory
// (prev+1). It returns the times as text; an error only when ctx ends.
func (r *runner) childFirsts(ctx context.Context, children []api.Sandbox, prev int, first *bench.Series, mem *memSeries) ([]string, error) {
	var firsts []string
	for i, c := range children {
		curl, err := r.endpoint(c)
		var d1 time.Duration
		var body string
		if err == nil {
			d1, _, body, err = r.firstAnswer(ctx, curl, time.Now())
		}
		if err != nil {
			if ctx.Err() != nil {
				return firsts, ctx.Err()
			}
			first.Fail("child %d (%s): %v", i+1, c.Name, err)
			continue
		}
		first.AddDuration(d1)
		firsts = append(firsts, bench.FormatMs(bench.Ms(d1)))
		if r.nodeRunsc != nil {
			mem.read(ctx, r.nodeRunsc, c.ID)
		}
		if n, ok := parseCount(body); !ok || n != prev+1 {
			first.Note("a child's first answer was %q, want count=%d (the parent's memory, counting on)", bench.OneLine(body), prev+1)
		}
	}
	return firsts, nil
}

// calls sends n GET / to url, each of which must answer 200 with the
// demo's count, and returns the last count.
func (r *runner) calls(ctx context.Context, url string, n int) (int, error) {
	count := 0
	for i := 0; i < n; i++ {
		status, body, _, err := r.get(ctx, url)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("HTTP %d: %s", status, bench.OneLine(body))
		}
		if err != nil {
			return 0, fmt.Errorf("call %d: %w", i+1, err)
		}
		c, ok := parseCount(body)
		if !ok {
			return 0, fmt.Errorf("call %d: answer %q has no count=N", i+1, bench.OneLine(body))
		}
		count = c
	}
	return count, nil
}

// cloneChildren are the sandboxes of all that the node names as children
// of parent: "<parent>-<n>" (node.Clone's childName; the benchmark's names
// are short enough never to be cut).
func cloneChildren(parent string, all []api.Sandbox) []api.Sandbox {
	var out []api.Sandbox
	for _, sb := range all {
		rest, ok := strings.CutPrefix(sb.Name, parent+"-")
		if ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			out = append(out, sb)
		}
	}
	return out
}

// removeClone deletes parent and whatever children of it a failed clone
// left.
func (r *runner) removeClone(ctx context.Context, parent api.Sandbox) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	all, err := r.c.Sandboxes(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list sandboxes: %w", err))
	}
	for _, c := range cloneChildren(parent.Name, all) {
		r.sandboxes[c.ID] = true
		if err := r.remove(ctx, c.ID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.remove(ctx, parent.ID); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
