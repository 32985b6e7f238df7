// Command fill is issue 8's "one node, 10,000 sandboxes": it fills a node
// with tiered Python HTTP servers (the demo's web server, idle timers
// shortened as the seed's runs did), then calls a random sample of them
// and reports how many answered and the p50/p99 of those calls — with a
// timeline of tiers, memory, disk and the daemon's file descriptors while
// it filled, the machine, the commit and every raw sample, in
// bench/results/fill-<date>-<commit>.
//
//	sudo go run ./bench/fill                      # 10,000 sandboxes, 1,000 calls
//	sudo go run ./bench/fill --count 200 --calls 50
//	sudo go run ./bench/fill --awake --warm=false --parallel 2
//	sudo go run ./bench/fill --awake --warm=false --parallel 2 --node-mib 1812
//
// With --awake it measures density with every sandbox hot (issue 19):
// idle timers off, it creates until the node turns a create away with
// nothing else starting, or pushes a sandbox off memory to make room, then calls every sandbox, and
// reports how many there were, what each cost the host (MemAvailable's
// drop per sandbox, and its memory cgroup), and the refusal that ended
// it with the node's log line for it.
//
// It is bounded: creates stop at --count or after --fill-for, whichever
// comes first. It starts its own sandstormd (built from the tree; runsc
// is bin/runsc, from make runsc) on a temporary data dir and removes
// everything it made when it is done, Ctrl-C included.
package main

import (
	"context"
	crand "crypto/rand"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/bench/raw"
	"sandstorm/internal/client"
	"sandstorm/internal/memguard"
	"sandstorm/internal/reclaim"
	"sandstorm/internal/sandbox/gvisor"
)

type config struct {
	count, calls, parallel, callParallel int
	nodeMiB                              int64
	warm, awake                          bool
	raw                                  int
	fillFor, callTimeout, sample         time.Duration
	runsc, subnet, gwPorts               string
	bench.Flags
	timers bench.IdleTimers
}

