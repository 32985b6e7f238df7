package sambench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/proxy"

	"sandstorm/internal/bench"
)

// BoundaryConfig is the shape of sam-bench boundary: the boundary's own
// cost (issue 17 item 9), measured against a sam-node and a sam-box it
// starts itself.
type BoundaryConfig struct {
	NodeBin, BoxBin string
	// BoxCPU is the CPU list sam-box is pinned to (taskset -c), "" for
	// none; BoxProcs its GOMAXPROCS (0: Go's default). One CPU and
	// GOMAXPROCS 1 make the refusal rate a per-core figure.
	BoxCPU   string `json:"box_cpu"`
	BoxProcs int    `json:"box_gomaxprocs"`
	// Rounds of: a refusal phase (RefusalConns connections in parallel for
	// RefusalTime, each a loop of raw SOCKS5 bytes), then Pairs requests
	// of each route, interleaved, one at a time.
	Rounds       int           `json:"rounds"`
	RefusalConns int           `json:"refusal_conns"`
	RefusalTime  time.Duration `json:"refusal_time_ns"`
	Pairs        int           `json:"pairs"`
	// DNSSockets UDP sockets, each with DNSWindow queries in flight, ask
	// the boundary's DNS for a name not granted for RefusalTime per round
	// (dnsRefuse); 0 sockets: no DNS phase.
	DNSSockets int `json:"dns_sockets"`
	DNSWindow  int `json:"dns_window"`
	// FloorCmd, if set, starts the floor server (FloorServe) on the socket
	// appended to it, pinned like sam-box: the least CPU a Go server on this
	// machine spends to accept a connection, read, answer and close it.
	FloorCmd []string `json:"floor_cmd,omitempty"`
	// Dir holds the sockets and configuration (a temporary one if empty).
	Dir string `json:"-"`
}

// FloorServe is the floor server: on each connection one read, the 12
// bytes a refusal answers (method selection and SOCKS5 reply 0x02), close.
// What sam-box spends per refusal beyond it is the boundary's own.
func FloorServe(sock string) error {
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	rep := []byte{5, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			var b [512]byte
			c.Read(b[:])
			c.Write(rep)
			c.Close()
		}()
	}
}

// Boundary runs the boundary benchmark into res. Series:
//   - refusal/box-cpu: sam-box's CPU time (utime+stime, /proc) per refused
//     flow over a round; 1/this is refusals per CPU-second of sam-box, the
//     per-core rate when it has one core;
//   - refusal/wall: the round's wall time per refusal (1/this: refusals per
//     second, which the client, the box's core or the kernel limits);
//   - new-flow: a GET /v1/models through the boundary with a new flow
//     (golang.org/x/net/proxy's SOCKS5 client: greeting, wait, request,
//     wait, as curl does; then HTTP/1.1 with Connection: close);
//   - baseline: the same request straight to the node's socket on a kept
//     connection (the seed's baseline), baseline-new-conn on a new one;
//   - overhead: each new-flow sample minus the baseline sample taken just
//     before it;
//   - admission: the boundary's own mean over a round's new flows
//     (Δsum/Δcount of sam_box_admission_seconds).
func Boundary(ctx context.Context, cfg BoundaryConfig, res *bench.Results, logf func(string, ...any)) error {
	if cfg.Rounds < 1 || cfg.RefusalConns < 1 || cfg.RefusalTime <= 0 || cfg.Pairs < 1 {
		return errors.New("boundary: want rounds, refusal conns, refusal time and pairs ≥ 1")
	}
	res.Params["boundary"] = cfg
	dir, done, err := workDir(cfg.Dir, "sam-bench-boundary.")
	if err != nil {
		return err
	}
	defer done()
	rig, err := startRig(ctx, cfg, dir)
	if err != nil {
		return err
	}
	defer rig.stop()
	res.Params["box_pid"] = rig.box.Process.Pid
	res.Note("sam-box pinned to CPUs %q with GOMAXPROCS=%d; sam-node and this client unpinned unless sam-bench itself runs under taskset", cfg.BoxCPU, cfg.BoxProcs)

	b := &boundaryRun{cfg: cfg, rig: rig, logf: logf, series: newBoundarySeries(res),
		sc: &runner{scraper: &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}}}
	for round := range cfg.Rounds {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := b.round(ctx, round); err != nil {
			return err
		}
	}
	rss := ReadProcs([]int{rig.box.Process.Pid, rig.node.Process.Pid})
	res.Params["processes_after"] = rss
	res.Tables = append(res.Tables, boundaryTable(res))
	return nil
}

