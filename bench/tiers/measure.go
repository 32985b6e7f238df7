package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
	"sandstorm/internal/gateway"
	"sandstorm/internal/netns"
	"sandstorm/internal/node"
	"sandstorm/internal/sandbox/gvisor"
)

// seeds are the Sandstorm seed's published figures, shown beside ours. The
// seed timed wakes on the node ("no network in the path") and starts from a
// client polling every 50 ms.
var seeds = map[string]string{
	"warm-start/web/client":    "159 ms p50 (seed's warm template)",
	"warm-start/app64/client":  "168 ms p50 (seed's warm template)",
	"start/web/client":         "167 ms p50 (polled every 50 ms)",
	"start/app64/client":       "289 ms p50 (polled every 50 ms)",
	"start/app64/node":         "of the 289: 37 master+network, 5 bundle, 55 runsc",
	"hot/web/client":           "3.8 ms (timed on the node)",
	"hot/app64/client":         "3.8 ms (timed on the node)",
	"wake-frozen/web/node":     "~10 ms (tier table)",
	"wake-frozen/app64/node":   "11 ms thaw",
	"wake-frozen/app64/client": "~100 ms total, incl. zswap read-back",
	"wake-snapshot/web/node":   "~0.2 s (tier table)",
	"wake-snapshot/app64/node": "200–230 ms (64 MiB heap)",
}

// tierOp is a tier a sandbox is put into, and how.
type tierOp struct {
	tier api.Tier
	op   string // the API transition
	// keepsMemory: the app's in-memory counter must survive the wake.
	keepsMemory bool
}

var tierOps = map[string]tierOp{
	"frozen":   {api.TierFrozen, "freeze", true},
	"snapshot": {api.TierSnapshot, "snapshot", true},
	"detached": {api.TierDetached, "detach", false},
}

// measureAll runs the chosen measurements for every template, writing the
// results after each so a long run keeps what it has. It runs them in
// --rounds rounds, each taking its share of every series' samples, so that
// a series and the raw baseline it is compared with are measured close
// together in time all through the run: this machine's speed drifts over
// minutes (the web start ratio moved between 0.79 and 1.27 across runs
// that measured each series in one block). Within a round, --interleave
// passes each take a share again, template by template with every series
// next to its raw baseline (allSeries lists them so), so that a series
// and its baseline alternate every few samples: in 1369389's run, where
// they were measured in blocks of 20, the 64 MiB app's start ratio moved
// from 0.95 to 1.18 between rounds while its speed drifted by 1.37 ×.
func (r *runner) measureAll(ctx context.Context) error {
	for r.round = 1; r.round <= r.cfg.rounds; r.round++ {
		if r.cfg.rounds > 1 {
			fmt.Fprintf(os.Stderr, "round %d of %d\n", r.round, r.cfg.rounds)
		}
		for r.pass = 1; r.pass <= r.cfg.interleave; r.pass++ {
			for _, t := range r.cfg.templates {
				for _, m := range allSeries {
					if !r.cfg.wants(m) {
						continue
					}
					if r.pass == 1 {
						r.res.Note("load average before %s/%s (round %d): %s", m, t, r.round, loadavg())
					}
					if err := r.measureOne(ctx, m, t); err != nil {
						return err
					}
				}
			}
		}
		r.endRound()
	}
	return nil
}

// measureOne runs this pass's share of series m of template t, and writes
// the results so far.
func (r *runner) measureOne(ctx context.Context, m, t string) error {
	var err error
	switch m {
	case "warm-start":
		err = r.measureWarmStart(ctx, t)
	case "start":
		err = r.measureStart(ctx, t)
	case "clone":
		err = r.measureClone(ctx, t)
	case "hot":
		err = r.measureHot(ctx, t)
	case "raw-start":
		err = r.measureRawStart(ctx, t)
	case "raw-hot":
		err = r.measureRawHot(ctx, t)
	case "raw-pause":
		err = r.measureRawWake(ctx, t, rawPause)
	case "raw-restore":
		err = r.measureRawWake(ctx, t, rawRestore)
	default:
		err = r.measureWake(ctx, t, tierOps[m])
	}
	if werr := r.write(); werr != nil {
		return werr
	}
	return err
}