func main() {
	var c config
	fs := flag.NewFlagSet("fill", flag.ContinueOnError)
	fs.IntVar(&c.count, "count", 10000, "sandboxes to create")
	fs.IntVar(&c.calls, "calls", 1000, "sandboxes picked at random and called once the node is full")
	fs.IntVar(&c.parallel, "parallel", 4, "creates at a time")
	fs.IntVar(&c.callParallel, "call-parallel", 8, "calls at a time")
	fs.BoolVar(&c.warm, "warm", true, "create from a warm template (a restore of one image); false: cold starts")
	fs.IntVar(&c.raw, "raw", 0, "before the fill, this many raw runsc web sandboxes side by side (the node's bundle and network, no sandstormd), for the host's cost per idle hot sandbox next to the node's")
	fs.BoolVar(&c.awake, "awake", false, "density with every sandbox hot: idle timers off, create until the node refuses one with nothing else starting (a 503 while others start is retried, at most 50 times) or pushes one off memory, then call every one (--count bounds it; --calls is ignored)")
	fs.Int64Var(&c.nodeMiB, "node-mib", 0, "give the node only this many MiB for sandboxes: sandstormd's --memory-reserve is set to MemAvailable at the start less this, so a fill reaches the node's memory bound before this machine's two cores are the limit (0: the whole machine, reserve 256 MiB)")
	fs.DurationVar(&c.fillFor, "fill-for", 45*time.Minute, "stop creating after this long")
	fs.DurationVar(&c.callTimeout, "call-timeout", time.Minute, "a call that has no answer by then (503s retried as Retry-After says) did not answer")
	fs.DurationVar(&c.sample, "sample", 10*time.Second, "timeline sampling interval")
	c.timers.Register(fs, "sandstormd")
	c.Flags.Register(fs)
	fs.StringVar(&c.runsc, "runsc", "bin/runsc", "runsc binary (make runsc)")
	fs.StringVar(&c.subnet, "subnet", "10.150.0.0/16", "sandbox subnet (16,382 slots in a /16); must be unused on this host")
	fs.StringVar(&c.gwPorts, "gateway-ports", "20000-30999", "gateway port range: one port per sandbox, below the ephemeral range")
	bench.ParseFlags(fs, func() error {
		if c.count < 1 || c.calls < 0 || c.parallel < 1 || c.callParallel < 1 || c.nodeMiB < 0 {
			return bench.ErrBadArguments
		}
		return nil
	})
	if c.awake {
		c.timers = bench.IdleTimers{}
	}
	bench.Main("fill", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

// sample is one point of the timeline.
type sample struct {
	At       time.Duration
	Created  int
	Tiers    map[api.Tier]int
	AvailMiB int64
	DiskMiB  int64 // used under the data dir's filesystem, since the start
	FDs      int   // the daemon's open file descriptors
	RSSMiB   int64 // the daemon's resident memory
}

func run(ctx context.Context, c config) (string, error) {
	title := fmt.Sprintf("One node, %d tiered sandboxes: fill, then call %d at random", c.count, c.calls)
	if c.awake {
		title = "One node, every sandbox hot: fill until the node refuses, then call every one"
	}
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/fill", Title: title,
		Out: c.Out, Repo: c.Repo, Prefix: "fill-", Runsc: c.runsc, Demo: "web", Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer br.Close()
	f := &fillRun{c: c, br: br, res: br.Results, data: filepath.Join(br.Work, "d")}
	err = f.start(ctx)
	if f.sd != nil {
		defer cleanup(f.cl, f.sd, f.data, c.subnet)
	}
	if err != nil {
		return "", err
	}
	f.base = sampleNow(ctx, f.cl, f.pid, f.data, 0, 0, nil)
	fmt.Fprintf(os.Stderr, "machine: %s\nfilling to %d sandboxes, %d at a time (warm %v); MemAvailable %d MiB\n", f.res.Machine, c.count, c.parallel, c.warm, f.base.AvailMiB)
	f.startSampler(ctx)
	if err := f.fill(ctx); err != nil || ctx.Err() != nil {
		return f.finish()
	}
	f.callSample(ctx)
	return f.finish()
}

// fillRun is one run: the daemon, the sandboxes made, the timeline.
type fillRun struct {
	c    config
	br   *bench.Run
	res  *bench.Results
	data string
	sd   *bench.Sandstormd
	cl   *client.Client
	pid  int
	base sample

	mu          sync.Mutex
	sbs         []api.Sandbox
	timeline    []sample
	created     atomic.Int64
	start0      time.Time
	stopSampler chan struct{}
	samplerDone chan struct{}
}

// start starts the daemon (bounded to --node-mib if given), the web
// template, and measures raw runsc's cost if asked.
func (f *fillRun) start(ctx context.Context) error {
	c, br := f.c, f.br
	args := append([]string{"--runsc", br.Runsc, "--subnet", c.subnet, "--gateway-ports", c.gwPorts, "--log-level", "warn"},
		c.timers.Args()...)
	if c.nodeMiB > 0 {
		avail, err := memguard.AvailableMiB()
		if err != nil {
			return err
		}
		if avail-c.nodeMiB < 256 {
			return fmt.Errorf("--node-mib %d leaves less than sandstormd's default 256 MiB reserve of the %d MiB available", c.nodeMiB, avail)
		}
		args = append(args, "--memory-reserve", strconv.FormatInt(avail-c.nodeMiB, 10))
	}
	f.res.Params = map[string]any{"count": c.count, "calls": c.calls, "parallel": c.parallel, "call_parallel": c.callParallel,
		"warm": c.warm, "awake": c.awake, "node_mib": c.nodeMiB, "raw": c.raw, "fill_for": c.fillFor.String(), "call_timeout": c.callTimeout.String(), "sandstormd_args": args, "sandstormd": br.Binary}
	sd, err := bench.StartSandstormd(ctx, br.Binary.Path, f.data, filepath.Join(br.Dir.Path, "sandstormd.log"), args...)
	if err != nil {
		return err
	}
	f.sd, f.cl, f.pid = sd, sd.Client, sd.Cmd.Process.Pid
	d := br.Demo
	treq := api.TemplateRequest{Name: "web", RootfsDir: br.Rootfs, Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports}
	if c.warm {
		treq.Warm = &api.Warm{Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}}
	}
	if _, err := f.cl.CreateTemplate(ctx, treq); err != nil {
		return err
	}
	if c.raw > 0 {
		if err := rawCost(ctx, f.res, br.Runsc, br.Rootfs, api.Template{Name: "web", Rootfs: br.Rootfs, Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports}, c.raw, c.subnet); err != nil {
			return fmt.Errorf("raw runsc sandboxes: %w", err)
		}
	}
	return nil
}

// startSampler samples the node every --sample into the timeline until
// finish.
func (f *fillRun) startSampler(ctx context.Context) {
	f.start0 = time.Now()
	f.samplerDone, f.stopSampler = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(f.samplerDone)
		t := time.NewTicker(f.c.sample)
		defer t.Stop()
		for {
			select {
			case <-f.stopSampler:
				return
			case <-t.C:
			}
			s := sampleNow(ctx, f.cl, f.pid, f.data, time.Since(f.start0), int(f.created.Load()), &f.base)
			f.mu.Lock()
			f.timeline = append(f.timeline, s)
			f.mu.Unlock()
			fmt.Fprintf(os.Stderr, "%6.0fs  %5d created  %v  avail %d MiB  disk +%d MiB  fds %d  rss %d MiB\n",
				s.At.Seconds(), s.Created, s.Tiers, s.AvailMiB, s.DiskMiB, s.FDs, s.RSSMiB)
		}
	}()
}

