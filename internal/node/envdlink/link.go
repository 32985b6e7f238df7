package envdlink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fullduplex"
	"sandstorm/internal/gateway"
	"sandstorm/internal/node/layout"
)

// Config is what every Link of a node shares.
type Config struct {
	// Mark is the firewall mark that lets a connection from the host
	// into a sandbox (the gateway's); 0: none.
	Mark int
	// Ready bounds the wait for an envd that is the sandbox's init to
	// answer (default 30 s).
	Ready time.Duration
	Log   *slog.Logger
}

// Sandbox is how to reach one sandbox's envd, read on a Link's first call.
type Sandbox struct {
	ID string
	// Target is envd's address: the sandbox's own, on its veth.
	Target netip.AddrPort
	// Init: envd is the sandbox's init (the template's process.envd);
	// the Link waits for it rather than starting one.
	Init bool
	// Exec runs a command in the sandbox (runsc exec); nil when the
	// backend cannot, and envd then cannot be started.
	Exec func(ctx context.Context, args []string) ([]byte, error)
}

// Link is the node's way to one sandbox's envd: its calls in flight (they
// keep the sandbox busy) and a way to cut them, and the connections kept
// to it between calls. Each Link has its own locks.
type Link struct {
	start sync.Mutex // one start of envd at a time
	calls atomic.Int32
	cuts  sync.Map // *int → context.CancelFunc

	mu sync.Mutex // guards tr
	tr *transport
}

// Busy reports whether a call to the sandbox's envd is in flight: a
// command someone waits on keeps the sandbox hot.
func (l *Link) Busy() bool { return l.calls.Load() > 0 }

// Cut ends the calls in flight and closes the connections kept: before a
// snapshot, a detach or a delete, whose sandbox will not answer them.
// why is what a cut call answers: its error if nothing of its answer was
// sent, else its Connect stream's end (cutWriter). The next call makes a
// new transport.
func (l *Link) Cut(why error) {
	l.cuts.Range(func(_, v any) bool {
		v.(context.CancelCauseFunc)(why)
		return true
	})
	l.Drop()
}

// Drop closes the connections kept to the sandbox's envd (they died with
// its processes); the next call makes a new transport.
func (l *Link) Drop() {
	l.mu.Lock()
	tr := l.tr
	l.tr = nil
	l.mu.Unlock()
	if tr != nil {
		tr.CloseIdleConnections()
	}
}

// Hold counts a call as in flight until the returned func is called:
// from before the sandbox is woken for it.
func (l *Link) Hold() (release func()) {
	l.calls.Add(1)
	return func() { l.calls.Add(-1) }
}

// Serve forwards r to the sandbox's envd as a call of path (e.g.
// /process.Process/Start, /files), streaming the answer back; the caller
// has woken the sandbox and holds the call (Hold). The sandbox is read by
// resolve on the Link's first call, and envd is started in it if it is
// not running. A Cut cuts the call. An error is returned only when
// nothing was written.
func (l *Link) Serve(cfg Config, w http.ResponseWriter, r *http.Request, path string, resolve func(context.Context) (Sandbox, error)) error {
	tr, err := l.transport(r.Context(), cfg, resolve)
	if err != nil {
		return err
	}
	ctx, done := l.cuttable(r.Context())
	defer done()
	// The request's body is still being forwarded when the answer starts
	// (a stream's first event): an HTTP/1 server would otherwise make the
	// body unreadable at the first flush ("the request body may be
	// unavailable", net/http ResponseWriter), and the call would die
	// half-way. Guard makes the answer full duplex.
	body := fullduplex.Guard(w, r)
	defer body.Stop()
	var failed error
	proxy := &httputil.ReverseProxy{
		ModifyResponse: body.Respond,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = tr.sb.Target.String()
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = tr.sb.Target.String()
		},
		Transport:     tr,
		FlushInterval: -1, // server streams: every event at once
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			failed = err
		},
	}
	if cut := proxied(ctx, proxy, w, r); cut != nil {
		return cut
	}
	var starting *startError
	if errors.As(failed, &starting) {
		return starting.err // envd could not be started or did not answer: its own error
	}
	if failed != nil && !errors.Is(ctx.Err(), context.Canceled) {
		// Not ErrUnavailable: that says the node is down, and the node
		// answers; the sandbox's envd did not (500, with why).
		return fmt.Errorf("envd of sandbox %s did not answer: %w (sandstormd sandbox logs %s may say why)", tr.sb.ID, failed, tr.sb.ID)
	}
	return nil
}