// endRound marks the end of a round on every series.
func (r *runner) endRound() {
	for _, s := range r.res.Series {
		s.EndRound()
	}
	for _, s := range r.mem.list {
		s.RoundEnds = append(s.RoundEnds, len(s.SamplesMiB))
	}
}

// upTo is how many samples a series of total samples has at the end of
// the current pass of the current round: its share so far, rounded up.
func (r *runner) upTo(total int) int {
	return upTo(total, (r.round-1)*r.cfg.interleave+r.pass, r.cfg.rounds*r.cfg.interleave)
}

// upTo is total's share of samples at the end of step of steps (passes
// over all rounds), rounded up, so that the last step ends at total.
func upTo(total, step, steps int) int {
	return (total*step + steps - 1) / steps
}

// series is one measurement's bookkeeping of failed attempts.
type series struct {
	r           *runner
	main        *bench.Series
	name        string
	n           int
	consecutive int
}

// fail records a failed attempt on main and reports whether the series
// must stop: after --max-failures failures in a row, or more failures than
// twice the samples wanted. The reason is then in main.Skipped.
func (s *series) fail(format string, args ...any) (stop bool) {
	msg := fmt.Sprintf(format, args...)
	s.main.Fail("%s", msg)
	s.consecutive++
	fmt.Fprintf(os.Stderr, "[%s] attempt failed: %s\n", s.name, msg)
	switch {
	case s.consecutive >= s.r.cfg.maxConsecutiveFailures:
		s.main.Skipped = fmt.Sprintf("stopped after %d failed attempts in a row (last: %s)", s.consecutive, msg)
		return true
	case len(s.main.Failures) > 2*s.n:
		s.main.Skipped = fmt.Sprintf("stopped after %d failed attempts", len(s.main.Failures))
		return true
	}
	return false
}

// miss is fail for an attempt that ended in error inside a run: a run
// being stopped (its context done) is not a failed sample, so it stops the
// series with the context's error; otherwise stop says whether fail gave
// up on the series (its Skipped says why), and serr is nil.
func (s *series) miss(ctx context.Context, format string, args ...any) (stop bool, serr error) {
	if ctx.Err() != nil {
		return true, ctx.Err()
	}
	return s.fail(format, args...), nil
}

// skip ends the series before its first sample, for err (a sandbox that
// never became ready, say): the run's end stops the run with the
// context's error; anything else is why the series was skipped, and the
// run goes on.
func (s *series) skip(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.main.Skipped = err.Error()
	return nil
}

func (s *series) ok() { s.consecutive = 0 }

func (s *series) done() bool { return len(s.main.SamplesMs) >= s.n }

func (r *runner) progress(name string, i, n int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s %d/%d] %s\n", name, i, n, fmt.Sprintf(format, args...))
}

// createKind is what a start series creates sandboxes of: the template
// itself (start) or its warm copy (warm-start). Both are measured by the
// same code, so that they differ only in the template.
type createKind struct {
	series   string // series prefix: start or warm-start
	template string // the template's name on the daemon
	memory   string // runtime of its memory series (see memDescriptions)
	// pooled: create without a name, once the template's warm pool is
	// full, so that each sample takes a pooled sandbox.
	pooled bool
	// clientDesc, apiDesc, nodeDesc describe the three series.
	clientDesc, apiDesc, nodeDesc string
}

// coldKind is the start series of template t.
func (r *runner) coldKind(t string) createKind {
	return createKind{
		series: "start", template: r.tmpl[t], memory: "sandstormd",
		clientDesc: "POST /v1/sandboxes sent → first HTTP 200 from the sandbox's gateway endpoint (client; polled every " + r.cfg.poll.String() + "; includes the API call)",
		apiDesc:    "POST /v1/sandboxes round trip: the API answers once the container runs, before the app listens (client)",
		nodeDesc:   "the node's own time for the create (last_wake_ms of the new sandbox: rootfs, network, runsc start; not the app's start-up)",
	}
}

