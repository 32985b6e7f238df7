// Package gateway is the node's ingress: one TCP listener per sandbox port,
// which wakes the sandbox on every new connection and then forwards bytes
// both ways (so HTTP and plain TCP alike). It is flow 2 of the architecture
// map: client → gateway → tier manager wakes the sandbox if needed (one wake
// shared by all waiting requests) → sandbox address:port.
//
// A snapshot must lose no request (issue 8: with 6 clients calling a
// sandbox in a loop while it was snapshot, 10 of 452 requests failed, reset
// by the drain). So the gateway knows HTTP/1.x when it sees it (http.go):
// a connection whose client speaks first with a request line is forwarded
// request by request, and Drain, before a checkpoint, holds new requests
// back, waits for those in flight to be answered, and then closes only the
// sandbox's side of each connection; the client keeps its connection, and
// its next request wakes the sandbox and goes over a new one. Any other
// protocol is forwarded byte for byte (raw.go) and reset by Drain, since
// the gateway cannot tell where its messages end.
//
// Connections into a sandbox are closed with RST (SO_LINGER 0), never with
// a FIN that would leave the sandbox's side in TIME_WAIT: runsc 2022-12
// refused to checkpoint such an endpoint and killed the sandbox. (The
// pinned runsc saves them; the reset costs nothing and keeps images small.)
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"sandstorm/internal/errdefs"
)

// Waker is what the gateway needs from the node.
type Waker interface {
	// Wake brings the sandbox to hot, sharing a wake in progress. A wake
	// the node turns away (no wake slot, the sandbox busy, no memory in
	// time) is an errdefs.ErrNoRoom — the node's own refinement of it —
	// which the gateway answers with 503 and Retry-After.
	Wake(ctx context.Context, id string) error
	// IsHot is a cheap check made before every write into the sandbox, so
	// that bytes on an open connection to a frozen sandbox thaw it.
	IsHot(id string) bool
	// Touch records activity, keeping the idle timer fresh.
	Touch(id string)
	// Unreachable reports that a hot sandbox did not accept a connection
	// within the ready timeout, so the node can check whether its process
	// is gone.
	Unreachable(id string)
}

// errGateBusy is the gateway's own refusal: a connection whose sandbox
// stayed busy with a transition past the admission deadline (503).
var errGateBusy = errdefs.Refine(errdefs.ErrNoRoom, "wake refused")

// Config sets the gateway's timeouts.
type Config struct {
	// Admission bounds how long a new connection waits for its wake to
	// start; the seed's "a wake that cannot start within 2 s is refused
	// rather than queued". Default 2 s.
	Admission time.Duration
	// Ready bounds how long the gateway keeps retrying the dial into a
	// sandbox whose process is still starting (a cold start). Default 30 s.
	Ready time.Duration
	// RetryAfter is the Retry-After value sent with a 503, in seconds.
	RetryAfter int
	// Mark is the socket mark (SO_MARK) put on every connection into a
	// sandbox. The node's firewall lets only marked connections in (see
	// netns.Firewall.IngressMark); 0 sets none.
	Mark int
	// DrainWait bounds how long Drain waits for requests in flight to be
	// answered before it resets what is left. Default 5 s.
	DrainWait time.Duration
	// Listen, if set, opens every listener of the gateway: it may return
	// one it has already (a listener handed over by the process this one
	// replaced, internal/handoff), else calls open. Nil: open.
	Listen func(network, address string, open func() (net.Listener, error)) (net.Listener, error)
}

// Gateway holds the listeners of every sandbox on this node.
type Gateway struct {
	cfg   Config
	waker Waker
	log   *slog.Logger

	mu    sync.Mutex
	sands map[string]*sandboxGate

	// handover is set by Handover: the process is about to be replaced
	// (handover.go).
	handover atomic.Bool
	// active counts accept loops and the connections they handed on
	// (handover.go), so Handover knows when all are done.
	active activity
}

