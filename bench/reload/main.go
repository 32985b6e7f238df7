// Command reload measures what a reload of sandstormd (SIGHUP, `sandstormd
// reload`, `systemctl reload sandstormd`: the binary re-executed in the same
// process with its listening sockets handed over) costs the clients of its
// sandboxes: how long a connection that arrives during the reload waits
// before it is answered, by the tier of the sandbox it is for, against
// the same requests outside reloads (issue 18 item 3: "measure the
// longest wait"). Every request is a new TCP connection, so each one
// either waits in a listener's backlog or is refused; the run counts the
// refused (expected: none).
//
//	sudo go run ./bench/reload                          # 20 hot sandboxes, 20 reloads
//	sudo go run ./bench/reload --sandboxes 50 --rounds 10
//
// Each round: the snapshotted and frozen sandboxes are put back in their
// tiers, steady clients call the hot ones, `sandstormd reload` runs, and as
// soon as the daemon's log says its listeners are paused one request is
// sent to every sandbox at once. The daemon's own log times the steps
// (paused → exec → serving → every sandbox adopted). It starts its own
// sandstormd on a temporary data dir and removes everything it made.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
)

type config struct {
	sandboxes, rounds, clients int
	restarts                   int
	runsc                      string
	bench.Flags
}

func main() {
	var c config
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	fs.IntVar(&c.sandboxes, "sandboxes", 20, "hot sandboxes (each is called once per reload, during it)")
	fs.IntVar(&c.rounds, "rounds", 20, "reloads")
	fs.IntVar(&c.clients, "clients", 4, "steady clients calling the hot sandboxes throughout, a new connection per request")
	fs.IntVar(&c.restarts, "restarts", 5, "then as many stops and starts (what systemctl restart does), for comparison")
	c.Flags.Register(fs)
	fs.StringVar(&c.runsc, "runsc", "bin/runsc", "runsc for sandstormd (the pinned one `make runsc` builds)")
	bench.ParseFlags(fs, func() error {
		if c.sandboxes < 1 || c.rounds < 1 || c.clients < 0 {
			return bench.ErrBadArguments
		}
		return nil
	})
	bench.Main("reload", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

// sample is one request: when it started, how long it took, how it ended.
type sample struct {
	start time.Time
	took  time.Duration
	err   error
}

func get(hc *http.Client, url string) sample {
	s := sample{start: time.Now()}
	resp, err := hc.Get(url)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
	}
	s.took, s.err = time.Since(s.start), err
	return s
}

func sysctl(name string) string {
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(name, ".", "/"))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

func run(ctx context.Context, c config) (string, error) {
	r, err := bench.Begin(ctx, bench.Plan{Tool: "bench/reload", Title: "Reload of sandstormd under traffic: how long a connection waits",
		Out: c.Out, Repo: c.Repo, Prefix: "reload-", Runsc: c.runsc, Demo: "web", Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer r.Close()
	rr := &reloadRun{c: c, r: r, res: r.Results, backlog: map[string]string{}, stop: make(chan struct{}),
		hc: &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}, Timeout: 2 * time.Minute}}
	for _, k := range []string{"net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog", "net.core.rmem_default", "net.unix.max_dgram_qlen"} {
		rr.backlog[k] = sysctl(k)
	}
	rr.res.Params = map[string]any{"sandboxes": c.sandboxes, "rounds": c.rounds, "clients": c.clients, "restarts": c.restarts, "sysctl": rr.backlog}
	if err := rr.start(ctx); err != nil {
		return "", err
	}
	defer func() {
		rr.sd.Stop()
		exec.Command("ip", "route", "del", "unreachable", "10.187.0.0/16").Run()
	}()
	defer rr.deleteAll()
	if err := rr.sandboxes(ctx); err != nil {
		return "", err
	}
	rr.steadyClients()
	defer rr.stopSteady()
	if err := rr.reloads(ctx); err != nil {
		return "", err
	}
	if err := rr.restartsForComparison(ctx); err != nil {
		return "", err
	}
	rr.stopSteady()
	rr.sortSteady()
	if err := steps(rr.logPath, rr.drainS, rr.startS, rr.adoptS); err != nil {
		rr.res.Note("could not read the daemon's steps from its log: %v", err)
	}
	rr.notes()
	return r.Dir.Done(rr.res)
}

// reloadRun is one run: the daemon, its sandboxes, the steady clients and
// what they and the probes measured.
type reloadRun struct {
	c       config
	r       *bench.Run
	res     *bench.Results
	backlog map[string]string
	hc      *http.Client
	logPath string
	data    string
	args    []string
	sd      *bench.Sandstormd
	cl      *client.Client

	hot          []api.Sandbox
	snap, frozen api.Sandbox

	mu       sync.Mutex
	steady   []sample
	stop     chan struct{}
	stopped  bool
	wg       sync.WaitGroup
	windows  [][2]time.Time // reloads
	restarts [][2]time.Time // stops and starts

	probeHot, probeFrozen, probeSnap *bench.Series
	drainS, startS, adoptS           *bench.Series
	refused, refusedRestart          int
}

// start starts the daemon and its web template.
func (rr *reloadRun) start(ctx context.Context) error {
	rr.logPath = filepath.Join(rr.r.Dir.Path, "sandstormd.log")
	rr.data = filepath.Join(rr.r.Work, "data")
	rr.args = []string{"--runsc", rr.r.Runsc, "--subnet", "10.187.0.0/16", "--gateway-ports", "30500-30999", "--memory-reserve", "0",
		"--freeze-after", "0", "--snapshot-after", "0", "--detach-after", "0"}
	rr.res.Params["sandstormd_args"] = rr.args
	sd, err := bench.StartSandstormd(ctx, rr.r.Binary.Path, rr.data, rr.logPath, rr.args...)
	if err != nil {
		return err
	}
	rr.sd, rr.cl = sd, sd.Client
	d := rr.r.Demo
	_, err = rr.cl.CreateTemplate(ctx, api.TemplateRequest{Name: "web", RootfsDir: rr.r.Rootfs,
		Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports})
	return err
}

// sandboxes creates the hot ones, one to snapshot and one to freeze, and
// has each answer once.
func (rr *reloadRun) sandboxes(ctx context.Context) error {
	for i := range rr.c.sandboxes {
		sb, err := rr.cl.CreateSandbox(ctx, api.SandboxRequest{Template: "web", Name: fmt.Sprintf("hot-%02d", i)})
		if err != nil {
			return err
		}
		rr.hot = append(rr.hot, sb)
	}
	var err error
	if rr.snap, err = rr.cl.CreateSandbox(ctx, api.SandboxRequest{Template: "web", Name: "snap"}); err != nil {
		return err
	}
	if rr.frozen, err = rr.cl.CreateSandbox(ctx, api.SandboxRequest{Template: "web", Name: "frozen"}); err != nil {
		return err
	}
	for _, sb := range append(rr.hot, rr.snap, rr.frozen) {
		if s := get(rr.hc, sb.Endpoints["8000"]+"/"); s.err != nil {
			return fmt.Errorf("%s: %w", sb.Name, s.err)
		}
	}
	return nil
}

func (rr *reloadRun) deleteAll() {
	for _, sb := range append(rr.hot, rr.snap, rr.frozen) {
		if sb.ID != "" {
			rr.cl.DeleteSandbox(context.Background(), sb.ID)
		}
	}
}

// steadyClients start the steady clients on the hot sandboxes, each
// sending one request after another until stopSteady.
func (rr *reloadRun) steadyClients() {
	for k := range rr.c.clients {
		rr.wg.Go(func() {
			for i := k; ; i++ {
				select {
				case <-rr.stop:
					return
				default:
				}
				s := get(rr.hc, rr.hot[i%len(rr.hot)].Endpoints["8000"]+"/")
				rr.mu.Lock()
				rr.steady = append(rr.steady, s)
				rr.mu.Unlock()
			}
		})
	}
}

func (rr *reloadRun) stopSteady() {
	if !rr.stopped {
		rr.stopped = true
		close(rr.stop)
		rr.wg.Wait()
	}
}

// reloads runs the rounds: the wake and the restore alone, then a reload
// with a probe to every sandbox sent as the listeners pause.
func (rr *reloadRun) reloads(ctx context.Context) error {
	res := rr.res
	cli := res.AddSeries("reload_command", "`sandstormd reload`: SIGHUP to the new binary serving (the CLI's own time)", "")
	rr.probeHot = res.AddSeries("during/hot", "a request to a hot sandbox sent as soon as the log says the listeners are paused: connect to answer (one per hot sandbox per reload)", "")
	rr.probeFrozen = res.AddSeries("during/frozen", "the same to a frozen sandbox (its wake included)", "")
	rr.probeSnap = res.AddSeries("during/snapshot", "the same to a snapshotted sandbox (its restore included)", "")
	outsideFrozen := res.AddSeries("outside/frozen", "a request to the frozen sandbox with no reload: the wake alone, for comparison", "")
	outsideSnap := res.AddSeries("outside/snapshot", "a request to the snapshotted sandbox with no reload: the restore alone, for comparison", "")
	rr.drainS = res.AddSeries("daemon/paused_to_exec", "the daemon's log: listeners paused to execve (requests in flight answered)", "")
	rr.startS = res.AddSeries("daemon/exec_to_serving", "the daemon's log: execve to the new binary serving (API and inherited listeners open)", "")
	rr.adoptS = res.AddSeries("daemon/exec_to_adopted", "the daemon's log: execve to every sandbox repaired and its listeners adopted", "")
	for round := range rr.c.rounds {
		if ctx.Err() != nil {
			break
		}
		// Outside a reload: the wake and the restore alone.
		for _, p := range []struct {
			sb api.Sandbox
			op string
			s  *bench.Series
		}{{rr.frozen, "freeze", outsideFrozen}, {rr.snap, "snapshot", outsideSnap}} {
			if _, err := rr.cl.Transition(ctx, p.sb.ID, p.op); err != nil {
				return err
			}
			if s := get(rr.hc, p.sb.Endpoints["8000"]+"/"); s.err != nil {
				p.s.Fail("round %d: %v", round, s.err)
			} else {
				p.s.AddDuration(s.took)
			}
		}
		for _, p := range []struct {
			sb api.Sandbox
			op string
		}{{rr.frozen, "freeze"}, {rr.snap, "snapshot"}} {
			if _, err := rr.cl.Transition(ctx, p.sb.ID, p.op); err != nil {
				return err
			}
		}
		time.Sleep(300 * time.Millisecond) // steady traffic before the reload
		if err := rr.reload(ctx, round, cli); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "\rreload %d/%d", round+1, rr.c.rounds)
		time.Sleep(300 * time.Millisecond)
	}
	fmt.Fprintln(os.Stderr)
	return nil
}

