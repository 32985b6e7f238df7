package agents

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/client"
	"sandstorm/internal/memguard"
)

// AgentsConfig is the shape of sam-bench agents: the SAM seed's
// thousand-agent run ("A thousand agents on one host" → "What they can
// push") scaled to this machine. The seed drove 200 of 1,000 resident
// sandboxes at once, each through its own boundary, 200 requests each, two
// in flight, to GET http://mesh.sam.alt/v1/models (answered by the node
// itself), from the host into each boundary's SOCKS5 socket.
type AgentsConfig struct {
	// NodeBin is the sam-node binary.
	NodeBin string `json:"node_bin"`
	// Max bounds the fill: real runsc sandboxes of the web demo are
	// created until the node shows it is full or there are Max.
	Max int `json:"max"`
	// Pushers of them push at once, each Requests requests, InFlight at
	// a time on its own kept-alive flows, in Rounds rounds of a push
	// through the boundaries and one straight to sam-node's socket.
	Pushers  int `json:"pushers"`
	Requests int `json:"requests_per_agent"`
	InFlight int `json:"in_flight_per_agent"`
	Rounds   int `json:"rounds"`
	// MemoryMiB is the template's memory limit (memory_mib), what a
	// starting sandbox is admitted at until its template's sandboxes have
	// settled (issue 19).
	MemoryMiB int `json:"memory_mib"`
	// MemoryReserveMiB is sandstormd's --memory-reserve.
	MemoryReserveMiB int `json:"memory_reserve_mib"`
	// Parallel creates at a time; FillFor bounds the fill's time.
	Parallel int           `json:"create_parallel"`
	FillFor  time.Duration `json:"fill_for_ns"`
	// Subnet and GatewayPorts are sandstormd's, to be unused on the host.
	Subnet       string `json:"subnet"`
	GatewayPorts string `json:"gateway_ports"`
	// TaskMargin: the fill stops when the host's tasks (threads) come
	// within this many of the kernel's limit (min of pid_max and
	// threads-max): the machine is shared, and a fork that fails there
	// fails for every process on it.
	TaskMargin int `json:"task_margin"`
	// Timeout bounds one request.
	Timeout time.Duration `json:"timeout_ns"`
	// Quiet is how long no sandbox may leave memory before the pushes
	// start; IdleFor how long the machine's CPU is read with no push,
	// before the fill and with the population resident.
	Quiet   time.Duration `json:"settle_quiet_ns"`
	IdleFor time.Duration `json:"idle_cpu_ns"`
}

// Validate checks the configuration.
func (c *AgentsConfig) Validate() error {
	switch {
	case c.NodeBin == "":
		return errors.New("a sam-node binary is required")
	case c.Max < 1 || c.Pushers < 1 || c.Pushers > c.Max:
		return fmt.Errorf("want 1 ≤ --pushers (%d) ≤ --max (%d)", c.Pushers, c.Max)
	case c.Requests < 1 || c.InFlight < 1 || c.Rounds < 1 || c.Parallel < 1:
		return errors.New("want --requests, --in-flight, --rounds and --parallel ≥ 1")
	case c.MemoryMiB < 16:
		return fmt.Errorf("--memory-mib %d: a web sandbox holds about 25 MiB", c.MemoryMiB)
	case c.FillFor <= 0 || c.Timeout <= 0 || c.Quiet < 0 || c.IdleFor <= 0:
		return errors.New("want --fill-for, --timeout and --idle-cpu > 0, --settle-quiet ≥ 0")
	}
	return nil
}

// The counters a push is checked against (internal/sam/meshnode/metrics.go,
// internal/sam/boundary/metrics.go).
const (
	nodeModelsOK    = `sam_node_requests_total{route="models",code="200"}`
	boxForwarded    = `sam_box_mesh_requests_total{outcome="forwarded"}`
	boxNewMeshFlows = `sam_box_flows_total{route="mesh",outcome="allowed"}`
	agentsTemplate  = "web"
)

// population is one reading of the node with its sandboxes resident.
type population struct {
	Phase           string           `json:"phase"`
	Sandboxes       int              `json:"sandboxes"`
	Tiers           map[api.Tier]int `json:"tiers"`
	PromisedMiB     int64            `json:"promised_mib"`
	MemAvailableMiB int64            `json:"mem_available_mib"`
	Sandstormd      sambench.Proc    `json:"sandstormd"`
	SamNode         sambench.Proc    `json:"sam_node"`
	// Tasks are the host's threads (/proc/loadavg), which pid_max bounds.
	Tasks int `json:"tasks"`
}