// New returns a gateway that wakes sandboxes through w.
func New(cfg Config, w Waker, log *slog.Logger) *Gateway {
	if cfg.Admission <= 0 {
		cfg.Admission = 2 * time.Second
	}
	if cfg.Ready <= 0 {
		cfg.Ready = 30 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 1
	}
	if cfg.DrainWait <= 0 {
		cfg.DrainWait = 5 * time.Second
	}
	return &Gateway{cfg: cfg, waker: w, log: log, sands: map[string]*sandboxGate{}}
}

// sandboxGate is one sandbox's listeners and live connections.
type sandboxGate struct {
	id        string
	listeners []net.Listener
	// targets are the sandbox's address:port for each of its ports, for
	// the Host-routed listener (host.go).
	targets map[int]netip.AddrPort

	mu      sync.Mutex
	blocked bool
	unblock chan struct{} // closed when blocked goes back to false
	conns   map[*pair]struct{}
	// busy counts the pairs Drain must wait for: being set up (woken,
	// dialled, first bytes not yet seen) or forwarding an HTTP request.
	busy int
	// idle is signalled (under mu) whenever busy drops.
	idle *sync.Cond
	// answering counts the HTTP exchanges under way: a request sent into
	// the sandbox whose answer has not been relayed to its end (Busy).
	answering atomic.Int32
}

func newGate(id string) *sandboxGate {
	sg := &sandboxGate{id: id, conns: map[*pair]struct{}{}, targets: map[int]netip.AddrPort{}}
	sg.idle = sync.NewCond(&sg.mu)
	return sg
}

// pair is one client connection and, while it has one, its connection into
// the sandbox.
type pair struct {
	client net.Conn

	// All below under the gate's mu.
	upstream net.Conn
	// http: the client speaks HTTP/1.x; between requests its upstream may
	// be closed by Drain and dialled again by the next request.
	http bool
	// busy: counted in the gate's busy.
	busy   bool
	closed bool
}

// Listen opens the listeners of sandbox id: for each entry of ports,
// listen on bind:hostPort and forward to target:sandboxPort. Listening again
// for an ID closes its old listeners first.
func (g *Gateway) Listen(id string, bind netip.Addr, target netip.Addr, ports map[int]int) error {
	g.Close(id)
	sg := newGate(id)
	for sport := range ports {
		sg.targets[sport] = netip.AddrPortFrom(target, uint16(sport))
	}
	for sport, hport := range ports {
		ln, err := g.listen("tcp", netip.AddrPortFrom(bind, uint16(hport)).String())
		if err != nil {
			for _, l := range sg.listeners {
				l.Close()
			}
			return fmt.Errorf("gateway: listen for sandbox %s port %d: %w", id, sport, err)
		}
		sg.listeners = append(sg.listeners, ln)
		go g.serve(sg, ln, netip.AddrPortFrom(target, uint16(sport)))
	}
	g.mu.Lock()
	g.sands[id] = sg
	g.mu.Unlock()
	return nil
}

// Close stops sandbox id's listeners and resets its connections, the
// clients' sides included.
func (g *Gateway) Close(id string) {
	g.mu.Lock()
	sg := g.sands[id]
	delete(g.sands, id)
	g.mu.Unlock()
	if sg == nil {
		return
	}
	for _, l := range sg.listeners {
		l.Close()
	}
	sg.mu.Lock()
	sg.block()
	conns := sg.snapshotConns()
	sg.mu.Unlock()
	for _, p := range conns {
		sg.closePair(p)
	}
	sg.release()
}

// CloseAll stops every listener (daemon shutdown).
func (g *Gateway) CloseAll() {
	g.mu.Lock()
	ids := make([]string, 0, len(g.sands))
	for id := range g.sands {
		ids = append(ids, id)
	}
	g.mu.Unlock()
	for _, id := range ids {
		g.Close(id)
	}
}

// Drain makes sandbox id ready for a checkpoint or a teardown: it holds new
// connections and new requests back, waits (at most DrainWait) for the ones
// in flight to be answered, then closes every connection into the sandbox.
// An HTTP client keeps its connection: its next request waits for release,
// wakes the sandbox and is sent over a new one. Other connections, and
// requests still unanswered after DrainWait, are reset. It returns a func
// that lets connections and requests through again.
func (g *Gateway) Drain(id string) (release func()) {
	g.mu.Lock()
	sg := g.sands[id]
	g.mu.Unlock()
	if sg == nil {
		return func() {}
	}
	sg.drain(g.cfg.DrainWait)
	return sg.release
}

