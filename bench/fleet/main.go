// Command fleet is issue 9's fleet benchmark, on one machine: a master and
// --nodes nodes, each node in a network namespace of its own (sandstormd
// fleet up), idle timers shortened as the seed's runs were.
//
//   - fill: tiered Python HTTP servers (the web demo) are created until
//     --count or until the fleet refuses for memory, then --calls of them
//     picked at random are called once each: how many answered, p50/p99
//     (seed: 1,198 of 1,200, p50 1.3 s, p99 2.8–5.5 s).
//
//   - traffic: the seed's "Under traffic": --per-node sandboxes per node,
//     with the nodes' memory reserve set so that about --awake of them fit
//     awake per node, and requests to them Zipf-distributed (a few get most)
//     at each of --rates requests a second per node, each rate for
//     --traffic-for: refused % (503) and p99 per rate (seed: 1.1 %, 0.1 %,
//     0.2 %, 2.5 % refused at 1, 2, 4, 8/s; p99 about 2 s).
//
//   - move, drain: a sandbox moved live with its memory, by image size,
//     against checkpoint + copy + restore measured apart in the same run;
//     the drain of a node holding --drain-count in mixed tiers (move.go).
//
// Run it as:
//
//	sudo go run ./bench/fleet                          # both parts
//	sudo go run ./bench/fleet --part fill --count 300 --calls 100
//	sudo go run ./bench/fleet --part move,drain      # issue 18: live moves and a drain
//
// Results (machine, commit, raw samples) go to bench/results/fleet-<date>-<commit>.
// Everything it made is taken down at the end (fleet down), Ctrl-C included.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
	"sandstorm/internal/fleetup"
	"sandstorm/internal/memguard"
)

type config struct {
	part                             string
	nodes, count, calls, parallel    int
	perNode, awake                   int
	rates                            []int
	fillFor, trafficFor, callTimeout time.Duration
	root, listen                     string
	bench.Flags
	timers                 bench.IdleTimers
	sandboxMiB             int
	moveRounds, drainCount int
	hopRounds              int
	hopH2                  bool
	logLevel               string
	logs                   string // where each fleet's logs are kept (set by run)
	fleets                 *int   // fleets brought up so far (their logs' directory names)
}