// warmKind is the warm-start series of template t, whose warm copy is
// registered on the daemon as reg.
func (r *runner) warmKind(reg string) createKind {
	return createKind{
		series: "warm-start", template: reg, memory: "warm",
		clientDesc: "POST /v1/sandboxes of the warm copy sent → first HTTP 200 from the sandbox's gateway endpoint (client; polled every " + r.cfg.poll.String() + "; includes the API call); compare start/…/client",
		apiDesc:    "POST /v1/sandboxes round trip of the warm copy: the API answers once the warm image is restored and reseeded (client)",
		nodeDesc:   "the node's own time for the warm create (last_wake_ms of the new sandbox: rootfs, network, boundary, runsc restore of the warm image, reseed)",
	}
}

// poolKind is the warm-pool series of template t's warm copy reg: the same
// creates, without a name, each taken from the warm pool.
func (r *runner) poolKind(reg string) createKind {
	return createKind{
		series: "warm-pool", template: reg, memory: "warm-pool", pooled: true,
		clientDesc: "POST /v1/sandboxes of the warm copy, no name, with its warm pool full, sent → first HTTP 200 from the sandbox's gateway endpoint (client; polled every " + r.cfg.poll.String() + "; includes the API call); compare start/…/client",
		apiDesc:    "POST /v1/sandboxes round trip of a pooled create: the API answers once the pooled sandbox is resumed and reseeded (client)",
		nodeDesc:   "the node's own time for the pooled create (last_wake_ms: boundary, runsc resume, reseed, gateway listener)",
	}
}