// Active returns how many of sandbox id's connections a Drain now would
// cut or wait for: those being set up, those forwarding an HTTP request,
// and every non-HTTP one. An HTTP client between requests does not count.
func (g *Gateway) Active(id string) int {
	g.mu.Lock()
	sg := g.sands[id]
	g.mu.Unlock()
	if sg == nil {
		return 0
	}
	sg.mu.Lock()
	defer sg.mu.Unlock()
	n := 0
	for p := range sg.conns {
		if p.busy || !p.http {
			n++
		}
	}
	return n
}

// Stats is what the gateway holds now, across its sandboxes: client
// connections open (admitted, and not yet closed), and those in flight —
// being set up (the sandbox woken, dialled, its first bytes not yet seen)
// or forwarding an HTTP request: what a checkpoint's Drain waits for. The
// node's metrics read it at each scrape (internal/metrics).
func (g *Gateway) Stats() (conns, inFlight int) {
	for _, sg := range g.gates() {
		sg.mu.Lock()
		conns += len(sg.conns)
		inFlight += sg.busy
		sg.mu.Unlock()
	}
	return conns, inFlight
}

// gates is every sandbox's gate now, read under g.mu so that each can
// then be locked on its own.
func (g *Gateway) gates() []*sandboxGate {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Collect(maps.Values(g.sands))
}

// Busy reports whether sandbox id is answering an HTTP request: one sent
// into it whose answer has not been relayed to its end (a streamed answer
// included). Someone is waiting on it, so the node's idle timers and
// memory guard leave it alone, as they leave one running a command: a
// request that took longer than --freeze-after to answer was frozen under
// itself, and answered only once another byte came in to thaw it. A
// connection that is open but quiet (between requests, a raw stream, one
// whose first bytes have not come) is not busy: freezing keeps it, and
// its next byte thaws the sandbox.
func (g *Gateway) Busy(id string) bool {
	g.mu.Lock()
	sg := g.sands[id]
	g.mu.Unlock()
	return sg != nil && sg.answering.Load() > 0
}

// block stops new connections and requests (under mu).
func (sg *sandboxGate) block() {
	if !sg.blocked {
		sg.blocked = true
		sg.unblock = make(chan struct{})
	}
}

func (sg *sandboxGate) snapshotConns() []*pair {
	conns := make([]*pair, 0, len(sg.conns))
	for p := range sg.conns {
		conns = append(conns, p)
	}
	return conns
}

func (sg *sandboxGate) drain(wait time.Duration) {
	sg.mu.Lock()
	sg.block()
	if sg.busy > 0 {
		// sync.Cond has no timeout: a timer broadcasts once the wait is up.
		expired := false
		t := time.AfterFunc(wait, func() {
			sg.mu.Lock()
			expired = true
			sg.idle.Broadcast()
			sg.mu.Unlock()
		})
		for sg.busy > 0 && !expired {
			sg.idle.Wait()
		}
		t.Stop()
	}
	var cut []*pair
	for p := range sg.conns {
		if p.http && !p.busy {
			// Between requests: only the sandbox's side goes.
			if p.upstream != nil {
				resetClose(p.upstream)
				p.upstream = nil
			}
			continue
		}
		cut = append(cut, p)
	}
	sg.mu.Unlock()
	for _, p := range cut {
		sg.closePair(p)
	}
}

func (sg *sandboxGate) release() {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if sg.blocked {
		sg.blocked = false
		close(sg.unblock)
	}
}

// closePair resets both ends of p (the sandbox's with RST) and forgets it.
func (sg *sandboxGate) closePair(p *pair) {
	sg.mu.Lock()
	if p.closed {
		sg.mu.Unlock()
		return
	}
	p.closed = true
	up := p.upstream
	p.upstream = nil
	sg.setBusy(p, false)
	delete(sg.conns, p)
	sg.mu.Unlock()
	if up != nil {
		resetClose(up)
	}
	p.client.Close()
}