func main() {
	var c config
	var rates string
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.StringVar(&c.part, "part", "fill,traffic", "what to run: fill, traffic, envd (the master's hop on a call to a sandbox's envd), move (a live move against checkpoint + copy + restore), drain (a node of --drain-count in mixed tiers), comma-separated")
	fs.IntVar(&c.hopRounds, "hop-rounds", 3, "envd: alternating rounds of every way's calls and transfers")
	fs.BoolVar(&c.hopH2, "hop-h2", false, "envd: speak HTTP/2 to the ingresses (default HTTP/1.1, as E2B's SDK does)")
	fs.IntVar(&c.moveRounds, "move-rounds", 12, "move: moves of the web and 64 MiB sandboxes (a third as many of the 1 GiB one), each followed by its baseline")
	fs.IntVar(&c.drainCount, "drain-count", 100, "drain: sandboxes on the node drained")
	fs.IntVar(&c.nodes, "nodes", 3, "nodes in the fleet")
	fs.IntVar(&c.count, "count", 3000, "fill: sandboxes to create at most")
	fs.IntVar(&c.calls, "calls", 1200, "fill: sandboxes picked at random and called")
	fs.IntVar(&c.parallel, "parallel", 6, "creates (and fill calls) at a time")
	fs.IntVar(&c.perNode, "per-node", 40, "traffic: sandboxes per node")
	fs.IntVar(&c.awake, "awake", 12, "traffic: about how many of them fit awake per node (sets the nodes' memory reserve)")
	fs.StringVar(&rates, "rates", "1,2,4,8", "traffic: requests a second per node, one run each")
	fs.DurationVar(&c.fillFor, "fill-for", 20*time.Minute, "fill: stop creating after this long")
	fs.DurationVar(&c.trafficFor, "traffic-for", time.Minute, "traffic: how long each rate runs")
	fs.DurationVar(&c.callTimeout, "call-timeout", 30*time.Second, "a call with no answer by then did not answer")
	c.timers.Register(fs, "nodes'")
	fs.IntVar(&c.sandboxMiB, "sandbox-memory", 128, "nodes' --sandbox-memory: each web server's limit, and what a start is admitted at")
	fs.StringVar(&c.logLevel, "log-level", "warn", "the nodes' --log-level (info logs each move's steps); the master's and nodes' logs are kept in the results directory, logs/<k>/ for the k-th fleet brought up")
	c.Flags.Register(fs)
	// The nodes fleetup starts run the runsc beside their binary.
	fs.Lookup("sandstormd").Usage = "sandstormd binary, with runsc beside it (default: built from --repo, with bin/runsc linked beside it: make runsc)"
	fs.StringVar(&c.root, "root", "/var/lib/sandstorm-bench-fleet", "the fleet's root (removed at the end)")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8078", "the master's API address")
	bench.ParseFlags(fs, func() error {
		for _, r := range strings.Split(rates, ",") {
			var v int
			if _, err := fmt.Sscan(r, &v); err != nil || v < 1 {
				return fmt.Errorf("--rates %q: want positive integers", rates)
			}
			c.rates = append(c.rates, v)
		}
		if c.nodes < 1 || c.nodes > 9 {
			return errors.New("--nodes 1 to 9")
		}
		return nil
	})
	bench.Main("fleet", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

func run(ctx context.Context, c config) (string, error) {
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/fleet", Title: fmt.Sprintf("A fleet of %d nodes on one machine: fill and random calls, then Zipf traffic", c.nodes),
		Out: c.Out, Repo: c.Repo, Prefix: "fleet-", Runsc: filepath.Join(c.Repo, "bin", "runsc"), Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer br.Close()
	res, dir, b := br.Results, br.Dir, br.Binary
	bin := b.Path
	if !b.Built {
		// A binary given runs the runsc beside it, not bin/runsc.
		res.Machine.UseRunsc(ctx, filepath.Join(filepath.Dir(bin), "runsc"))
	}
	c.logs, c.fleets = filepath.Join(dir.Path, "logs"), new(int)
	res.Params = map[string]any{"log_level": c.logLevel, "nodes": c.nodes, "part": c.part, "count": c.count, "calls": c.calls, "parallel": c.parallel,
		"per_node": c.perNode, "awake": c.awake, "rates": c.rates, "traffic_for": c.trafficFor.String(), "fill_for": c.fillFor.String(),
		"freeze_after": c.timers.Freeze.String(), "snapshot_after": c.timers.Snapshot.String(), "detach_after": c.timers.Detach.String(), "sandbox_memory_mib": c.sandboxMiB, "sandstormd": b,
		"move_rounds": c.moveRounds, "drain_count": c.drainCount, "hop_rounds": c.hopRounds, "hop_h2": c.hopH2}
	// The parts run in this order, each only if --part names it and the
	// run has not been stopped; the results are written after each, so
	// that a run cut short keeps what it measured.
	for _, p := range []struct {
		part, what string
		run        func(context.Context, config, string, *bench.Results) error
	}{
		{"fill", "fill", fill},
		{"envd", "envd hop", envdHop},
		{"move", "move", moveBench},
		{"drain", "drain", drainBench},
		{"traffic", "traffic", traffic},
	} {
		if !strings.Contains(c.part, p.part) || ctx.Err() != nil {
			continue
		}
		if err := p.run(ctx, c, bin, res); err != nil {
			res.Note("%s stopped: %v", p.what, err)
			fmt.Fprintf(os.Stderr, "%s: %v\n", p.what, err)
		}
		write(dir, res)
	}
	return dir.Done(res)
}

// write keeps what the run measured so far.
func write(dir *bench.Dir, res *bench.Results) {
	res.Finished = time.Now().UTC()
	dir.Write(res)
}

// timersOff is timers with the nodes' idle timers off: only the
// benchmark moves a sandbox between tiers.
func timersOff(c config) []string {
	return timers(c, bench.IdleTimers{}.Args()...)
}

// timers are the nodes' flags: c's log level, idle timers and sandbox
// memory, then extra (a later flag wins).
func timers(c config, extra ...string) []string {
	args := append([]string{"--log-level", c.logLevel}, c.timers.Args()...)
	return append(append(args, "--sandbox-memory", fmt.Sprint(c.sandboxMiB)), extra...)
}

// up brings a fleet up and returns a client of its master and a teardown.
func up(ctx context.Context, c config, bin string, nodeArgs []string) (*client.Client, fleetup.State, func(), error) {
	fleetup.Down(c.root, true, io.Discard) // a run cut short
	// fleetup appends to its logs, and Down leaves them: start this
	// fleet's afresh, so that what keepLogs keeps is this fleet's alone.
	if old, _ := filepath.Glob(filepath.Join(c.root, "*.log")); len(old) > 0 {
		for _, f := range old {
			os.Remove(f)
		}
	}
	st, err := fleetup.Up(ctx, fleetup.Config{Nodes: c.nodes, Root: c.root, Listen: c.listen, Bin: bin, Template: "web", NodeArgs: nodeArgs, Out: os.Stderr, NoMesh: true})
	*c.fleets++
	logs := filepath.Join(c.logs, strconv.Itoa(*c.fleets))
	down := func() {
		fmt.Fprintln(os.Stderr, "taking the fleet down…")
		keepLogs(st, logs) // while the fleet still runs: its last lines are its shutdown
		fleetup.Down(c.root, true, os.Stderr)
	}
	if err != nil {
		return nil, st, down, err
	}
	cl, err := client.ForDataDir(st.API, st.Master.DataDir)
	if err != nil {
		return nil, st, down, err
	}
	cl.HTTP.Timeout = 5 * time.Minute
	// fleet up's verification sandboxes are not the benchmark's.
	if sbs, err := cl.Sandboxes(ctx); err == nil {
		for _, sb := range sbs {
			cl.DeleteSandbox(ctx, sb.ID)
		}
	}
	return cl, st, down, nil
}

func fill(ctx context.Context, c config, bin string, res *bench.Results) error {
	cl, _, down, err := up(ctx, c, bin, timers(c))
	defer down()
	if err != nil {
		return err
	}
	createS := res.AddSeries("fill/create", "POST /v1/sandboxes to 201 through the master (placed by headroom; a 503 is retried after its Retry-After, up to 5 times)", "")
	fillCtx, done := context.WithTimeout(ctx, c.fillFor)
	defer done()
	var mu sync.Mutex
	var sbs []api.Sandbox
	refusedInARow := 0
	start := time.Now()
	(&bench.Filler{Client: cl, Parallel: c.parallel, Count: c.count, MaxRefusals: 5,
		Request: bench.Named("web", "f%05d"),
		Done: func(i int, a bench.Answer) bool {
			mu.Lock()
			defer mu.Unlock()
			if a.Err != nil {
				createS.Fail("f%05d: %v", i, a.Err)
			} else {
				createS.AddDuration(a.Took)
				sbs = append(sbs, a.Sandbox)
			}
			switch {
			case a.GaveUp:
				refusedInARow++
				return refusedInARow > 20 // memory says stop
			case a.Err == nil:
				refusedInARow = 0
				if len(sbs)%250 == 0 {
					fmt.Fprintf(os.Stderr, "%6.0fs  %d created\n", time.Since(start).Seconds(), len(sbs))
				}
			}
			return false
		}}).Run(fillCtx)
	res.Params["fill_created"] = len(sbs)
	res.Params["fill_seconds"] = time.Since(start).Seconds()
	perNode := map[string]int{}
	for _, sb := range sbs {
		perNode[sb.Node]++
	}
	res.Params["fill_per_node"] = perNode
	fmt.Fprintf(os.Stderr, "filled: %d sandboxes in %v, per node %v\n", len(sbs), time.Since(start).Round(time.Second), perNode)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	callS := res.AddSeries("fill/call", "GET / through the gateway on the sandbox's node, of a sandbox picked at random (any tier: the call wakes it; a 503 is retried after its Retry-After until --call-timeout)", "1,198 of 1,200 answered; p50 1.3 s, p99 2.8–5.5 s (seed)")
	var answered atomic.Int64
	hc := &http.Client{Timeout: c.callTimeout, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	called := bench.CallSample(ctx, sbs, c.calls, c.parallel, func(ctx context.Context, sb api.Sandbox) (time.Duration, error) {
		t0 := time.Now()
		err := callOnce(ctx, hc, sb.Endpoints["8000"], t0.Add(c.callTimeout), true)
		return time.Since(t0), err
	}, func(sb api.Sandbox, took time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			callS.Fail("%s on %s: %v", sb.Name, sb.Node, err)
			return
		}
		callS.AddDuration(took)
		answered.Add(1)
	})
	res.Params["fill_called"] = called
	res.Params["fill_answered"] = answered.Load()
	res.Note("fill: %d created on %d nodes (%v); %d of %d called answered within %v", len(sbs), c.nodes, perNode, answered.Load(), called, c.callTimeout)
	return ctx.Err()
}

// traffic is the seed's "Under traffic".
func traffic(ctx context.Context, c config, bin string, res *bench.Results) error {
	avail, err := memguard.AvailableMiB()
	if err != nil {
		return err
	}
	// The nodes share this machine's memory: a reserve that leaves room
	// for about awake sandboxes per node, at what a web server holds
	// (measured: ≈ 25–30 MiB in its cgroup; --sandbox-memory is what a
	// start is admitted at until its template has settled).
	room := int64(c.awake*c.nodes) * 30
	reserve := avail - room
	res.Params["traffic_reserve_mib"] = reserve
	cl, _, down, err := up(ctx, c, bin, timers(c, "--memory-reserve", fmt.Sprint(reserve)))
	defer down()
	if err != nil {
		return err
	}
	n := c.perNode * c.nodes
	var sbs []api.Sandbox
	for i := 0; i < n && ctx.Err() == nil; i++ {
		for try := 0; ; try++ {
			sb, err := cl.CreateSandbox(ctx, api.SandboxRequest{Template: "web", Name: fmt.Sprintf("t%03d", i)})
			if client.StatusOf(err) == http.StatusServiceUnavailable && try < 30 {
				time.Sleep(time.Second)
				continue
			}
			if err != nil {
				return fmt.Errorf("create t%03d: %w", i, err)
			}
			sbs = append(sbs, sb)
			break
		}
	}
	fmt.Fprintf(os.Stderr, "traffic: %d sandboxes; reserve %d MiB (room for ≈ %d awake)\n", len(sbs), reserve, c.awake*c.nodes)
	zipf := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, uint64(len(sbs)-1))
	t := &bench.Table{Title: "Under traffic", Description: fmt.Sprintf("%d sandboxes per node (about %d fit awake), Zipf(1.1) requests, each rate for %v; refused = HTTP 503 (not retried)", c.perNode, c.awake, c.trafficFor),
		Columns: []string{"req/s per node", "requests", "refused %", "failed", "p50 ms", "p99 ms", "seed refused %"}}
	seedRefused := map[int]string{1: "1.1", 2: "0.1", 4: "0.2", 8: "2.5"}
	for _, rate := range c.rates {
		s := res.AddSeries(fmt.Sprintf("traffic/%d", rate), fmt.Sprintf("GET / at %d req/s per node (%d/s in all), Zipf over the sandboxes; answered ones (client)", rate, rate*c.nodes), "p99 about 2 s (seed)")
		var refused, failed, total atomic.Int64
		var mu sync.Mutex
		var wg sync.WaitGroup
		hc := &http.Client{Timeout: c.callTimeout, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
		every := time.Second / time.Duration(rate*c.nodes)
		tick := time.NewTicker(every)
		end := time.Now().Add(c.trafficFor)
		for time.Now().Before(end) && ctx.Err() == nil {
			<-tick.C
			sb := sbs[zipf.Uint64()]
			wg.Add(1)
			total.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				err := callOnce(ctx, hc, sb.Endpoints["8000"], t0.Add(c.callTimeout), false)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					s.AddDuration(time.Since(t0))
				case errors.Is(err, errRefused):
					refused.Add(1)
				default:
					failed.Add(1)
					s.Fail("%s: %v", sb.Name, err)
				}
			}()
		}
		tick.Stop()
		wg.Wait()
		s.Summarize()
		pct := 100 * float64(refused.Load()) / float64(max(1, total.Load()))
		p50, p99 := "-", "-"
		if s.Summary != nil {
			p50, p99 = bench.FormatMs(s.Summary.P50Ms), bench.FormatMs(s.Summary.P99Ms)
		}
		t.Rows = append(t.Rows, []string{fmt.Sprint(rate), fmt.Sprint(total.Load()), fmt.Sprintf("%.1f", pct), fmt.Sprint(failed.Load()), p50, p99, seedRefused[rate]})
		fmt.Fprintf(os.Stderr, "traffic %d/s per node: %d requests, %.1f %% refused, %d failed, p50 %s p99 %s ms\n", rate, total.Load(), pct, failed.Load(), p50, p99)
	}
	res.Tables = append(res.Tables, t)
	return ctx.Err()
}