func (f *fillRun) finish() (string, error) {
	return finish(f.br.Dir, f.res, f.timeline, f.stopSampler, f.samplerDone, &f.mu)
}

// fill creates sandboxes until --count, --fill-for, or (with --awake) the
// node refuses one with nothing else starting.
func (f *fillRun) fill(ctx context.Context) error {
	c, res, cl := f.c, f.res, f.cl
	createS := res.AddSeries("create", "POST /v1/sandboxes to 201 (503s retried as Retry-After says)", "")
	fillCtx, fillDone := context.WithTimeout(ctx, c.fillFor)
	defer fillDone()
	failures := 0
	var ended string // with --awake: what ended the fill
	refusedOnce := 0 // with --awake: 503s answered to creates
	filler := &bench.Filler{Client: cl, Parallel: c.parallel, Count: c.count,
		Request: bench.Named("web", "f%05d"),
		Done: func(i int, a bench.Answer) bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			if c.awake && a.GaveUp {
				if ended == "" {
					ended = fmt.Sprintf("create %d refused: %v", i, a.Err)
				}
				return true
			}
			if a.Err != nil {
				createS.Fail("f%05d: %v", i, a.Err)
				failures++
				return failures > 50 // something is wrong: stop, keep what was measured
			}
			createS.AddDuration(a.Took)
			f.sbs = append(f.sbs, a.Sandbox)
			f.created.Add(1)
			return false
		}}
	if c.awake {
		// The node's answer to a create it has no room for is a 503. While
		// sandboxes are still starting on it (its promised MiB), the room
		// may be theirs only until they settle — a template's first starts
		// are counted at their limit until one has (internal/admission) —
		// so the create is tried again after its Retry-After; a 503 with
		// nothing starting is the node full, and ends the fill.
		filler.MaxRefusals = 50
		filler.Refused = func(i int, _ time.Duration) { refusedOnce++ }
		filler.Again = func(int, bench.Answer) bool {
			st, err := cl.Node(fillCtx)
			return err == nil && st.PromisedMiB > 0
		}
		go watchPushes(fillCtx, cl, fillDone, &f.mu, &ended, &f.created)
	}
	filler.Run(fillCtx)
	fillTime := time.Since(f.start0)
	res.Params["fill_seconds"] = fillTime.Seconds()
	res.Params["created"] = len(f.sbs)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	fmt.Fprintf(os.Stderr, "filled: %d sandboxes in %v\n", len(f.sbs), fillTime.Round(time.Second))
	if c.awake {
		f.mu.Lock()
		if ended == "" {
			ended = fmt.Sprintf("no refusal and no push: --count (%d) or --fill-for (%v) ended it", c.count, c.fillFor)
		}
		res.Params["ended_by"] = ended
		res.Params["refusals"] = refusedOnce
		res.Note("the fill ended at %d sandboxes, all created hot: %s; %d create(s) were answered 503 on the way (retried after its Retry-After while other sandboxes were still starting)", len(f.sbs), ended, refusedOnce)
		f.mu.Unlock()
		hostCost(res, f.base.AvailMiB, f.data, len(f.sbs))
		nref, lastRef := countRefusals(filepath.Join(f.br.Dir.Path, "sandstormd.log"))
		res.Note("the node's log has %d \"create refused\" line(s); the last: %s", nref, lastRef)
		f.c.calls = len(f.sbs)
	}
	return nil
}

