// Package gateway is the node's ingress: one TCP listener per sandbox port,
// which wakes the sandbox on every new connection and then forwards bytes
// both ways (so HTTP and plain TCP alike). It is flow 2 of the architecture
// map: client → gateway → tier manager wakes the sandbox if needed (one wake
// shared by all waiting requests) → sandbox address:port.
//
// The gateway also keeps gVisor checkpoints possible. runsc refuses to save a
// sandbox with an established TCP endpoint, and kills the sandbox when the
// save fails, so every connection into a sandbox is closed with RST (SO_LINGER
// 0) — never with a FIN that would leave the sandbox's side in TIME_WAIT —
// and Drain closes them all and holds new ones back while a snapshot is taken.
package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Waker is what the gateway needs from the node.
type Waker interface {
	// Wake brings the sandbox to hot, sharing a wake in progress. It
	// returns ErrRefused (wrapped) when the wake cannot start within the
	// admission deadline or the node is short on memory.
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

// ErrRefused marks a wake the node turned away; the gateway answers it with
// 503 and Retry-After.
var ErrRefused = errors.New("wake refused")

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
}

// Gateway holds the listeners of every sandbox on this node.
type Gateway struct {
	cfg   Config
	waker Waker
	log   *slog.Logger

	mu    sync.Mutex
	sands map[string]*sandboxGate
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
	return &Gateway{cfg: cfg, waker: w, log: log, sands: map[string]*sandboxGate{}}
}

// sandboxGate is one sandbox's listeners and live connections.
type sandboxGate struct {
	id        string
	listeners []net.Listener

	mu      sync.Mutex
	blocked bool
	unblock chan struct{} // closed when blocked goes back to false
	conns   map[*pair]struct{}
	dialing sync.WaitGroup
}

// pair is one forwarded connection.
type pair struct {
	mu       sync.Mutex
	client   net.Conn
	upstream net.Conn
	closed   bool
}

// closeRST closes both ends; the sandbox side with RST so no endpoint is
// left in a state gVisor cannot save.
func (p *pair) closeRST() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	if p.upstream != nil {
		resetClose(p.upstream)
	}
	p.client.Close()
}