// cuttable is ctx, cancelled by a Cut until done is called (which cancels
// it too).
func (l *Link) cuttable(ctx context.Context) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	key := new(int)
	l.cuts.Store(key, cancel)
	return ctx, func() {
		l.cuts.Delete(key)
		cancel(nil)
	}
}

// proxied serves r by p, writing to w, and says how a call ended that
// was cut (ctx, from cuttable; the caller's own r.Context not done): its
// Cut's reason if nothing of the answer was sent, nil if its stream was
// ended with it. A cut otherwise, or a failed copy, tears the connection
// (http.ErrAbortHandler, re-raised), as the proxy does.
func proxied(ctx context.Context, p *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) (cut error) {
	cw := &cutWriter{ResponseWriter: w}
	aborted := false
	func() {
		defer func() {
			if v := recover(); v != nil {
				if v != http.ErrAbortHandler {
					panic(v)
				}
				aborted = true
			}
		}()
		p.ServeHTTP(cw, r.WithContext(ctx))
	}()
	if why := context.Cause(ctx); ctx.Err() != nil && r.Context().Err() == nil && why != nil && why != context.Canceled {
		if !cw.wrote {
			return why
		}
		if cw.end(why) {
			return nil
		}
	}
	if aborted {
		panic(http.ErrAbortHandler)
	}
	return nil
}

// ServePort forwards r, as it came, to target, a port of the sandbox
// other than envd's, streaming both ways (an upgrade too); the caller has
// woken the sandbox and holds the call (Hold). A Cut cuts it, as envd's
// calls: no connection into the sandbox outlives a checkpoint. Each call
// has its own connection: what listens there is the sandbox's, and may
// not keep one. An error is returned only when nothing was written.
func (l *Link) ServePort(cfg Config, w http.ResponseWriter, r *http.Request, target netip.AddrPort) error {
	ctx, done := l.cuttable(r.Context())
	defer done()
	body := fullduplex.Guard(w, r)
	defer body.Stop()
	d := dialer(cfg.Mark, 5*time.Second)
	var failed error
	proxy := &httputil.ReverseProxy{
		ModifyResponse: body.Respond,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target.String()
			pr.Out.Host = r.Host // the name it was asked by, as E2B's proxy passes it
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialStarting(ctx, d, target.String(), cfg.Ready)
			},
			DisableKeepAlives: true,
		},
		FlushInterval: -1,
		ErrorHandler:  func(_ http.ResponseWriter, _ *http.Request, err error) { failed = err },
	}
	if cut := proxied(ctx, proxy, w, r); cut != nil {
		return cut
	}
	if failed != nil && !errors.Is(ctx.Err(), context.Canceled) {
		return errdefs.Mark(errdefs.ErrUpstream, fmt.Errorf("port %d of the sandbox did not answer: %w", target.Port(), failed))
	}
	return nil
}