var errRefused = errors.New("refused (503)")

// callOnce GETs / on a sandbox's gateway endpoint (only ever an address in
// the fleet's own namespaces). With retry, a 503 is retried after its
// Retry-After until the deadline; without, it is errRefused.
func callOnce(ctx context.Context, hc *http.Client, ep string, deadline time.Time, retry bool) error {
	if !ours(ep) {
		return fmt.Errorf("endpoint %q is not in the fleet's namespaces; not called", ep)
	}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			if !retry {
				return errRefused
			}
			if time.Now().Add(time.Second).Before(deadline) {
				time.Sleep(time.Second)
				continue
			}
		}
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
}

// fleetNet is where fleet up puts its nodes (fleetup: 10.186.k.2).
var fleetNet = netip.MustParsePrefix("10.186.0.0/16")

func ours(ep string) bool {
	rest, ok := strings.CutPrefix(ep, "http://")
	if !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(rest)
	return err == nil && fleetNet.Contains(ap.Addr())
}

// keepLogs copies the master's and the nodes' logs of fleet st into dir:
// the fleet's root is the next run's, and its logs with it.
func keepLogs(st fleetup.State, dir string) {
	procs := []fleetup.Proc{st.Master}
	for _, n := range st.Nodes {
		procs = append(procs, n.Proc)
	}
	for _, p := range procs {
		if p.Log == "" {
			continue
		}
		b, err := os.ReadFile(p.Log)
		if err != nil {
			continue
		}
		if os.MkdirAll(dir, 0o755) == nil {
			os.WriteFile(filepath.Join(dir, filepath.Base(p.Log)), b, 0o644)
		}
	}
}