// Agents runs the benchmark into br: a sam-node and a sandstormd (master
// and node, idle timers off, the boundaries' policy granting every agent
// inference://*), the node filled with web sandboxes, then Rounds rounds
// of a push through Pushers of their boundaries and the same push straight
// to sam-node's socket. Everything it started is removed before it
// returns — sandboxes deleted, daemons stopped by their PIDs, br.Work
// removed — unless a sandbox could not be deleted, when br.Work is kept
// and the results say so.
func Agents(ctx context.Context, cfg AgentsConfig, br *bench.Run, logf func(string, ...any)) (err error) {
	if err := cfg.Validate(); err != nil {
		return err
	}
	a := &agentsRun{cfg: cfg, br: br, res: br.Results, logf: logf, pids: map[string]int{}}
	// Run last, after every daemon has stopped: what the cleanup left.
	left := 0
	defer func() {
		if left > 0 {
			a.res.Note("cleanup: %d sandbox(es) could not be deleted; %s is kept (sandstormd serve --data-dir %s/d, then sandbox rm)", left, br.Work, br.Work)
			return
		}
		br.Close()
		a.res.Note("cleanup: every sandbox deleted, sandstormd (pid %d) and sam-node (pid %d) stopped, %s removed", a.pids["sandstormd"], a.pids["sam-node"], br.Work)
	}()
	a.res.Params["agents"] = cfg
	a.res.Params["sandstormd"] = br.Binary
	if sum, err := bench.FileSHA256(cfg.NodeBin); err == nil {
		a.res.Params["sam_node_sha256"] = sum
	}
	names, policyPath, err := a.writeConfigs()
	if err != nil {
		return err
	}
	stopNode, err := a.startSamNode(ctx, policyPath)
	if err != nil {
		return err
	}
	defer stopNode()
	err = a.startSandstormd(ctx, policyPath)
	if a.sd != nil {
		defer func() { left = cleanupAgents(a.cl, a.sd, a.data, cfg.Subnet, logf) }()
	}
	if err != nil {
		return err
	}
	defer func() { a.res.Tables = append(a.res.Tables, populationTable(a.pop)) }()
	a.read(ctx, "before the fill")
	a.idleCPU(ctx, "idle, before the fill")
	pushers, err := a.fillAndPick(ctx, names)
	if err != nil {
		return err
	}
	a.idleCPU(ctx, "idle, the population resident")
	return a.pushes(ctx, pushers)
}

// agentsRun is one run of Agents: what it started and what it read.
type agentsRun struct {
	cfg  AgentsConfig
	br   *bench.Run
	res  *bench.Results
	logf func(string, ...any)
	pids map[string]int
	// sam-node's agent socket and admin URL; sandstormd's metrics URL,
	// data dir, client and process.
	nodeSock, adminURL, boxURL, data string
	cl                               *client.Client
	sd                               *bench.Sandstormd
	pop                              []population
	idle                             []Push
}

// writeConfigs writes the policy (every agent's principal granted
// inference://*) and sam-node's config into the work dir.
func (a *agentsRun) writeConfigs() (names []string, policyPath string, err error) {
	work := a.br.Work
	names = make([]string, a.cfg.Max)
	for i := range names {
		names[i] = fmt.Sprintf("agent-%0*d", len(strconv.Itoa(a.cfg.Max)), i+1)
	}
	policyPath = filepath.Join(work, "policy.yaml")
	var pol strings.Builder
	pol.WriteString("roles: [{name: agent, services: [\"inference://*\"]}]\nbindings:\n")
	for _, n := range names {
		fmt.Fprintf(&pol, "  - {principal: %s, roles: [agent]}\n", n)
	}
	// /v1/models is answered from this list: the provider is never
	// called (its URL is loopback's discard port, for the config's sake).
	nodeYAML := "providers:\n  - {name: none, url: \"http://127.0.0.1:9/v1\", models: [model-a, model-b]}\n"
	if err := os.WriteFile(policyPath, []byte(pol.String()), 0o600); err != nil {
		return nil, "", err
	}
	return names, policyPath, os.WriteFile(filepath.Join(work, "node.yaml"), []byte(nodeYAML), 0o600)
}