// dialStarting dials target, retrying while it refuses for up to ready
// (default 30 s), on the gateway's schedule (gateway.DialInterval): a
// sandbox the call woke from detached is cold-started and its program
// may not listen yet, and the call waits for it as the gateway's do.
func dialStarting(ctx context.Context, d *net.Dialer, target string, ready time.Duration) (net.Conn, error) {
	if ready <= 0 {
		ready = 30 * time.Second
	}
	start := time.Now()
	for {
		c, err := d.DialContext(ctx, "tcp", target)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > ready {
			return c, err
		}
		t := time.NewTimer(gateway.DialInterval(time.Since(start)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// transport is the way to one sandbox's envd: HTTP/1.1 on its own
// address, no proxy from the environment, connections kept between calls
// and closed by Cut before the sandbox is checkpointed, detached or
// deleted (an established connection would be in the checkpoint, where
// gVisor cannot keep it, and dead after a cold start; the gateway drains
// its own for the same reason). A kept connection saves a handshake into
// the sandbox's netstack on every call: a GET /health took 2.4 ms on a
// new connection and 0.7–1.0 ms on a kept one (p50 of 50).
type transport struct {
	*http.Transport
	sb Sandbox
}

// startError is envd failing to start or answer, as the transport's dial
// met it: Serve returns its error as it is (a 504 for an init envd that
// does not answer, a 500 for one that would not start).
type startError struct{ err error }

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

// transport is the Link's transport, made on its first call. Its dial
// tries the sandbox's envd first and starts envd (or waits for the one
// that is the sandbox's init) only when that is refused: a call to an
// envd that runs — every call but a sandbox's first, and its first after
// a restore — costs no probe before it.
func (l *Link) transport(ctx context.Context, cfg Config, resolve func(context.Context) (Sandbox, error)) (*transport, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tr != nil {
		return l.tr, nil
	}
	sb, err := resolve(ctx)
	if err != nil {
		return nil, err
	}
	dialer := dialer(cfg.Mark, 5*time.Second)
	target := sb.Target.String()
	tr := &transport{sb: sb}
	tr.Transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, "tcp", target)
			if err == nil || ctx.Err() != nil {
				return c, err
			}
			if sb.Init {
				err = await(ctx, cfg, sb.Target)
			} else {
				err = l.ensure(ctx, cfg, sb)
			}
			if err != nil {
				return nil, &startError{err}
			}
			return dialer.DialContext(ctx, "tcp", target)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	l.tr = tr
	return tr, nil
}

// dialer dials envd inside sandboxes: a short dial (the address is the
// sandbox's own, on its veth), with the mark the firewall lets into a
// sandbox (as the gateway's connections are).
func dialer(mark int, timeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: timeout}
	if mark != 0 {
		d.Control = gateway.MarkSocket(mark)
	}
	return d
}

// ensure starts envd in the sandbox unless it already answers. It
// answers after a snapshot's restore or a freeze's thaw (it is in the
// sandbox's memory); a cold start (after a detach) starts it again.
func (l *Link) ensure(ctx context.Context, cfg Config, sb Sandbox) error {
	l.start.Lock()
	defer l.start.Unlock()
	if answers(ctx, cfg.Mark, sb.Target) {
		return nil
	}
	if sb.Exec == nil {
		return errdefs.New(errdefs.ErrNotSupported, "this node's backend cannot run commands in a sandbox")
	}
	t0 := time.Now()
	var out []byte
	var err error
	// Right after a restore the envd the checkpoint held is being killed
	// (gVisor ends exec'd processes at a restore) and may still hold the
	// port for a moment: a few tries, each refused at once.
	for try := 0; try < 5; try++ {
		out, err = sb.Exec(ctx, []string{filepath.Join(layout.EnvdMount, layout.EnvdBinary), "--detach", "--addr", ":" + strconv.Itoa(api.EnvdPort)})
		if err == nil || !strings.Contains(string(out), "address already in use") {
			break
		}
		time.Sleep(time.Duration(20<<try) * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("start envd in sandbox %s: %w: %s", sb.ID, err, out)
	}
	cfg.Log.Info("envd started", "id", sb.ID, "ms", time.Since(t0).Milliseconds())
	return nil
}

// await waits for the envd that is the sandbox's init to answer: a
// sandbox just started or restored opens its listeners a moment after
// runsc returns (the gateway's dial retries for the same reason).
func await(ctx context.Context, cfg Config, target netip.AddrPort) error {
	wait := cfg.Ready
	if wait <= 0 {
		wait = 30 * time.Second
	}
	deadline := time.Now().Add(wait)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if answers(ctx, cfg.Mark, target) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errdefs.New(errdefs.ErrTimeout, "envd of the sandbox at %s did not answer within %v (its template runs envd as its init: sandstormd sandbox logs says why)", target, wait)
		}
		time.Sleep(pause)
	}
}

func answers(ctx context.Context, mark int, target netip.AddrPort) bool {
	c, err := dialer(mark, 500*time.Millisecond).DialContext(ctx, "tcp", target.String())
	if err != nil {
		return false
	}
	c.Close()
	return true
}