// callSample calls a random sample of the sandboxes (with --awake, every
// one), each through its gateway, which wakes it from any tier.
func (f *fillRun) callSample(ctx context.Context) {
	c, res, cl := f.c, f.res, f.cl
	callS := res.AddSeries("call", "GET / through the gateway of a sandbox picked at random (any tier: the call wakes it)", "1,198 of 1,200 answered; p50 1.3 s, p99 2.8–5.5 s (seed)")
	tierAtCall := map[api.Tier]int{}
	var answered atomic.Int64
	hc := &http.Client{Timeout: c.callTimeout, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	called := bench.CallSample(ctx, f.sbs, c.calls, c.callParallel, func(ctx context.Context, sb api.Sandbox) (time.Duration, error) {
		if cur, err := cl.Sandbox(ctx, sb.ID); err == nil {
			f.mu.Lock()
			tierAtCall[cur.Tier]++
			f.mu.Unlock()
		}
		ep := sb.Endpoints["8000"]
		if !local(ep) {
			return 0, fmt.Errorf("endpoint %q is not on loopback; not called", ep)
		}
		t0 := time.Now()
		err := callOnce(ctx, hc, ep, t0.Add(c.callTimeout))
		return time.Since(t0), err
	}, func(sb api.Sandbox, took time.Duration, err error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if err != nil {
			callS.Fail("%s: %v", sb.Name, err)
			return
		}
		callS.AddDuration(took)
		answered.Add(1)
	})
	res.Params["called"] = called
	res.Params["answered"] = answered.Load()
	res.Params["tier_when_called"] = tierAtCall
	res.Note("%d of %d called answered within %v; the tiers they were in when picked: %v", answered.Load(), called, c.callTimeout, tierAtCall)
	end := sampleNow(ctx, cl, f.pid, f.data, time.Since(f.start0), len(f.sbs), &f.base)
	if n := int64(len(f.sbs)); n > 0 {
		res.Note("at the end: %v; MemAvailable %d MiB (was %d before the fill: %.2f MiB per sandbox, all tiers together); the daemon's RSS %d MiB (%.1f KiB per sandbox), %d fds",
			end.Tiers, end.AvailMiB, f.base.AvailMiB, float64(f.base.AvailMiB-end.AvailMiB)/float64(n), end.RSSMiB, float64(end.RSSMiB<<10)/float64(n), end.FDs)
	}
	snapshotSizes(res, f.data, f.sbs)
}

// callOnce GETs / until it is answered 200 or the deadline passes,
// retrying a 503 after its Retry-After.
func callOnce(ctx context.Context, hc *http.Client, ep string, deadline time.Time) error {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/", nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
			if resp.StatusCode == http.StatusServiceUnavailable && time.Now().Add(time.Second).Before(deadline) {
				time.Sleep(time.Second)
				continue
			}
		}
		return err
	}
}

// local reports whether ep is an http URL on 127.0.0.1: the benchmark only
// ever talks to its own daemon's gateway.
func local(ep string) bool {
	rest, ok := strings.CutPrefix(ep, "http://")
	if !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(rest)
	return err == nil && ap.Addr().IsLoopback()
}

// sampleNow reads one timeline point. base, when given, is subtracted
// from the disk figure.
func sampleNow(ctx context.Context, cl *client.Client, pid int, data string, at time.Duration, created int, base *sample) sample {
	s := sample{At: at, Created: created}
	if st, err := cl.Node(ctx); err == nil {
		s.Tiers = st.Sandboxes
	}
	s.AvailMiB, _ = memguard.AvailableMiB()
	var fs syscall.Statfs_t
	if syscall.Statfs(data, &fs) == nil {
		s.DiskMiB = int64(fs.Blocks-fs.Bfree) * fs.Bsize >> 20
	}
	if base != nil {
		s.DiskMiB -= base.DiskMiB
	}
	if ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd"); err == nil {
		s.FDs = len(ents)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				s.RSSMiB = kb >> 10
			}
		}
	}
	return s
}