// boundarySeries are Boundary's series.
type boundarySeries struct {
	boxCPU, wall, clientCPU, floorCPU   *bench.Series
	newFlow, base, baseNew, piped, over *bench.Series
	dnsCPU, dnsWall, adm                *bench.Series
}

func newBoundarySeries(res *bench.Results) boundarySeries {
	return boundarySeries{
		boxCPU:    res.AddSeries("refusal/box-cpu", "sam-box's CPU time (utime+stime) per refused flow over a round: 1/this is refusals per CPU-second of sam-box", ""),
		wall:      res.AddSeries("refusal/wall", "a refusal round's wall time per refused flow: 1/this is refusals per second", "24,000–28,000/s, i.e. 0.036–0.042 ms"),
		clientCPU: res.AddSeries("refusal/client-cpu", "this client's CPU time per refused flow (all its threads)", ""),
		floorCPU:  res.AddSeries("refusal/floor-cpu", "the floor server's CPU time per connection under the same client (accept, one read, the 12 bytes of a refusal, close): the least a Go server spends here", ""),
		newFlow:   res.AddSeries("new-flow", "GET /v1/models through the boundary, a new flow per request (x/net/proxy SOCKS5 then HTTP/1.1), client-side to the end of the body", ""),
		base:      res.AddSeries("baseline", "the same request straight to the node's Unix socket on a kept connection, client-side", "1.39 ms"),
		baseNew:   res.AddSeries("baseline-new-conn", "the same request straight to the node's socket on a new connection each time", ""),
		piped:     res.AddSeries("new-flow-pipelined", "the same new flow from a client that does not wait for the SOCKS5 replies: greeting, CONNECT and the HTTP request in one write (raw bytes), to the end of the body", ""),
		over:      res.AddSeries("overhead", "each new-flow sample minus the baseline sample taken just before it", "+9–157 µs (p50)"),
		dnsCPU:    res.AddSeries("dns-refusal/box-cpu", "sam-box's CPU time per name refused by its DNS (NXDOMAIN: a name the principal is not granted, never dialled) over a round", ""),
		dnsWall:   res.AddSeries("dns-refusal/wall", "a DNS refusal round's wall time per answer: 1/this is names refused per second", ""),
		adm:       res.AddSeries("admission", "the boundary's own mean admission (Classify, decide, open) over a round's new flows: Δsum/Δcount of sam_box_admission_seconds", "18–20 µs"),
	}
}

// boundaryRun is one run of Boundary over its rig.
type boundaryRun struct {
	cfg    BoundaryConfig
	rig    *rig
	sc     *runner
	logf   func(string, ...any)
	series boundarySeries
}

// round is one round: refusals (sam-box, then the floor server), DNS
// refusals, then the latencies with the admission histogram around them.
func (b *boundaryRun) round(ctx context.Context, round int) error {
	if err := b.refusals(ctx, round); err != nil {
		return err
	}
	if err := b.floor(ctx); err != nil {
		return err
	}
	if err := b.dns(ctx, round); err != nil {
		return err
	}
	// Latency: baseline, baseline on a new connection and a new flow
	// through the boundary, interleaved, one request at a time.
	s := b.series
	s1, err := b.sc.scrapeBefore(ctx, b.rig.metrics)
	if err != nil {
		return err
	}
	if err := b.rig.latency(ctx, b.cfg.Pairs, s.newFlow, s.piped, s.base, s.baseNew, s.over); err != nil {
		return err
	}
	b.sc.scrapeAfter(ctx, s1)
	if d := derive([]*Scrape{s1}, DefaultAdmissionMetric, ""); d.AdmissionMeanUs != nil {
		s.adm.Add(*d.AdmissionMeanUs / 1000)
	} else {
		s.adm.Fail("round %d: the admission histogram did not move", round)
	}
	return nil
}