// setBusy changes p's busy mark and the gate's count (under mu).
func (sg *sandboxGate) setBusy(p *pair, busy bool) {
	if p.busy == busy {
		return
	}
	p.busy = busy
	if busy {
		sg.busy++
	} else {
		sg.busy--
		sg.idle.Broadcast()
	}
}

// admit waits until the gate lets p through and marks it busy, or returns
// false when ctx ends first or p was closed. A new pair is registered here.
func (sg *sandboxGate) admit(ctx context.Context, p *pair) bool {
	for {
		sg.mu.Lock()
		if p.closed {
			sg.mu.Unlock()
			return false
		}
		if !sg.blocked {
			sg.conns[p] = struct{}{}
			sg.setBusy(p, true)
			sg.mu.Unlock()
			return true
		}
		wait := sg.unblock
		sg.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return false
		}
	}
}

// done marks p no longer busy.
func (sg *sandboxGate) done(p *pair) {
	sg.mu.Lock()
	sg.setBusy(p, false)
	sg.mu.Unlock()
}

// currentUpstream is p's connection into the sandbox, nil if Drain closed it.
func (sg *sandboxGate) currentUpstream(p *pair) net.Conn {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return p.upstream
}

// setUpstream gives p a new connection into the sandbox; it fails (and
// resets up) if p was closed meanwhile.
func (sg *sandboxGate) setUpstream(p *pair, up net.Conn) bool {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if p.closed {
		resetClose(up)
		return false
	}
	p.upstream = up
	return true
}

func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func (g *Gateway) serve(sg *sandboxGate, ln net.Listener, target netip.AddrPort) {
	g.accept(ln, g.log.With("sandbox", sg.id), "gateway accept", func(c net.Conn) { g.handle(sg, c, target) })
}

// accept runs handle on each connection ln accepts, in its own goroutine,
// until ln is closed. The loop and each handler count as active (what
// Handover waits for); a failed accept is logged (msg) and retried after
// a pause, so that running out of descriptors does not spin.
func (g *Gateway) accept(ln net.Listener, log *slog.Logger, msg string, handle func(net.Conn)) {
	g.active.add(1)
	defer g.active.add(-1)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Warn(msg, "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		g.active.add(1)
		go func() {
			defer g.active.add(-1)
			handle(c)
		}()
	}
}

// wakeAndAdmit wakes the sandbox and lets p through the gate, waking again
// if a drain came in between (the sandbox may have gone to disk meanwhile).
// The whole is bounded by the admission deadline.
func (g *Gateway) wakeAndAdmit(sg *sandboxGate, p *pair) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Admission)
	defer cancel()
	for {
		if err := g.waker.Wake(ctx, sg.id); err != nil {
			return err
		}
		if !sg.admit(ctx, p) {
			if ctx.Err() != nil {
				return fmt.Errorf("%w: sandbox busy with a transition", errGateBusy)
			}
			return net.ErrClosed
		}
		if g.waker.IsHot(sg.id) {
			return nil
		}
		// Drained and released to another tier before we got in.
		sg.done(p)
	}
}

// open wakes sg's sandbox, lets p through its gate and dials target, the
// upstream it returns. If that fails, p's client is refused with why
// (unless the gate was closed under it) and p closed.
func (g *Gateway) open(sg *sandboxGate, p *pair, target netip.AddrPort, refuse func(why error)) (net.Conn, bool) {
	g.waker.Touch(sg.id)
	if err := g.wakeAndAdmit(sg, p); err != nil {
		if !errors.Is(err, net.ErrClosed) {
			refuse(err)
		}
		sg.closePair(p)
		return nil, false
	}
	up, err := g.dial(sg.id, target)
	if err != nil {
		g.log.Warn("gateway dial", "sandbox", sg.id, "target", target, "err", err)
		g.waker.Unreachable(sg.id)
		refuse(fmt.Errorf("sandbox did not accept on %s: %w", target, err))
		sg.closePair(p)
		return nil, false
	}
	return up, true
}