// waitPool waits until template t's warm pool holds a sandbox,
// bounded by the run's timeout: a pooled sample must take from a full
// pool, not race its refill (which is not what the sample times).
func (r *runner) waitPool(ctx context.Context, t string) error {
	deadline := time.Now().Add(r.cfg.timeout)
	for {
		st, err := r.c.Node(ctx)
		if err == nil && st.WarmPool[t] > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool of %s did not refill within %v (last: %v, %d pooled)", t, r.cfg.timeout, err, st.WarmPool[t])
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// measureStart times POST /v1/sandboxes to the first 200 from the gateway.
func (r *runner) measureStart(ctx context.Context, t string) error {
	return r.measureCreate(ctx, t, r.coldKind(t))
}

// measureCreate times POST /v1/sandboxes of k.template to the first 200
// from the gateway, and reads the new sandbox's memory then.
func (r *runner) measureCreate(ctx context.Context, t string, k createKind) error {
	name := k.series + "/" + t
	cl := r.res.AddSeries(name+"/client", k.clientDesc, seeds[name+"/client"])
	apiS := r.res.AddSeries(name+"/api", k.apiDesc, seeds[name+"/api"])
	node := r.res.AddSeries(name+"/node", k.nodeDesc, seeds[name+"/node"])
	cpu := r.res.AddSeries(name+"/sandbox-cpu", cpuDesc, "")
	dcpu := r.daemonCPUSeries(name)
	s := &series{r: r, main: cl, name: name, n: r.upTo(r.cfg.startN)}
	if s.done() {
		return nil // this pass has no share of it
	}
	polls := map[int]int{}
	for !s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		req := api.SandboxRequest{Template: k.template, Name: r.sandboxName(k.series, t)}
		if k.pooled {
			if err := r.waitPool(ctx, k.template); err != nil {
				if s.fail("%v", err) {
					return nil
				}
				continue
			}
			req.Name = "" // only an unnamed create takes from the pool
		}
		dc0, dcOK := r.daemonCPU()
		t0 := time.Now()
		sb, err := r.c.CreateSandbox(ctx, req)
		apiD := time.Since(t0)
		if err != nil {
			if stop, serr := s.miss(ctx, "create: %v", err); stop {
				return serr
			}
			continue
		}
		r.sandboxes[sb.ID] = true
		r.noteLimit(t, sb)
		url, err := r.endpoint(sb)
		var d time.Duration
		var attempts int
		var body string
		if err == nil {
			d, attempts, body, err = r.firstAnswer(ctx, url, t0)
		}
		if err == nil {
			r.addDaemonCPU(dcpu, dc0, dcOK)
		}
		if err == nil && r.nodeRunsc != nil {
			r.readCPU(cpu, r.nodeRunsc, sb.ID)
			r.mem.get(t, k.memory).read(ctx, r.nodeRunsc, sb.ID)
		}
		if err != nil {
			r.remove(ctx, sb.ID)
			if stop, serr := s.miss(ctx, "%v", err); stop {
				return serr
			}
			continue
		}
		s.ok()
		cl.AddDuration(d)
		apiS.AddDuration(apiD)
		if sb.LastWakeMs > 0 {
			node.Add(sb.LastWakeMs)
		} else {
			node.Fail("the created sandbox reports no last_wake_ms")
		}
		polls[attempts]++
		if c, ok := parseCount(body); !ok || c != 1 {
			cl.Note("first answer %q: want count=1 from a fresh sandbox", strings.TrimSpace(body))
		}
		r.progress(name, len(cl.SamplesMs), s.n, "first answer %s ms (API %s ms, node %s ms, %d poll(s))",
			bench.FormatMs(bench.Ms(d)), bench.FormatMs(bench.Ms(apiD)), bench.FormatMs(sb.LastWakeMs), attempts)
		if err := r.remove(ctx, sb.ID); err != nil {
			cl.Note("delete after the sample: %v", err)
		}
	}
	keys := make([]int, 0, len(polls))
	for k := range polls {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d poll(s) ×%d", k, polls[k]))
	}
	cl.Note("requests until the first 200: %s", strings.Join(parts, ", "))
	return nil
}

// measureHot times GET / through the gateway to a sandbox that stays hot.
func (r *runner) measureHot(ctx context.Context, t string) error {
	name := "hot/" + t
	cl := r.res.AddSeries(name+"/client",
		"GET / through the gateway to a hot sandbox, new TCP connection each request (client)", seeds[name+"/client"])
	s := &series{r: r, main: cl, name: name, n: r.upTo(r.cfg.hotN)}
	if s.done() {
		return nil // this pass has no share of it
	}
	sb, err := r.ready(ctx, "hot", t)
	if err != nil {
		return s.skip(ctx, err)
	}
	defer r.remove(ctx, sb.ID)
	url, _ := r.endpoint(sb)
	return r.timeHot(ctx, s, url, func() error { return r.ensureHot(ctx, sb.ID) })
}

// timeHot is the hot series' loop, through the gateway or straight to a
// raw sandbox: after --hot-warmup unrecorded requests, it times GET url
// into s until s is done. check, if set, runs before each request; an
// error from it is a failed attempt.
func (r *runner) timeHot(ctx context.Context, s *series, url string, check func() error) error {
	for range r.cfg.hotWarmup {
		r.get(ctx, url)
	}
	for !s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if check != nil {
			if err := check(); err != nil {
				if s.fail("%v", err) {
					return nil
				}
				continue
			}
		}
		status, body, d, err := r.get(ctx, url)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("HTTP %d: %s", status, bench.OneLine(body))
		}
		if err != nil {
			if stop, serr := s.miss(ctx, "GET /: %v", err); stop {
				return serr
			}
			continue
		}
		s.ok()
		s.main.AddDuration(d)
		if i := len(s.main.SamplesMs); i%20 == 0 || i == s.n {
			r.progress(s.name, i, s.n, "%s ms", bench.FormatMs(bench.Ms(d)))
		}
	}
	return nil
}

// daemonCPUSeries is series name's daemon-cpu companion, nil when the run
// does not know the daemon's process (it did not --start it).
func (r *runner) daemonCPUSeries(name string) *bench.Series {
	if r.daemonPID == 0 {
		return nil
	}
	return r.res.AddSeries(name+"/daemon-cpu", daemonCPUDesc, "")
}

// daemonCPU is sandstormd's own CPU so far; ok is false without a daemon
// process to read.
func (r *runner) daemonCPU() (d time.Duration, ok bool) {
	if r.daemonPID == 0 {
		return 0, false
	}
	d, err := bench.ProcessCPU(r.daemonPID)
	return d, err == nil
}