// refusals is a round of flows sam-box refuses, its CPU and the client's
// per refusal, its count checked against the boundary's counter.
func (b *boundaryRun) refusals(ctx context.Context, round int) error {
	s, rig := b.series, b.rig
	s0, err := b.sc.scrapeBefore(ctx, rig.metrics)
	if err != nil {
		return err
	}
	cpu0, err := ProcCPU(rig.box.Process.Pid)
	if err != nil {
		return err
	}
	self0 := SelfCPU()
	n, failed, took := refuse(ctx, rig.agentSock, b.cfg.RefusalConns, b.cfg.RefusalTime)
	cpu1, _ := ProcCPU(rig.box.Process.Pid)
	self1 := SelfCPU()
	b.sc.scrapeAfter(ctx, s0)
	counted := derive([]*Scrape{s0}, "", DefaultRefusalMetric).BoundaryRefusals
	if n == 0 {
		s.wall.Fail("round %d: no refusal (%d failed)", round, failed)
		return nil
	}
	s.boxCPU.Add(float64((cpu1 - cpu0).Nanoseconds()) / 1e6 / float64(n))
	s.wall.Add(float64(took.Nanoseconds()) / 1e6 / float64(n))
	s.clientCPU.Add(float64((self1 - self0).Nanoseconds()) / 1e6 / float64(n))
	if failed > 0 {
		s.wall.Fail("round %d: %d flows were not refused as expected", round, failed)
	}
	if counted == nil || int64(*counted) != n {
		c := -1.0
		if counted != nil {
			c = *counted
		}
		s.wall.Note("round %d: the client counted %d refusals, the boundary %v", round, n, c)
	}
	b.logf("round %d: %d refusals in %v (%.0f/s); sam-box CPU %v (%.0f per CPU-second)", round, n, took.Round(time.Millisecond),
		float64(n)/took.Seconds(), cpu1-cpu0, float64(n)/(cpu1-cpu0).Seconds())
	return nil
}

// floor is the same refusals against the floor server, if there is one.
func (b *boundaryRun) floor(ctx context.Context) error {
	rig := b.rig
	if rig.floor == nil {
		return nil
	}
	f0, err := ProcCPU(rig.floor.Process.Pid)
	if err != nil {
		return err
	}
	fn, _, _ := refuse(ctx, rig.floorSock, b.cfg.RefusalConns, b.cfg.RefusalTime)
	f1, _ := ProcCPU(rig.floor.Process.Pid)
	if fn > 0 {
		b.series.floorCPU.Add(float64((f1 - f0).Nanoseconds()) / 1e6 / float64(fn))
	}
	return nil
}

// dns is a round of names sam-box's DNS refuses, if asked for.
func (b *boundaryRun) dns(ctx context.Context, round int) error {
	s, rig, cfg := b.series, b.rig, b.cfg
	if cfg.DNSSockets <= 0 {
		return nil
	}
	d0, err := ProcCPU(rig.box.Process.Pid)
	if err != nil {
		return err
	}
	dn, lost, dtook := dnsRefuse(ctx, rig.dns, cfg.DNSSockets, cfg.DNSWindow, cfg.RefusalTime)
	d1, _ := ProcCPU(rig.box.Process.Pid)
	if dn == 0 {
		s.dnsWall.Fail("round %d: no name refused (%d queries lost)", round, lost)
		return nil
	}
	s.dnsCPU.Add(float64((d1 - d0).Nanoseconds()) / 1e6 / float64(dn))
	s.dnsWall.Add(float64(dtook.Nanoseconds()) / 1e6 / float64(dn))
	if lost > 0 {
		s.dnsWall.Note("round %d: %d queries got no answer within 200 ms (datagrams dropped by a full socket buffer) and were sent again", round, lost)
	}
	b.logf("round %d: %d names refused by DNS in %v (%.0f/s); sam-box CPU %v (%.0f per CPU-second); %d lost", round, dn, dtook.Round(time.Millisecond),
		float64(dn)/dtook.Seconds(), d1-d0, float64(dn)/(d1-d0).Seconds(), lost)
	return nil
}