// handle serves one client connection: wake, dial, then find out who
// speaks first (see sniff) and forward as HTTP or as bytes.
func (g *Gateway) handle(sg *sandboxGate, client net.Conn, target netip.AddrPort) {
	p := &pair{client: client}
	up, ok := g.open(sg, p, target, func(err error) { g.refuse(client, err) })
	if !ok {
		return
	}
	if !sg.setUpstream(p, up) {
		client.Close()
		return
	}
	defer sg.closePair(p)
	first := g.sniff(client, up)
	if first.http {
		sg.mu.Lock()
		p.http = true
		sg.mu.Unlock()
		g.serveHTTP(sg, p, target, first.client)
		return
	}
	sg.done(p) // a raw pair is not waited for: Drain resets it
	if g.handover.Load() {
		return // nor by Handover: cut
	}
	g.forwardRaw(sg, p, up, first)
}

// dial connects to the sandbox, retrying while its process is starting
// (connection refused) for up to cfg.Ready, DialInterval apart. Each retry
// touches the sandbox's idle timer: a client waiting for its process to
// listen is activity, and a short freeze-after must not freeze a cold
// start under the request that woke it (CI: TestDiskReserve, a Python demo
// slower to listen than a 300 ms freeze-after, its request reset by the
// freeze's drain).
func (g *Gateway) dial(id string, target netip.AddrPort) (net.Conn, error) {
	start := time.Now()
	deadline := start.Add(g.cfg.Ready)
	d := net.Dialer{Timeout: 2 * time.Second}
	if g.cfg.Mark != 0 {
		d.Control = MarkSocket(g.cfg.Mark)
	}
	for {
		c, err := d.Dial("tcp", target.String())
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		g.waker.Touch(id)
		time.Sleep(DialInterval(time.Since(start)))
	}
}

// The dial's schedule. A refused connect is not free for the sandbox: its
// sentry takes the SYN and answers the RST on the CPU the starting program
// needs, about 0.75 ms of the sandbox's CPU time each (its cgroup's, read
// at the first answer: with a retry every 2 ms a cold start of the web
// demo took 369 ms of sandbox CPU against 292 with one every 20 ms, the
// 64 MiB app 845 against 649, for ≈ 110 and 240 refused connects;
// bench/results/2026-12-03-d946f31-systrap-cpu-dial2ms and …-dial20ms).
// So a fixed short interval slowed every cold start by about a quarter,
// and a fixed long one would hold a fast starter's first answer back by
// up to that interval. DialInterval minimises the two together: for a
// program that listens after t, retries i apart cost ≈ probeCost·t/i of
// its CPU and answer ≈ i/2 late on average, a sum that is least at
// i = √(2·probeCost·t). Not knowing t, the dial takes the time it has
// already waited for it: 1 ms at first, 4 ms after 10 ms, 12 after 100,
// 21 after 300, 32 after 700 (45 refused connects for a 700 ms start,
// where a 2 ms retry made about 240), and never more than dialMax.
const (
	dialProbeCost = 750 * time.Microsecond
	dialMin       = time.Millisecond
	dialMax       = 40 * time.Millisecond
)

// DialInterval is how long the gateway waits before it dials a starting
// sandbox again, elapsed after its first dial (see dialProbeCost).
func DialInterval(elapsed time.Duration) time.Duration {
	if elapsed <= 0 {
		return dialMin
	}
	i := time.Duration(math.Sqrt(2 * float64(dialProbeCost) * float64(elapsed)))
	return min(max(i, dialMin), dialMax)
}

// MarkSocket returns a dialer Control that sets SO_MARK to mark before the
// socket connects. A host process dialling a sandbox's address directly
// would leave an established endpoint the gateway cannot reset, and gVisor's
// checkpoint fails on it; the firewall therefore admits only marked ones:
// the gateway's, and the node's calls to envd (internal/node/envdlink).
func MarkSocket(mark int) func(_, _ string, rc syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, mark)
		})
		if err != nil {
			return err
		}
		return serr
	}
}