// snapshotSizes records the size of the snapshot images on disk now, and
// of the volumes of detached sandboxes: what each costs there.
func snapshotSizes(res *bench.Results, data string, sbs []api.Sandbox) {
	var snaps, vols []float64
	for i, sb := range sbs {
		if i%10 != 0 { // one in ten is enough, and du of 10,000 is slow
			continue
		}
		d := filepath.Join(data, "sandboxes", sb.ID)
		if n := duMiB(filepath.Join(d, "snapshot")); n > 0 {
			snaps = append(snaps, n)
		}
		vols = append(vols, duMiB(filepath.Join(d, "upper")))
	}
	t := &bench.Table{Title: "Disk per sandbox", Description: "du of one sandbox in ten after the calls, MiB", Columns: []string{"what", "n", "median MiB", "max MiB"}}
	for _, r := range []struct {
		name string
		v    []float64
	}{{"snapshot image", snaps}, {"volume (upper dir)", vols}} {
		if dist, err := bench.Distribute(r.v); err == nil {
			t.Rows = append(t.Rows, []string{r.name, strconv.Itoa(len(r.v)), fmt.Sprintf("%.2f", dist.P50), fmt.Sprintf("%.2f", dist.Max)})
		}
	}
	res.Tables = append(res.Tables, t)
}

func duMiB(path string) float64 {
	var total int64
	filepath.WalkDir(path, func(_ string, de os.DirEntry, err error) error {
		if err == nil && !de.IsDir() {
			if fi, err := de.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					total += st.Blocks * 512
				}
			}
		}
		return nil
	})
	return float64(total) / (1 << 20)
}

// finish stops the sampler and writes the results with the timeline.
func finish(dir *bench.Dir, res *bench.Results, timeline []sample, stop chan struct{}, done chan struct{}, mu *sync.Mutex) (string, error) {
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	t := &bench.Table{Title: "Timeline", Description: "every sample: sandboxes created, per tier (a sandbox being created counts as detached until it is hot), MemAvailable, disk used since the start, the daemon's fds and RSS",
		Columns: []string{"s", "created", "hot", "frozen", "snapshot", "detached", "avail MiB", "disk +MiB", "fds", "rss MiB"}, Data: timeline}
	for _, s := range timeline {
		t.Rows = append(t.Rows, []string{fmt.Sprintf("%.0f", s.At.Seconds()), strconv.Itoa(s.Created),
			strconv.Itoa(s.Tiers[api.TierHot]), strconv.Itoa(s.Tiers[api.TierFrozen]), strconv.Itoa(s.Tiers[api.TierSnapshot]), strconv.Itoa(s.Tiers[api.TierDetached]),
			strconv.FormatInt(s.AvailMiB, 10), strconv.FormatInt(s.DiskMiB, 10), strconv.Itoa(s.FDs), strconv.FormatInt(s.RSSMiB, 10)})
	}
	res.Tables = append(res.Tables, t)
	return dir.Done(res)
}

// cleanup deletes every sandbox through the API (detached ones are cheap),
// eight at a time, then stops the daemon and removes its data.
func cleanup(cl *client.Client, sd *bench.Sandstormd, data, subnet string) {
	if cl != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		if sbs, err := cl.Sandboxes(ctx); err == nil {
			fmt.Fprintf(os.Stderr, "deleting %d sandboxes…\n", len(sbs))
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			for _, sb := range sbs {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					cl.DeleteSandbox(ctx, sb.ID)
				}()
			}
			wg.Wait()
		}
		cl.DeleteTemplate(ctx, "web")
	}
	sd.Stop()
	// The runsc root's shared mount, and the pool's unreachable route.
	for syscall.Unmount(filepath.Join(data, "runsc", "null-netns"), syscall.MNT_DETACH) == nil {
	}
	exec.Command("ip", "route", "del", "unreachable", subnet).Run()
}

// watchPushes ends an --awake fill (stop) the first time the node has a
// sandbox that is not hot: it pushed one off memory to make room for a
// create, so the node holds no more awake. A sandbox being created counts
// as detached until it is hot, so only frozen and snapshot count.
func watchPushes(ctx context.Context, cl *client.Client, stop func(), mu *sync.Mutex, ended *string, created *atomic.Int64) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := cl.Node(ctx)
		if err != nil {
			continue
		}
		if pushed := st.Sandboxes[api.TierFrozen] + st.Sandboxes[api.TierSnapshot]; pushed > 0 {
			mu.Lock()
			if *ended == "" {
				*ended = fmt.Sprintf("the node pushed %d sandbox(es) off memory to make room, at %d created (tiers %v)", pushed, created.Load(), st.Sandboxes)
			}
			mu.Unlock()
			stop()
			return
		}
	}
}