// boundaryTable restates the series in the units the goals use:
// µs, and refusals per second from the per-refusal times (the median
// round).
func boundaryTable(res *bench.Results) *bench.Table {
	p := func(name string) (p50, p99 float64, ok bool) {
		for _, s := range res.Series {
			if s.Name == name {
				if sum, err := bench.Summarize(s.SamplesMs); err == nil {
					return sum.P50Ms, sum.P99Ms, true
				}
			}
		}
		return 0, 0, false
	}
	t := &bench.Table{
		Title:       "The boundary's own cost",
		Description: "Medians over the rounds (refusals, admission) and p50/p99 over every pair (latency), nearest rank.",
		Columns:     []string{"figure", "value", "seed", "goal"},
	}
	row := func(fig, val, seed, goal string) { t.Rows = append(t.Rows, []string{fig, val, seed, goal}) }
	if v, _, ok := p("admission"); ok {
		row("admission (boundary's own mean)", fmt.Sprintf("%.1f µs", v*1000), "18–20 µs", "≤ 10 µs")
	}
	if v, q, ok := p("overhead"); ok {
		row("new flow minus baseline, p50 / p99", fmt.Sprintf("%+.0f / %+.0f µs", v*1000, q*1000), "+9–157 µs", "≤ 100 µs (p50)")
	}
	for _, n := range []string{"new-flow", "new-flow-pipelined", "baseline", "baseline-new-conn"} {
		if v, q, ok := p(n); ok {
			row(n+", p50 / p99", fmt.Sprintf("%.3f / %.3f ms", v, q), map[string]string{"baseline": "1.39 ms"}[n], "")
		}
	}
	if v, _, ok := p("refusal/box-cpu"); ok && v > 0 {
		row("refusals per CPU-second of sam-box (per core)", fmt.Sprintf("%.0f/s (%.1f µs each)", 1000/v, v*1000), "", "≥ 100,000/s")
	}
	if v, _, ok := p("dns-refusal/box-cpu"); ok && v > 0 {
		row("names refused by the boundary's DNS per CPU-second of sam-box (per core)", fmt.Sprintf("%.0f/s (%.1f µs each)", 1000/v, v*1000), "", "≥ 100,000/s")
	}
	if v, _, ok := p("refusal/floor-cpu"); ok && v > 0 {
		row("the floor server, per CPU-second", fmt.Sprintf("%.0f/s (%.1f µs each)", 1000/v, v*1000), "", "")
	}
	if v, _, ok := p("refusal/wall"); ok && v > 0 {
		row("refusals per second, wall clock", fmt.Sprintf("%.0f/s", 1000/v), "24,000–28,000/s", "")
	}
	if v, _, ok := p("refusal/client-cpu"); ok && v > 0 {
		row("the client's CPU per refusal", fmt.Sprintf("%.1f µs", v*1000), "", "")
	}
	return t
}

// rig is a sam-node and a sam-box with one boundary, agent-1.
type rig struct {
	node, box, floor    *exec.Cmd
	nodeSock, agentSock string
	floorSock           string
	metrics             string
	dns                 string // the boundary's DNS (udp), on loopback
	base, baseNew       *http.Client
	flow                *http.Client
}