// startSamNode starts sam-node and waits until it is ready; stop stops it.
func (a *agentsRun) startSamNode(ctx context.Context, policyPath string) (stop func(), err error) {
	stop = func() {}
	a.nodeSock = filepath.Join(a.br.Work, "node.sock")
	adminPort, err := sambench.FreePort()
	if err != nil {
		return stop, err
	}
	a.adminURL = fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	nodeLog, err := os.Create(filepath.Join(a.br.Dir.Path, "sam-node.log"))
	if err != nil {
		return stop, err
	}
	node := exec.Command(a.cfg.NodeBin, "--config", filepath.Join(a.br.Work, "node.yaml"), "--policy", policyPath,
		"--listen", "unix://"+a.nodeSock, "--admin-addr", fmt.Sprintf("127.0.0.1:%d", adminPort), "--log-level", "warn")
	node.Stdout, node.Stderr = nodeLog, nodeLog
	// A group of its own: a Ctrl-C at the terminal reaches this process,
	// which then takes everything down in order, not every daemon at once.
	node.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := node.Start(); err != nil {
		nodeLog.Close()
		return stop, fmt.Errorf("sam-node: %w", err)
	}
	stop = func() { sambench.StopProc(node); nodeLog.Close() }
	a.pids["sam-node"] = node.Process.Pid
	if err := sambench.WaitReady(ctx, a.adminURL+"/readyz"); err != nil {
		return stop, fmt.Errorf("sam-node: %w (log: %s)", err, nodeLog.Name())
	}
	return stop, nil
}