// reload is one reload, probed as the listeners pause, and the wait for
// the repair after it.
func (rr *reloadRun) reload(ctx context.Context, round int, cli *bench.Series) error {
	paused := count(rr.logPath, "reload: listeners paused")
	t0 := time.Now()
	done := make(chan error, 1)
	go func() {
		out, err := exec.CommandContext(ctx, rr.r.Binary.Path, "reload", "--data-dir", rr.data).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
		done <- err
	}()
	for count(rr.logPath, "reload: listeners paused") == paused {
		time.Sleep(time.Millisecond)
	}
	var pw sync.WaitGroup
	var pmu sync.Mutex
	fire := func(sb api.Sandbox, s *bench.Series) {
		pw.Go(func() {
			x := get(rr.hc, sb.Endpoints["8000"]+"/")
			pmu.Lock()
			defer pmu.Unlock()
			if x.err != nil {
				s.Fail("round %d, %s: %v after %v", round, sb.Name, x.err, x.took)
			} else {
				s.AddDuration(x.took)
			}
		})
	}
	for _, sb := range rr.hot {
		fire(sb, rr.probeHot)
	}
	fire(rr.frozen, rr.probeFrozen)
	fire(rr.snap, rr.probeSnap)
	err := <-done
	cli.AddDuration(time.Since(t0))
	pw.Wait()
	rr.windows = append(rr.windows, [2]time.Time{t0, time.Now()})
	if err != nil {
		return fmt.Errorf("round %d: %w", round, err)
	}
	// Wait for the repair to end before the next round.
	for ctx.Err() == nil {
		if st, err := rr.cl.Node(ctx); err == nil && st.Reconciling == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// restartsForComparison stops and starts the daemon, as systemctl
// restart does (the sandboxes run on; the listeners close with the
// process).
func (rr *reloadRun) restartsForComparison(ctx context.Context) error {
	restartS := rr.res.AddSeries("restart/gap", "a stop (SIGTERM) and a start: from the SIGTERM to the new process serving with every sandbox repaired", "")
	for i := range rr.c.restarts {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		rr.sd.Stop()
		next, err := bench.StartSandstormd(ctx, rr.r.Binary.Path, rr.data, filepath.Join(rr.r.Dir.Path, fmt.Sprintf("sandstormd-restart-%d.log", i+1)), rr.args...)
		if err != nil {
			return fmt.Errorf("restart %d: %w", i+1, err)
		}
		rr.sd, rr.cl = next, next.Client
		restartS.AddDuration(time.Since(t0))
		rr.restarts = append(rr.restarts, [2]time.Time{t0, time.Now()})
		fmt.Fprintf(os.Stderr, "\rrestart %d/%d", i+1, rr.c.restarts)
		time.Sleep(time.Second)
	}
	fmt.Fprintln(os.Stderr)
	return nil
}

// sortSteady files each steady request under the window it overlapped: a
// reload, a stop and start, or neither.
func (rr *reloadRun) sortSteady() {
	res := rr.res
	during := res.AddSeries("steady/during", "steady clients' requests to hot sandboxes that overlapped a reload (from `sandstormd reload` started to its end)", "")
	duringRestart := res.AddSeries("steady/during-restart", "the same clients' requests that overlapped a stop and start", "")
	outside := res.AddSeries("steady/outside", "the same clients' requests that overlapped neither", "")
	overlaps := func(s sample, ws [][2]time.Time) bool {
		for _, w := range ws {
			if s.start.Before(w[1]) && s.start.Add(s.took).After(w[0]) {
				return true
			}
		}
		return false
	}
	for _, s := range rr.steady {
		series := outside
		switch {
		case overlaps(s, rr.windows):
			series = during
		case overlaps(s, rr.restarts):
			series = duringRestart
		}
		if s.err != nil {
			if series == duringRestart {
				rr.refusedRestart++
			} else {
				rr.refused++
			}
			series.Fail("%v after %v", s.err, s.took)
			continue
		}
		series.AddDuration(s.took)
	}
}

// notes says what the run found, in words.
func (rr *reloadRun) notes() {
	res, c := rr.res, rr.c
	res.Summarize()
	longest := 0.0
	for _, name := range []string{"during/hot", "steady/during"} {
		for _, s := range res.Series {
			if s.Name == name && s.Summary != nil {
				longest = max(longest, s.Summary.MaxMs)
			}
		}
	}
	res.Params["failed_requests"] = rr.refused + len(rr.probeHot.Failures) + len(rr.probeFrozen.Failures) + len(rr.probeSnap.Failures)
	res.Note("%d reloads with %d hot sandboxes and %d steady clients: %d requests failed (refused, reset or unanswered); the longest a request to a hot sandbox waited across a reload was %.1f ms",
		len(rr.windows), c.sandboxes, c.clients, res.Params["failed_requests"], longest)
	res.Params["failed_requests_during_restarts"] = rr.refusedRestart
	res.Note("%d stops and starts (systemctl restart) for comparison: %d of the steady clients' requests that overlapped them failed", len(rr.restarts), rr.refusedRestart)
	res.Note("a connection waits in its listener's accept backlog while the daemon is replaced: Go listens with backlog net.core.somaxconn = %s here (net/sock_linux.go, maxListenerBacklog), so %s connections per listener can wait; beyond that a TCP SYN is dropped and sent again by the client after its retransmission timeout (1 s, RFC 6298), and a connect to a Unix socket fails with EAGAIN", rr.backlog["net.core.somaxconn"], rr.backlog["net.core.somaxconn"])
}

// count counts the lines of path containing s.
func count(path, s string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), s)
}

// steps reads the daemon's log: for each reload, the time from "listeners
// paused" to "executing the new binary", from there to "serving as the new
// binary", and to the "reconcile done" after it.
func steps(path string, drain, start, adopt *bench.Series) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var paused, execed time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		ts, ok := logTime(line)
		if !ok {
			continue
		}
		switch {
		case strings.Contains(line, "reload: listeners paused"):
			paused = ts
		case strings.Contains(line, "reload: executing the new binary") && !paused.IsZero():
			execed = ts
			drain.AddDuration(ts.Sub(paused))
		case strings.Contains(line, "reload: serving as the new binary") && !execed.IsZero():
			start.AddDuration(ts.Sub(execed))
		case strings.Contains(line, "msg=\"reconcile done\"") && !execed.IsZero():
			adopt.AddDuration(ts.Sub(execed))
			paused, execed = time.Time{}, time.Time{}
		}
	}
	return sc.Err()
}

// logTime is the time= of a text log line.
func logTime(line string) (time.Time, bool) {
	v, ok := strings.CutPrefix(line, "time=")
	if !ok {
		return time.Time{}, false
	}
	v, _, _ = strings.Cut(v, " ")
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}