func startRig(ctx context.Context, cfg BoundaryConfig, dir string) (*rig, error) {
	r := &rig{nodeSock: filepath.Join(dir, "node.sock"), agentSock: filepath.Join(dir, "agent-1.sock")}
	// The boundary also listens as on a sandbox's veth, with loopback for
	// both ends (its only peer is 127.0.0.1), for its DNS.
	var ports [3]int
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	r.dns = fmt.Sprintf("127.0.0.1:%d", ports[1])
	files := map[string]string{
		"policy.yaml": "roles: [{name: r, services: [\"inference://*\"]}]\nbindings:\n  - {principal: agent-1, roles: [r]}\n",
		// No provider is contacted: /v1/models is answered from the config.
		"node.yaml": "providers:\n  - {name: none, url: \"http://127.0.0.1:9/v1\", models: [model-a, model-b]}\n",
		"box.yaml": fmt.Sprintf("mesh: unix://%s\npolicy: %s\nboundaries:\n  - {principal: agent-1, socket: %s, listen: 127.0.0.1, peer: 127.0.0.1, proxy_port: %d, dns_port: %d, transparent_port: %d}\n",
			r.nodeSock, filepath.Join(dir, "policy.yaml"), r.agentSock, ports[0], ports[1], ports[2]),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	admin, err := FreePort()
	if err != nil {
		return nil, err
	}
	mport, err := FreePort()
	if err != nil {
		return nil, err
	}
	r.metrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
	if r.node, err = startNode(ctx, cfg.NodeBin, dir, r.nodeSock, admin); err != nil {
		return nil, err
	}
	if err := WaitSocket(ctx, r.nodeSock); err != nil {
		r.stop()
		return nil, fmt.Errorf("sam-node: %w (log: %s)", err, filepath.Join(dir, "sam-node.log"))
	}
	args := []string{"--config", filepath.Join(dir, "box.yaml"), "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", mport)}
	bin := cfg.BoxBin
	if cfg.BoxCPU != "" {
		args = append([]string{"-c", cfg.BoxCPU, bin}, args...)
		bin = "taskset"
	}
	boxLog, _ := os.Create(filepath.Join(dir, "sam-box.log"))
	r.box = exec.CommandContext(ctx, bin, args...)
	r.box.Stdout, r.box.Stderr = boxLog, boxLog
	r.box.Env = os.Environ()
	if cfg.BoxProcs > 0 {
		r.box.Env = append(r.box.Env, "GOMAXPROCS="+strconv.Itoa(cfg.BoxProcs))
	}
	if err := r.box.Start(); err != nil {
		r.stop()
		return nil, fmt.Errorf("sam-box: %w", err)
	}
	if err := WaitSocket(ctx, r.agentSock); err != nil {
		r.stop()
		return nil, fmt.Errorf("sam-box: %w", err)
	}
	if err := r.startFloor(ctx, cfg, dir); err != nil {
		r.stop()
		return nil, err
	}
	if err := r.clients(); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// startFloor starts the floor server beside sam-box, pinned alike, if
// there is one.
func (r *rig) startFloor(ctx context.Context, cfg BoundaryConfig, dir string) error {
	if len(cfg.FloorCmd) == 0 {
		return nil
	}
	r.floorSock = filepath.Join(dir, "floor.sock")
	fargs := append(append([]string(nil), cfg.FloorCmd...), r.floorSock)
	fbin := fargs[0]
	fargs = fargs[1:]
	if cfg.BoxCPU != "" {
		fargs = append([]string{"-c", cfg.BoxCPU, fbin}, fargs...)
		fbin = "taskset"
	}
	r.floor = exec.CommandContext(ctx, fbin, fargs...)
	r.floor.Env = r.box.Env
	if err := r.floor.Start(); err != nil {
		return fmt.Errorf("floor server: %w", err)
	}
	if err := WaitSocket(ctx, r.floorSock); err != nil {
		return fmt.Errorf("floor server: %w", err)
	}
	return nil
}

// clients are the rig's HTTP clients: straight to the node's socket (kept
// and new connections), and through the boundary's SOCKS5, a new flow a
// request.
func (r *rig) clients() error {
	unixTo := func(path string, keep bool) *http.Client {
		var d net.Dialer
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: !keep,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", path) }}}
	}
	r.base, r.baseNew = unixTo(r.nodeSock, true), unixTo(r.nodeSock, false)
	pd, err := proxy.SOCKS5("unix", r.agentSock, nil, nil)
	if err != nil {
		return err
	}
	cd := pd.(proxy.ContextDialer)
	r.flow = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return cd.DialContext(ctx, "tcp", addr) }}}
	return nil
}

func (r *rig) stop() {
	for _, c := range []*exec.Cmd{r.floor, r.box, r.node} {
		StopProc(c)
	}
}