// hostCost notes what n hot sandboxes cost the host: MemAvailable's drop
// per sandbox since before the fill, and each sandbox's memory cgroup
// (found through its runsc-sandbox process, whose command line names the
// data dir), median and p99 by nearest rank.
func hostCost(res *bench.Results, baseAvail int64, data string, n int) {
	if n == 0 {
		return
	}
	avail, _ := memguard.AvailableMiB()
	var usage []float64
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.HasPrefix(string(b), "runsc-sandbox\x00") || !strings.Contains(string(b), data) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil {
			continue
		}
		if cg, err := reclaim.CgroupOf(pid); err == nil {
			usage = append(usage, float64(cg.Usage())/(1<<20))
		}
	}
	s := res.AddSeries("sandbox-cgroup-mib", "each hot sandbox's memory cgroup after the fill, MiB (not ms)", "")
	for _, u := range usage {
		s.Add(u)
	}
	res.Params["memavailable_drop_mib_per_sandbox"] = float64(baseAvail-avail) / float64(n)
	res.Note("host cost of %d hot web sandboxes: MemAvailable fell %d MiB, %.1f MiB per sandbox; %d sandbox cgroups read (series sandbox-cgroup-mib)",
		n, baseAvail-avail, float64(baseAvail-avail)/float64(n), len(usage))
}

// countRefusals counts the node's "create refused" log lines and returns
// the last one.
func countRefusals(log string) (int, string) {
	b, _ := os.ReadFile(log)
	n, last := 0, ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "create refused") {
			n++
			last = l
		}
	}
	return n, last
}

// rawCost starts n raw runsc sandboxes of t side by side (each in its own
// namespace and address slot of one subnet, on the node's bundle and
// flags: internal/bench/raw), waits for each one's first answer and 10 s
// more, and notes what they cost the host — MemAvailable's drop per
// sandbox and each one's memory cgroup (series raw-sandbox-cgroup-mib) —
// before removing them all: the baseline for hostCost's figures.
func rawCost(ctx context.Context, res *bench.Results, runsc, rootfs string, t api.Template, n int, avoid string) error {
	var avoidP []netip.Prefix
	if p, err := netip.ParsePrefix(avoid); err == nil {
		avoidP = append(avoidP, p)
	}
	subnet, err := raw.PickSubnet(avoidP)
	if err != nil {
		return err
	}
	var tag [2]byte
	crand.Read(tag[:])
	before, _ := memguard.AvailableMiB()
	var envs []*raw.Env
	defer func() {
		for _, e := range envs {
			e.Cleanup(context.WithoutCancel(ctx))
		}
	}()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	st := raw.Template(t)
	var boxes []*raw.Box
	fmt.Fprintf(os.Stderr, "raw: %d runsc sandboxes side by side in %v\n", n, subnet)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		e, err := raw.NewAt(ctx, runsc, gvisor.DefaultPlatform, fmt.Sprintf("%x%03x", tag, i), subnet, i+1, time.Minute)
		if err != nil {
			return err
		}
		envs = append(envs, e)
		b, err := e.NewBox("web", st, raw.NodeDefaultMemoryMiB, "")
		if err != nil {
			return err
		}
		if _, _, err := e.Run(ctx, b); err != nil {
			return err
		}
		if err := bench.FirstAnswer(ctx, hc, e.URL(t.Ports[0]), time.Now().Add(time.Minute)); err != nil {
			return fmt.Errorf("raw sandbox %d: %w", i, err)
		}
		boxes = append(boxes, b)
		if (i+1)%50 == 0 {
			fmt.Fprintf(os.Stderr, "raw: %d running\n", i+1)
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
	}
	after, _ := memguard.AvailableMiB()
	s := res.AddSeries("raw-sandbox-cgroup-mib", "each raw runsc sandbox's memory cgroup, 10 s after the last first answer, MiB (not ms)", "")
	for i, b := range boxes {
		if mib, err := raw.MemoryMiB(ctx, envs[i].Backend(), b.ID()); err == nil {
			s.Add(mib)
		}
	}
	res.Params["raw_memavailable_drop_mib_per_sandbox"] = float64(before-after) / float64(len(boxes))
	res.Note("host cost of %d raw runsc web sandboxes side by side: MemAvailable fell %d MiB, %.1f MiB per sandbox (series raw-sandbox-cgroup-mib)",
		len(boxes), before-after, float64(before-after)/float64(len(boxes)))
	return nil
}