// startSandstormd starts sandstormd (master and node, idle timers off,
// the boundaries' policy the one given) and its web template.
func (a *agentsRun) startSandstormd(ctx context.Context, policyPath string) error {
	metricsPort, err := sambench.FreePort()
	if err != nil {
		return err
	}
	a.boxURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	a.data = filepath.Join(a.br.Work, "d")
	args := []string{"--runsc", a.br.Runsc, "--subnet", a.cfg.Subnet, "--gateway-ports", a.cfg.GatewayPorts, "--log-level", "warn",
		"--freeze-after", "0", "--snapshot-after", "0", "--detach-after", "0",
		"--memory-reserve", strconv.Itoa(a.cfg.MemoryReserveMiB),
		"--policy", policyPath, "--sam-node", "unix://" + a.nodeSock,
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", metricsPort)}
	a.res.Params["sandstormd_args"] = args
	sd, err := bench.StartSandstormd(ctx, a.br.Binary.Path, a.data, filepath.Join(a.br.Dir.Path, "sandstormd.log"), args...)
	if err != nil {
		return err
	}
	a.sd, a.cl = sd, sd.Client
	a.pids["sandstormd"] = sd.Cmd.Process.Pid
	d := a.br.Demo
	if _, err := a.cl.CreateTemplate(ctx, api.TemplateRequest{Name: agentsTemplate, RootfsDir: a.br.Rootfs,
		Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports, MemoryMiB: a.cfg.MemoryMiB}); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	return nil
}

// read records the population at phase: the node's tiers and promises,
// both daemons' processes, the host's tasks and MemAvailable.
func (a *agentsRun) read(ctx context.Context, phase string) population {
	p := population{Phase: phase, Sandstormd: sambench.ReadProc(a.pids["sandstormd"]), SamNode: sambench.ReadProc(a.pids["sam-node"]), Tasks: hostTasks()}
	if st, err := a.cl.Node(context.WithoutCancel(ctx)); err == nil {
		p.Tiers, p.PromisedMiB = st.Sandboxes, st.PromisedMiB
		for _, n := range st.Sandboxes {
			p.Sandboxes += n
		}
	}
	p.MemAvailableMiB, _ = memguard.AvailableMiB()
	a.pop = append(a.pop, p)
	return p
}

// idleCPU records what the machine spends with no push for IdleFor: the
// share of the two cores the pushes cannot have.
func (a *agentsRun) idleCPU(ctx context.Context, what string) {
	c0 := readCPU(a.pids)
	select {
	case <-ctx.Done():
	case <-time.After(a.cfg.IdleFor):
	}
	c1 := readCPU(a.pids)
	a.idle = append(a.idle, Push{Route: what, WallSeconds: c1.at.Sub(c0.at).Seconds(), CPU: c1.since(c0)})
}

// fillAndPick fills the node, lets it settle, and picks Pushers of its
// hot sandboxes, spread evenly over the population in the order it was
// made.
func (a *agentsRun) fillAndPick(ctx context.Context, names []string) ([]api.Sandbox, error) {
	res := a.res
	fillStart := time.Now()
	stoppedBy := fill(ctx, a.cfg, a.cl, names, res, a.logf)
	fillTime := time.Since(fillStart)
	res.Params["fill_seconds"] = fillTime.Seconds()
	res.Params["fill_stopped_by"] = stoppedBy
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Let what started settle (promises kept or dropped), so the reading
	// is of a resident population, not of starts in flight.
	settleStart := time.Now()
	res.Params["off_memory_after_settling"] = settle(ctx, a.cl, a.cfg.Quiet)
	res.Params["settle_seconds"] = time.Since(settleStart).Seconds()
	sbs, err := a.cl.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	var hot []api.Sandbox
	for _, sb := range sbs {
		if sb.Tier == api.TierHot && sb.Boundary != "" {
			hot = append(hot, sb)
		}
	}
	slices.SortFunc(hot, func(a, b api.Sandbox) int { return strings.Compare(a.Name, b.Name) })
	full := a.read(ctx, "filled, idle")
	res.Params["fill_created"] = len(sbs)
	res.Params["fill_hot"] = len(hot)
	a.logf("filled: %d sandboxes (%d hot) in %.0fs, stopped by: %s; settled: MemAvailable %d MiB, tasks %d",
		len(sbs), len(hot), fillTime.Seconds(), stoppedBy, full.MemAvailableMiB, full.Tasks)
	if len(hot) < a.cfg.Pushers {
		return nil, fmt.Errorf("only %d hot sandboxes with a boundary, fewer than --pushers %d", len(hot), a.cfg.Pushers)
	}
	pushers := make([]api.Sandbox, a.cfg.Pushers)
	for i := range pushers {
		pushers[i] = hot[i*len(hot)/a.cfg.Pushers]
	}
	return pushers, nil
}

// pushes runs Rounds rounds, each a push through the pushers' boundaries
// and the same push straight to sam-node, in alternating order so that
// drift does not favour one.
func (a *agentsRun) pushes(ctx context.Context, pushers []api.Sandbox) error {
	pnames := make([]string, len(pushers))
	for i, sb := range pushers {
		pnames[i] = sb.Name
	}
	a.res.Params["pushers"] = pnames
	scrapeTr := &http.Transport{Proxy: nil}
	defer scrapeTr.CloseIdleConnections()
	sc := sambench.NewScraper(&http.Client{Transport: scrapeTr, Timeout: 10 * time.Second})
	var pushes []Push
	rates := map[string][]AgentRate{}
	defer func() { a.res.Tables = append(a.res.Tables, pushTables(pushes, a.idle, rates)...) }()
	for round := 1; round <= a.cfg.Rounds && ctx.Err() == nil; round++ {
		routes := []string{sambench.RouteBoundary, sambench.RouteBaseline}
		if round%2 == 0 {
			routes = []string{sambench.RouteBaseline, sambench.RouteBoundary}
		}
		for _, route := range routes {
			p, ar, err := a.push(ctx, sc, round, route, pushers, pnames)
			if err != nil {
				return err
			}
			pushes = append(pushes, p)
			rates[fmt.Sprintf("%s-%d", route, round)] = ar
			if ctx.Err() != nil {
				break
			}
		}
	}
	a.res.Params["pushes"] = pushes
	return ctx.Err()
}

// push is one round's push on one route, with the servers' counters
// scraped around it and checked against the client's count.
func (a *agentsRun) push(ctx context.Context, sc *sambench.Scraper, round int, route string, pushers []api.Sandbox, pnames []string) (Push, []AgentRate, error) {
	res, cfg := a.res, a.cfg
	agents := make([]*pushAgent, len(pushers))
	for i, sb := range pushers {
		if route == sambench.RouteBoundary {
			var err error
			if agents[i], err = boundaryAgent(sb.Name, sb.Boundary, cfg.InFlight); err != nil {
				return Push{}, nil, err
			}
		} else {
			agents[i] = baselineAgent(sb.Principal, a.nodeSock, cfg.InFlight)
		}
	}
	var sNode, sBox *sambench.Scrape
	var cpu0 cpuReading
	calls, warm := push(ctx, agents, cfg.Requests, cfg.InFlight, cfg.Timeout, func() {
		var err error
		if sNode, err = sc.Before(ctx, a.adminURL+"/metrics"); err != nil {
			res.Note("round %d %s: scrape of sam-node before: %v", round, route, err)
		}
		if route == sambench.RouteBoundary {
			if sBox, err = sc.Before(ctx, a.boxURL); err != nil {
				res.Note("round %d %s: scrape of sandstormd before: %v", round, route, err)
			}
		}
		cpu0 = readCPU(a.pids)
	})
	cpu1 := readCPU(a.pids)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	for _, s := range []*sambench.Scrape{sNode, sBox} {
		if s != nil {
			sc.After(actx, s)
			for _, n := range s.Notes() {
				res.Note("round %d %s: %s", round, route, n)
			}
		}
	}
	cancel()
	p, ar := summarizePush(route, round, pnames, calls)
	p.CPU = cpu1.since(cpu0)
	p.Counters = append(p.Counters, checkCounter(sNode, nodeModelsOK, p.OK))
	if route == sambench.RouteBoundary {
		p.Counters = append(p.Counters, checkCounter(sBox, boxForwarded, p.reachedBoundary()), checkCounter(sBox, boxNewMeshFlows, 0))
	}
	wp, _ := summarizePush(route, round, pnames, warm)
	if wp.Failed > 0 {
		res.Note("round %d %s: %d of %d warmup requests failed: %v", round, route, wp.Failed, wp.Requests, wp.Failures)
	}
	raw := filepath.Join(a.br.Dir.Path, fmt.Sprintf("push-%d-%s.csv.gz", round, route))
	if err := writeCalls(raw, pnames, calls); err != nil {
		res.Note("raw samples of round %d %s not written: %v", round, route, err)
	}
	after := a.read(ctx, fmt.Sprintf("after round %d, %s", round, route))
	a.logf("round %d %s: %d requests, %d failed in %.2fs (%.0f/s); per agent p50 %.0f min %.0f max %.0f req/s; TTFB ms p50 %.2f p95 %.2f p99 %.2f max %.1f; tiers %v",
		round, route, p.Requests, p.Failed, p.WallSeconds, p.PerSecond, p.AgentMedian, p.AgentMin, p.AgentMax,
		p.TTFB.P50, p.TTFB.P95, p.TTFB.P99, p.TTFB.Max, after.Tiers)
	for _, c := range p.Counters {
		if !c.Agree {
			a.logf("round %d %s: %s moved by %g, the client counted %d", round, route, c.Series, c.Delta, c.Client)
		}
	}
	return p, ar, nil
}

// fill creates sandboxes of the web demo, cfg.Parallel at a time, until
// there are cfg.Max, or the node shows it is full — a create refused
// (503), or a sandbox pushed off memory to make room (the node does that
// before it refuses: internal/node/reserve) — or the host's tasks near
// the kernel's limit, or creates keep failing, or cfg.FillFor passes. It
// returns what stopped it.
func fill(ctx context.Context, cfg AgentsConfig, cl *client.Client, names []string, res *bench.Results, logf func(string, ...any)) string {
	fctx, stopFill := context.WithTimeout(ctx, cfg.FillFor)
	defer stopFill()
	var mu sync.Mutex // guards stoppedBy, created, failures
	stoppedBy := ""
	because := func(why string) { // with mu held
		if stoppedBy == "" {
			stoppedBy = why
		}
	}
	stop := func(why string) {
		mu.Lock()
		because(why)
		mu.Unlock()
		stopFill()
	}
	taskLimit := kernelTaskLimit()
	created, failures := 0, 0
	createS := res.AddSeries("fill/create", "POST /v1/sandboxes of the web demo to its answer (runsc run, network, boundary), "+strconv.Itoa(cfg.Parallel)+" at a time", "153 ms (p50, a Firecracker microVM and its agent)")
	watchDone := make(chan struct{})
	go func() {
		// The node's own view, twice a second: a sandbox that left hot
		// with every idle timer off was pushed off memory.
		defer close(watchDone)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		lastLog := time.Now()
		for {
			select {
			case <-fctx.Done():
				return
			case <-t.C:
			}
			st, err := cl.Node(fctx)
			if err != nil {
				continue
			}
			sbs, err := cl.Sandboxes(fctx)
			if err != nil {
				continue
			}
			if down, which := pushedOff(sbs); down > 0 {
				stop(fmt.Sprintf("the node pushed %d sandbox(es) off memory to make room (%s; tiers %v; MemAvailable %d MiB, reserve %d MiB, promised %d MiB)",
					down, which, st.Sandboxes, st.MemAvailableMiB, st.MemReserveMiB, st.PromisedMiB))
				return
			}
			if n := hostTasks(); taskLimit > 0 && n > taskLimit-cfg.TaskMargin {
				stop(fmt.Sprintf("the host's tasks (%d) came within %d of the kernel's limit %d (min of pid_max and threads-max)", n, cfg.TaskMargin, taskLimit))
				return
			}
			if time.Since(lastLog) >= 10*time.Second {
				lastLog = time.Now()
				mu.Lock()
				c := created
				mu.Unlock()
				logf("fill: %d created; MemAvailable %d MiB, promised %d MiB; host tasks %d", c, st.MemAvailableMiB, st.PromisedMiB, hostTasks())
			}
		}
	}()
	(&bench.Filler{Client: cl, Parallel: cfg.Parallel, Count: cfg.Max,
		Request: func(i int) api.SandboxRequest { return api.SandboxRequest{Template: agentsTemplate, Name: names[i-1]} },
		// The first 503 is the node saying it is full: not tried again.
		RetryFor: time.Nanosecond,
		Done: func(i int, a bench.Answer) bool {
			mu.Lock()
			defer mu.Unlock()
			if a.Err != nil {
				createS.Fail("%s: %v", names[i-1], a.Err)
				if _, refused := client.RetryAfterOf(a.Err); refused || a.GaveUp {
					because(fmt.Sprintf("a create was refused: %v", a.Err))
					return true
				}
				if failures++; failures >= 3 {
					because(fmt.Sprintf("creates failed three times, the last: %v", a.Err))
					return true
				}
				return false
			}
			createS.AddDuration(a.Took)
			created++
			return false
		}}).Run(fctx)
	deadline := fctx.Err() == context.DeadlineExceeded
	stopFill()
	<-watchDone
	mu.Lock()
	defer mu.Unlock()
	switch {
	case ctx.Err() != nil:
		because("interrupted")
	case deadline:
		because(fmt.Sprintf("--fill-for %v passed", cfg.FillFor))
	}
	because(fmt.Sprintf("--max %d reached", cfg.Max))
	return stoppedBy
}

// pushedOff counts the sandboxes that are leaving memory or have left it:
// with every idle timer off, only the node's memory guard moves one
// (internal/node/reserve, pushDown). A sandbox still being created is
// listed as detached on its way to hot, and is not counted. It also names
// the first, with its tier.
func pushedOff(sbs []api.Sandbox) (n int, first string) {
	for _, sb := range sbs {
		leaving := sb.Transition != "" && sb.Transition != api.TierHot
		left := sb.Tier != api.TierHot && sb.Transition != api.TierHot
		if leaving || left {
			if n == 0 {
				first = fmt.Sprintf("%s %s→%s", sb.Name, sb.Tier, sb.Transition)
			}
			n++
		}
	}
	return n, strings.TrimSuffix(first, "→")
}

// settle waits until no sandbox is still starting (no memory promised to
// one), then until no sandbox has left memory for quiet, three minutes at
// most in all: a fill that ended because the node began pushing
// sandboxes off memory leaves it at the edge, and it may push a few more
// before it is calm (the first run of this benchmark: 9 in the 17 s after
// the fill, under memory PSI of 11–38 %, two of them agents chosen to push,
// whose boundaries were closed by their checkpoints). It returns how many
// were off memory when it stopped waiting.
func settle(ctx context.Context, cl *client.Client, quiet time.Duration) int {
	deadline := time.Now().Add(3 * time.Minute)
	promised := true
	last, since := -1, time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if promised {
			if st, err := cl.Node(ctx); err == nil && st.PromisedMiB == 0 {
				promised = false
			}
		} else if sbs, err := cl.Sandboxes(ctx); err == nil {
			if n, _ := pushedOff(sbs); n != last {
				last, since = n, time.Now()
			} else if time.Since(since) >= quiet {
				return n
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	return max(last, 0)
}

// cleanupAgents deletes every sandbox through the API, eight at a time
// (a create cut short by an interruption may still finish: the list is
// read again until it is empty), then the template, stops sandstormd by
// its PID and removes what its node left on the host (the runsc root's
// shared mount, the pool's unreachable route). It returns how many
// sandboxes are left.
func cleanupAgents(cl *client.Client, sd *bench.Sandstormd, data, subnet string, logf func(string, ...any)) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	left := -1
	for attempt := 0; attempt < 3; attempt++ {
		sbs, err := cl.Sandboxes(ctx)
		if err != nil {
			logf("cleanup: list: %v", err)
			break
		}
		if left = len(sbs); left == 0 {
			break
		}
		logf("cleanup: deleting %d sandboxes…", len(sbs))
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, sb := range sbs {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := cl.DeleteSandbox(ctx, sb.ID); err != nil {
					logf("cleanup: delete %s: %v", sb.Name, err)
				}
			})
		}
		wg.Wait()
	}
	if left == 0 {
		cl.DeleteTemplate(ctx, agentsTemplate)
	}
	sd.Stop()
	if left != 0 {
		return max(left, 1)
	}
	for syscall.Unmount(filepath.Join(data, "runsc", "null-netns"), syscall.MNT_DETACH) == nil {
	}
	exec.Command("ip", "route", "del", "unreachable", subnet).Run()
	return 0
}