// latency takes pairs samples of each route, interleaved.
func (r *rig) latency(ctx context.Context, pairs int, newFlow, piped, base, baseNew, over *bench.Series) error {
	get := func(c *http.Client, url string, principal bool) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		if principal {
			req.Header.Set("X-Sam-Principal", "agent-1")
		}
		return timed(c, req)
	}
	// One of each first, unrecorded: the kept baseline connection and the
	// boundary's connection to the node are opened here, not in a sample.
	get(r.base, "http://localhost/v1/models", true)
	get(r.flow, "http://mesh.sam.alt/v1/models", false)
	for range pairs {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := get(r.base, "http://localhost/v1/models", true)
		if err != nil {
			base.Fail("%v", err)
			continue
		}
		base.AddDuration(b)
		if d, err := get(r.baseNew, "http://localhost/v1/models", true); err != nil {
			baseNew.Fail("%v", err)
		} else {
			baseNew.AddDuration(d)
		}
		n, err := get(r.flow, "http://mesh.sam.alt/v1/models", false)
		if err != nil {
			newFlow.Fail("%v", err)
			continue
		}
		newFlow.AddDuration(n)
		over.Add(bench.Ms(n) - bench.Ms(b))
		if d, err := pipelinedGet(ctx, r.agentSock); err != nil {
			piped.Fail("%v", err)
		} else {
			piped.AddDuration(d)
		}
	}
	return nil
}

// pipelinedGet is one GET /v1/models through the boundary on a new flow,
// the SOCKS5 greeting, CONNECT and HTTP request sent in one write.
func pipelinedGet(ctx context.Context, sock string) (time.Duration, error) {
	msg := []byte{5, 1, 0, 5, 1, 0, 3, 12}
	msg = append(append(msg, "mesh.sam.alt"...), 0, 80)
	msg = append(msg, "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\nConnection: close\r\n\r\n"...)
	t0 := time.Now()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return 0, err
	}
	br := bufio.NewReader(c)
	var rep [12]byte
	if _, err := io.ReadFull(br, rep[:]); err != nil {
		return 0, err
	}
	if rep[1] != 0 || rep[3] != 0 {
		return 0, fmt.Errorf("socks replies % x", rep)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return time.Since(t0), err
}

// refuse drives refused flows through the boundary's socket from conns
// goroutines for d: each a loop of one connect, one write (greeting and a
// CONNECT to a name the policy does not grant, together), one read of both
// replies, close — raw bytes and a reused buffer, so the client does as
// little as a client can. It returns the flows refused (reply 0x02), those
// that were not, and the time taken.
func refuse(ctx context.Context, sock string, conns int, d time.Duration) (ok, failed int64, took time.Duration) {
	host := "denied.example"
	msg := []byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}
	msg = append(append(msg, host...), 0, 80)
	addr := &net.UnixAddr{Name: sock, Net: "unix"}
	var nOK, nFailed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rep [12]byte
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialUnix("unix", nil, addr)
				if err != nil {
					nFailed.Add(1)
					continue
				}
				_, err = c.Write(msg)
				if err == nil {
					_, err = io.ReadFull(c, rep[:])
				}
				c.Close()
				if err == nil && rep[1] == 0 && rep[3] == 0x02 {
					nOK.Add(1)
				} else {
					nFailed.Add(1)
				}
			}
		}()
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	close(stop)
	wg.Wait()
	return nOK.Load(), nFailed.Load(), time.Since(t0)
}

// ProcCPU is a process's user+system CPU time, from /proc/PID/stat.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields after its ")".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	// Clock ticks: USER_HZ is 100 on Linux.
	return time.Duration(ut+st) * (time.Second / 100), nil
}

// SelfCPU is this process's CPU time, all threads.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// WaitSocket waits (bounded) until a Unix socket accepts a connection.
func WaitSocket(ctx context.Context, path string) error {
	return pollUntil(ctx, 15*time.Second, 20*time.Millisecond, path+" did not accept connections within 15 s", func() bool {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// timed sends req with c and times it to the end of the answer's body; an
// answer other than 200 is an error (named by its status code).
func timed(c *http.Client, req *http.Request) (time.Duration, error) {
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return d, err
}

// pollUntil calls ok, then again after each wait of every, until it
// holds, ctx ends, or within has passed: then the error is timeout.
func pollUntil(ctx context.Context, within, every time.Duration, timeout string, ok func() bool) error {
	deadline := time.Now().Add(within)
	for {
		if ok() {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New(timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