func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// Listen opens the listeners of sandbox id: for each entry of ports,
// listen on bind:hostPort and forward to target:sandboxPort. Listening again
// for an ID closes its old listeners first.
func (g *Gateway) Listen(id string, bind netip.Addr, target netip.Addr, ports map[int]int) error {
	g.Close(id)
	sg := &sandboxGate{id: id, conns: map[*pair]struct{}{}}
	for sport, hport := range ports {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(bind, uint16(hport)).String())
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

// Close stops sandbox id's listeners and resets its connections.
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
	sg.drain()
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

// Drain holds new connections to sandbox id back and resets every open one,
// waiting for dials in flight first. It returns a func that lets connections
// through again. Call it before a checkpoint.
func (g *Gateway) Drain(id string) (release func()) {
	g.mu.Lock()
	sg := g.sands[id]
	g.mu.Unlock()
	if sg == nil {
		return func() {}
	}
	sg.drain()
	return sg.release
}

// Active returns how many connections sandbox id has open.
func (g *Gateway) Active(id string) int {
	g.mu.Lock()
	sg := g.sands[id]
	g.mu.Unlock()
	if sg == nil {
		return 0
	}
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return len(sg.conns)
}

func (sg *sandboxGate) drain() {
	sg.mu.Lock()
	if !sg.blocked {
		sg.blocked = true
		sg.unblock = make(chan struct{})
	}
	sg.mu.Unlock()
	sg.dialing.Wait()
	sg.mu.Lock()
	conns := make([]*pair, 0, len(sg.conns))
	for p := range sg.conns {
		conns = append(conns, p)
	}
	sg.mu.Unlock()
	for _, p := range conns {
		p.closeRST()
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

// register adds p unless the gate is blocked, in which case it returns the
// channel to wait on.
func (sg *sandboxGate) register(p *pair) (wait <-chan struct{}) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if sg.blocked {
		return sg.unblock
	}
	sg.conns[p] = struct{}{}
	sg.dialing.Add(1)
	return nil
}

func (sg *sandboxGate) unregister(p *pair) {
	sg.mu.Lock()
	delete(sg.conns, p)
	sg.mu.Unlock()
}

func (g *Gateway) serve(sg *sandboxGate, ln net.Listener, target netip.AddrPort) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.log.Warn("gateway accept", "sandbox", sg.id, "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go g.handle(sg, c, target)
	}
}

func (g *Gateway) handle(sg *sandboxGate, client net.Conn, target netip.AddrPort) {
	p := &pair{client: client}
	admitCtx, cancel := context.WithTimeout(context.Background(), g.cfg.Admission)
	defer cancel()
	g.waker.Touch(sg.id)
	// Wake, then register; a snapshot may start in between, in which case
	// registration waits for it to finish and the loop wakes again.
	for {
		if err := g.waker.Wake(admitCtx, sg.id); err != nil {
			g.refuse(client, err)
			return
		}
		wait := sg.register(p)
		if wait == nil {
			break
		}
		select {
		case <-wait:
		case <-admitCtx.Done():
			g.refuse(client, fmt.Errorf("%w: sandbox busy with a transition", ErrRefused))
			return
		}
	}
	up, err := g.dial(target)
	p.mu.Lock()
	drained := p.closed
	if err == nil && !drained {
		p.upstream = up
	}
	p.mu.Unlock()
	sg.dialing.Done()
	if err != nil || drained {
		if up != nil {
			resetClose(up)
		}
		sg.unregister(p)
		if err != nil {
			g.log.Warn("gateway dial", "sandbox", sg.id, "target", target, "err", err)
			g.waker.Unreachable(sg.id)
			g.refuse(client, fmt.Errorf("sandbox did not accept on %s: %w", target, err))
		} else {
			client.Close()
		}
		return
	}
	defer sg.unregister(p)
	defer p.closeRST()

	done := make(chan struct{}, 2)
	go func() { g.copy(client, up, sg.id, false); done <- struct{}{} }() // sandbox → client
	go func() { g.copy(up, client, sg.id, true); done <- struct{}{} }()  // client → sandbox
	// Either direction ending ends the pair, and the sandbox's side is
	// always reset, never sent a FIN: a sandbox that closed first and then
	// got our FIN would sit in TIME_WAIT for a minute, and gVisor cannot
	// checkpoint a sandbox holding such an endpoint (measured: the save
	// fails and kills it). So a client's half-close is not passed on.
	<-done
}

// copy moves bytes from src to dst until either fails. Into the sandbox,
// it thaws a sandbox frozen while the connection was open before each write.
func (g *Gateway) copy(dst, src net.Conn, id string, intoSandbox bool) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			g.waker.Touch(id)
			if intoSandbox && !g.waker.IsHot(id) {
				ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Admission)
				werr := g.waker.Wake(ctx, id)
				cancel()
				if werr != nil {
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// dial connects to the sandbox, retrying while its process is starting
// (connection refused) for up to cfg.Ready.
func (g *Gateway) dial(target netip.AddrPort) (net.Conn, error) {
	deadline := time.Now().Add(g.cfg.Ready)
	backoff := 5 * time.Millisecond
	d := net.Dialer{Timeout: 2 * time.Second}
	if g.cfg.Mark != 0 {
		d.Control = markSocket(g.cfg.Mark)
	}
	for {
		c, err := d.Dial("tcp", target.String())
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(backoff)
		if backoff < 100*time.Millisecond {
			backoff *= 2
		}
	}
}

// markSocket returns a dialer Control that sets SO_MARK to mark before the
// socket connects. A host process dialling a sandbox's address directly
// would leave an established endpoint the gateway cannot reset, and gVisor's
// checkpoint fails on it; the firewall therefore admits only marked ones.
func markSocket(mark int) func(_, _ string, rc syscall.RawConn) error {
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

// refuse turns a connection away. If the client speaks HTTP (its first bytes
// are a request line) it gets a 503 with Retry-After and a JSON body in the
// API's error shape; any other protocol gets a reset.
func (g *Gateway) refuse(c net.Conn, why error) {
	defer resetClose(c)
	g.log.Info("gateway refused", "err", why)
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	br := bufio.NewReader(c)
	head, _ := br.Peek(8)
	if !looksHTTP(head) {
		return
	}
	msg := strconv.Quote(why.Error())
	body := `{"code":"unavailable","message":` + msg + "}\n"
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		g.cfg.RetryAfter, len(body), body)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	// Let the client read the answer before the reset.
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	io.Copy(io.Discard, br)
}

func looksHTTP(b []byte) bool {
	for _, m := range []string{"GET ", "POST", "PUT ", "HEAD", "DELE", "PATC", "OPTI", "CONN", "TRAC"} {
		if len(b) >= 4 && string(b[:4]) == m {
			return true
		}
	}
	return false
}