// hostTasks is the number of tasks (threads) on the host: the
// denominator of /proc/loadavg's fourth field.
func hostTasks() int {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	return parseLoadavgTasks(string(b))
}

func parseLoadavgTasks(s string) int {
	f := strings.Fields(s)
	if len(f) < 4 {
		return 0
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0
	}
	n, _ := strconv.Atoi(total)
	return n
}

// kernelTaskLimit is the least of pid_max and threads-max: every thread
// takes a pid (0 if neither can be read).
func kernelTaskLimit() int {
	limit := 0
	for _, p := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		if b, err := os.ReadFile(p); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && (limit == 0 || n < limit) {
				limit = n
			}
		}
	}
	return limit
}

// cpuReading is the CPU time spent so far by the processes named, this
// one (the client) and the whole machine.
type cpuReading struct {
	at                time.Time
	procs             map[string]time.Duration
	self              time.Duration
	busy, total       time.Duration // the machine's, /proc/stat
	machineReadFailed bool
}

func readCPU(pids map[string]int) cpuReading {
	r := cpuReading{at: time.Now(), procs: map[string]time.Duration{}, self: sambench.SelfCPU()}
	for name, pid := range pids {
		if d, err := sambench.ProcCPU(pid); err == nil {
			r.procs[name] = d
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		r.busy, r.total, err = parseProcStat(string(b))
		r.machineReadFailed = err != nil
	} else {
		r.machineReadFailed = true
	}
	return r
}

// since is what was spent from r0 to r, in CPU-seconds: per process, the
// client's, the machine's busy time and its capacity (cores × wall).
func (r cpuReading) since(r0 cpuReading) map[string]float64 {
	out := map[string]float64{"client": (r.self - r0.self).Seconds()}
	for name, d := range r.procs {
		if d0, ok := r0.procs[name]; ok {
			out[name] = (d - d0).Seconds()
		}
	}
	if !r.machineReadFailed && !r0.machineReadFailed {
		out["machine busy"] = (r.busy - r0.busy).Seconds()
		out["machine capacity"] = (r.total - r0.total).Seconds()
	}
	return out
}

// parseProcStat reads the first line of /proc/stat: the machine's busy
// (everything but idle and iowait) and total CPU time, in USER_HZ (100)
// ticks.
func parseProcStat(s string) (busy, total time.Duration, err error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var idle int64
	var sum int64
	// user nice system idle iowait irq softirq steal (guest time is
	// already in user and nice, so it is not added again).
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q: %w", v, err)
		}
		sum += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	tick := time.Second / 100
	return time.Duration(sum-idle) * tick, time.Duration(sum) * tick, nil
}