// addDaemonCPU records on s what sandstormd ran since reading before.
func (r *runner) addDaemonCPU(s *bench.Series, before time.Duration, ok bool) {
	if s == nil {
		return
	}
	now, nowOK := r.daemonCPU()
	if !ok || !nowOK {
		s.Fail("sandstormd's CPU (pid %d) could not be read", r.daemonPID)
		return
	}
	s.AddDuration(now - before)
}

// daemonCPUDesc describes the daemon-cpu series: what the node itself
// spends beside a sandbox's start or wake, on the same two cores.
const daemonCPUDesc = "CPU time sandstormd's own process (every thread: API, store, gateway, boundary, logs; not the runsc commands it runs) used over the same interval as the client series, from /proc/<pid>/task/*/schedstat"

// cpuDesc and restoreCPUDesc describe the sandbox-cpu series.
const (
	cpuDesc        = "CPU time the sandbox used from its start to its first answer: its cgroup's (sentry, gofer, stubs; cpuacct.usage), read right after that answer"
	restoreCPUDesc = "CPU time the restored sandbox used from its restore to its first answer: its cgroup's, read right after that answer"
)

// readCPU records the CPU time sandbox id (under be's root) has used, or
// why it could not be read (a failure here never fails the time sample).
func (r *runner) readCPU(s *bench.Series, be *gvisor.Backend, id string) {
	d, err := be.CPU(id)
	if err != nil {
		s.Fail("read its CPU: %v", err)
		return
	}
	s.AddDuration(d)
}

// settled waits until the node has removed snapshot sandbox id's stopped
// container and its network namespace, and returns the time since
// answered (the snapshot's answer).
func (r *runner) settled(ctx context.Context, id string, answered time.Time) (time.Duration, error) {
	nw := netns.Net{Name: node.NetnsPrefix + id, HostIf: node.VethPrefix + id}
	deadline := time.Now().Add(r.cfg.timeout)
	for r.nodeRunsc.Has(id) || nw.Exists() {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the node still had sandbox %s's stopped container (%v) or namespace (%v) %v after its snapshot", id, r.nodeRunsc.Has(id), nw.Exists(), r.cfg.timeout)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return 0, err
		}
	}
	return time.Since(answered), nil
}

// sandboxName returns a unique, recognisable sandbox name for this run.
func (r *runner) sandboxName(purpose, t string) string {
	r.seq++
	return fmt.Sprintf("bench-%s-%s-%s-%d", r.runID, purpose, t, r.seq)
}

// ready creates a sandbox for a series and waits for its first answer.
func (r *runner) ready(ctx context.Context, purpose, t string) (api.Sandbox, error) {
	t0 := time.Now()
	sb, err := r.c.CreateSandbox(ctx, api.SandboxRequest{Template: r.tmpl[t], Name: r.sandboxName(purpose, t)})
	if err != nil {
		return sb, fmt.Errorf("create a %s sandbox: %w", t, err)
	}
	r.sandboxes[sb.ID] = true
	r.noteLimit(t, sb)
	url, err := r.endpoint(sb)
	if err == nil {
		_, _, _, err = r.firstAnswer(ctx, url, t0)
	}
	if err != nil {
		r.remove(ctx, sb.ID)
		return sb, fmt.Errorf("a new %s sandbox never answered: %w", t, err)
	}
	return sb, nil
}

// noteLimit remembers the memory limit the daemon gave a sandbox of
// template t, for the raw sandboxes of t.
func (r *runner) noteLimit(t string, sb api.Sandbox) {
	if sb.MemoryMiB > 0 {
		r.limitMiB[t] = sb.MemoryMiB
	}
}

// ensureHot makes sure the sandbox is hot before a sample (an idle timer of
// a daemon that is not ours may have moved it); it wakes it through the API
// if not, and reports that as an error so the attempt is not counted.
func (r *runner) ensureHot(ctx context.Context, id string) error {
	sb, err := r.c.Sandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("get sandbox: %w", err)
	}
	if sb.Tier == api.TierHot && sb.Transition == "" {
		return nil
	}
	if _, err := r.c.Transition(ctx, id, "wake"); err != nil {
		return fmt.Errorf("sandbox was %s before the sample, and waking it failed: %w", sb.Tier, err)
	}
	return fmt.Errorf("sandbox was %s (note: %q) before the sample, not hot; woken through the API", sb.Tier, sb.Note)
}

// remove deletes a sandbox the run made.
func (r *runner) remove(ctx context.Context, id string) error {
	if ctx.Err() != nil {
		return ctx.Err() // cleanup deletes it
	}
	if err := r.c.DeleteSandbox(ctx, id); err != nil && client.StatusOf(err) != http.StatusNotFound {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	delete(r.sandboxes, id)
	return nil
}

// endpoint is the gateway URL of the measured port of sb.
func (r *runner) endpoint(sb api.Sandbox) (string, error) {
	u, ok := sb.Endpoints[strconv.Itoa(r.cfg.port)]
	if !ok {
		return "", fmt.Errorf("sandbox %s has no gateway endpoint for port %d (endpoints: %v); see --port", sb.ID, r.cfg.port, sb.Endpoints)
	}
	return strings.TrimRight(u, "/") + "/", nil
}

// get sends one GET on a new TCP connection and reads the whole answer; d
// runs from sending the request to the end of the body.
func (r *runner) get(ctx context.Context, url string) (status int, body string, d time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", 0, err
	}
	t0 := time.Now()
	resp, err := r.gw.Do(req)
	if err != nil {
		return 0, "", time.Since(t0), err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode, string(b), time.Since(t0), err
}

// firstAnswer polls url every cfg.poll (an attempt starts at most every
// poll; a slow attempt is followed at once by the next) until it answers
// 200, and returns the time since t0, the number of attempts and the body.
func (r *runner) firstAnswer(ctx context.Context, url string, t0 time.Time) (time.Duration, int, string, error) {
	return r.firstAnswerEvery(ctx, url, t0, func(time.Duration) time.Duration { return r.cfg.poll })
}

// rawFirstAnswer is firstAnswer for a raw sandbox's own address, polled
// on the gateway's own schedule (gateway.DialInterval). A poll through
// the gateway costs the sandbox nothing (the gateway holds it and dials
// the sandbox on that schedule), but a poll straight at a starting
// sandbox is a refused connect its sentry answers on the CPU the program
// needs (≈ 0.75 ms each): polled every 10 ms, a raw web start took
// 494 ms of sandbox CPU against the node's 391
// (bench/results/2026-12-03-2c44e15-systrap), a baseline slowed by its
// own client. Polled as the gateway dials, raw runsc is given the same
// best a client can do.
func (r *runner) rawFirstAnswer(ctx context.Context, url string, t0 time.Time) (time.Duration, int, string, error) {
	return r.firstAnswerEvery(ctx, url, t0, gateway.DialInterval)
}

// firstAnswerEvery is firstAnswer with the interval after elapsed time
// given by every.
func (r *runner) firstAnswerEvery(ctx context.Context, url string, t0 time.Time, every func(elapsed time.Duration) time.Duration) (time.Duration, int, string, error) {
	deadline := t0.Add(r.cfg.timeout)
	var last string
	for attempt := 1; ; attempt++ {
		start := time.Now()
		status, body, _, err := r.get(ctx, url)
		if err == nil && status == http.StatusOK {
			return time.Since(t0), attempt, body, nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("HTTP %d: %s", status, bench.OneLine(body))
		}
		if ctx.Err() != nil {
			return 0, attempt, "", ctx.Err()
		}
		next := start.Add(every(time.Since(t0)))
		if next.After(deadline) {
			return 0, attempt, "", fmt.Errorf("no HTTP 200 from %s within %s (%d attempts; last: %s)", url, r.cfg.timeout, attempt, last)
		}
		select {
		case <-time.After(time.Until(next)):
		case <-ctx.Done():
			return 0, attempt, "", ctx.Err()
		}
	}
}

// sleep waits d (nothing for d <= 0) unless ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parseCount reads N from the demo app's "count=N pid=P…" answer.
func parseCount(body string) (int, bool) {
	for _, f := range strings.Fields(body) {
		if v, ok := strings.CutPrefix(f, "count="); ok {
			n, err := strconv.Atoi(v)
			return n, err == nil
		}
	}
	return 0, false
}
