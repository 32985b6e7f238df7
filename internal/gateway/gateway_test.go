package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/testenv"
)

// fakeWaker stands in for the node: a sandbox that is hot or not, woken
// on demand. wakeErr, when set, refuses every wake.
type fakeWaker struct {
	mu      sync.Mutex
	hot     bool
	wakes   int
	wakeErr error
	touches atomic.Int64
}

func (w *fakeWaker) Wake(ctx context.Context, id string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wakeErr != nil {
		return w.wakeErr
	}
	if !w.hot {
		w.wakes++
		w.hot = true
	}
	return nil
}

func (w *fakeWaker) IsHot(string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hot
}

func (w *fakeWaker) Touch(string)       { w.touches.Add(1) }
func (w *fakeWaker) Unreachable(string) {}

func (w *fakeWaker) setHot(hot bool) {
	w.mu.Lock()
	w.hot = hot
	w.mu.Unlock()
}

func (w *fakeWaker) wakeCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wakes
}

// upstream is a real HTTP server on loopback standing in for the sandbox,
// counting the connections it was given.
type upstream struct {
	addr  netip.AddrPort
	conns atomic.Int64
	open  atomic.Int64
	srv   *http.Server
}

func newUpstream(t *testing.T, h http.Handler, idle time.Duration) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: netip.MustParseAddrPort(ln.Addr().String())}
	u.srv = &http.Server{Handler: h, IdleTimeout: idle, ConnState: func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.conns.Add(1)
			u.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.open.Add(-1)
		}
	}}
	go u.srv.Serve(ln)
	t.Cleanup(func() { u.srv.Close() })
	return u
}

// newGateway listens for sandbox "sb" on a free loopback port forwarding to
// target, and returns the gateway and its address.
func newGateway(t *testing.T, w Waker, target netip.AddrPort, cfg Config) (*Gateway, string) {
	t.Helper()
	g := New(cfg, w, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := g.Listen("sb", netip.MustParseAddr("127.0.0.1"), target.Addr(), map[int]int{int(target.Port()): 0}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.CloseAll)
	g.mu.Lock()
	addr := g.sands["sb"].listeners[0].Addr().String()
	g.mu.Unlock()
	return g, addr
}

func counter() (http.Handler, *atomic.Int64) {
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "count=%d\n", n.Add(1))
	}), &n
}

func get(t *testing.T, c *http.Client, url string) (string, bool) {
	t.Helper()
	reused := false
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	})
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	return string(b), reused
}

// TestDrainKeepsHTTPClients: a drain between requests closes only the
// sandbox's side; the client's next request on the same connection wakes
// the sandbox and is answered over a new connection into it.
func TestDrainKeepsHTTPClients(t *testing.T) {
	h, _ := counter()
	up := newUpstream(t, h, 0)
	w := &fakeWaker{hot: true}
	g, addr := newGateway(t, w, up.addr, Config{})
	c := &http.Client{}
	if body, _ := get(t, c, "http://"+addr+"/"); body != "count=1\n" {
		t.Fatalf("first answer %q", body)
	}
	release := g.Drain("sb")
	testenv.WaitFor(t, 10*time.Second, "the sandbox's side is closed", func() bool { return up.open.Load() == 0 })
	w.setHot(false) // as a snapshot would leave it
	release()
	body, reused := get(t, c, "http://"+addr+"/")
	if body != "count=2\n" || !reused {
		t.Errorf("after the drain: %q, client connection reused %v; want count=2 on the same connection", body, reused)
	}
	if n := up.conns.Load(); n != 2 {
		t.Errorf("the sandbox saw %d connections, want 2 (one per side of the drain)", n)
	}
	if n := w.wakeCount(); n != 1 {
		t.Errorf("%d wakes, want 1 (the request after the drain)", n)
	}
	// The answer is out before the pair is marked idle.
	testenv.WaitFor(t, 10*time.Second, "an idle HTTP client does not count as active", func() bool { return g.Active("sb") == 0 })
}

// TestDrainWaitsForTheAnswer: a drain that finds a request in flight waits
// for its answer before it closes anything, and the client gets all of it.
func TestDrainWaitsForTheAnswer(t *testing.T) {
	entered, finish := make(chan struct{}), make(chan struct{})
	var served atomic.Bool // the handler has written the whole answer
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-finish
		io.WriteString(w, strings.Repeat("x", 100000))
		served.Store(true)
	}), 0)
	w := &fakeWaker{hot: true}
	g, addr := newGateway(t, w, up.addr, Config{})
	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/slow")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- fmt.Sprintf("%d %d", resp.StatusCode, len(b))
	}()
	<-entered
	if n := g.Active("sb"); n != 1 {
		t.Errorf("Active = %d with a request in flight, want 1", n)
	}
	drained := make(chan struct{})
	go func() {
		release := g.Drain("sb")
		// Drain that did not wait would get here before finish is
		// closed below, with nothing served.
		if !served.Load() {
			t.Error("Drain returned before the request in flight was answered")
		}
		release()
		close(drained)
	}()
	// The answer is let go only once the drain has begun (the gate is
	// blocked).
	g.mu.Lock()
	sg := g.sands["sb"]
	g.mu.Unlock()
	testenv.WaitFor(t, 10*time.Second, "the drain has begun", func() bool {
		sg.mu.Lock()
		defer sg.mu.Unlock()
		return sg.blocked
	})
	close(finish)
	if r := <-got; r != "200 100000" {
		t.Errorf("the request in flight got %q, want 200 and 100000 bytes", r)
	}
	<-drained
}

// TestDrainWaitIsBounded: a request that is never answered does not hold
// a drain past DrainWait; it is reset.
func TestDrainWaitIsBounded(t *testing.T) {
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	entered := make(chan struct{}, 1)
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-stuck
	}), 0)
	g, addr := newGateway(t, &fakeWaker{hot: true}, up.addr, Config{DrainWait: 100 * time.Millisecond})
	// A bare connection: net/http's client would retry the GET by itself.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	start := time.Now()
	g.Drain("sb")()
	if took := time.Since(start); took < 100*time.Millisecond || took > 2*time.Second {
		t.Errorf("Drain took %v with DrainWait 100ms", took)
	}
	// Cut: a reset, or a 502 if the gateway saw its side go first.
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil && resp.StatusCode != http.StatusBadGateway {
		t.Errorf("the request still unanswered after DrainWait was not cut: %s", resp.Status)
	}
}

// TestNoRequestLostAcrossDrains: six clients call in a loop, some reusing
// connections and some not, while the sandbox is drained, put to "disk"
// and woken twenty times. Every request is answered.
func TestNoRequestLostAcrossDrains(t *testing.T) {
	h, n := counter()
	up := newUpstream(t, h, 0)
	w := &fakeWaker{hot: true}
	g, addr := newGateway(t, w, up.addr, Config{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: i%2 == 1}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Get("http://" + addr + "/")
				calls.Add(1)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = errors.New(resp.Status)
					}
				}
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	for cycle := 0; cycle < 20; cycle++ {
		before := calls.Load()
		testenv.WaitFor(t, 10*time.Second, "calls go on", func() bool { return calls.Load() >= before+20 })
		release := g.Drain("sb")
		w.setHot(false)
		time.Sleep(5 * time.Millisecond) // the checkpoint's length: requests must wait it out
		release()
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls, %d failures, %d answered by the sandbox, %d wakes, %d connections into it", calls.Load(), failures.Load(), n.Load(), w.wakeCount(), up.conns.Load())
	if f := failures.Load(); f > 0 {
		t.Errorf("%d of %d calls failed; first: %v", f, calls.Load(), firstErr.Load())
	}
	if w.wakeCount() < 20 {
		t.Errorf("%d wakes for 20 drains", w.wakeCount())
	}
}

// TestIdleConnectionClosedByServer: a server that closes an idle
// keep-alive connection (Node.js does after 5 s) costs the client nothing:
// its next request goes over a new connection into the sandbox.
func TestIdleConnectionClosedByServer(t *testing.T) {
	h, _ := counter()
	up := newUpstream(t, h, 20*time.Millisecond)
	_, addr := newGateway(t, &fakeWaker{hot: true}, up.addr, Config{})
	c := &http.Client{}
	get(t, c, "http://"+addr+"/")
	testenv.WaitFor(t, 10*time.Second, "the server closes the idle connection", func() bool { return up.open.Load() == 0 })
	if body, reused := get(t, c, "http://"+addr+"/"); body != "count=2\n" || !reused {
		t.Errorf("after the server closed: %q reused %v", body, reused)
	}
}

// TestServerSpeaksFirst: a protocol where the server greets first (SMTP,
// SSH, MySQL) is forwarded byte for byte, and a drain resets it.
func TestServerSpeaksFirst(t *testing.T) {
	g, addr := newGateway(t, &fakeWaker{hot: true}, echoUpstream(t), Config{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := br.ReadString('\n'); err != nil || line != "220 hello\r\n" {
		t.Fatalf("greeting %q, %v", line, err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\n") // HTTP-looking bytes after a greeting stay bytes
	if line, err := br.ReadString('\n'); err != nil || line != "GET / HTTP/1.1\r\n" {
		t.Fatalf("echo %q, %v", line, err)
	}
	if n := g.Active("sb"); n != 1 {
		t.Errorf("Active = %d with a raw connection, want 1", n)
	}
	g.Drain("sb")()
	if _, err := br.ReadString('\n'); err == nil {
		t.Error("a raw connection survived the drain")
	}
}

// TestUpgrade: a 101 Switching Protocols turns the connection into bytes.
func TestUpgrade(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "no upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	}), 0)
	_, addr := newGateway(t, &fakeWaker{hot: true}, up.addr, Config{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Errorf("after the upgrade: %q %v", line, err)
	}
}

// TestRefusedWake: a wake the node turns away is a 503 with Retry-After.
func TestRefusedWake(t *testing.T) {
	h, _ := counter()
	up := newUpstream(t, h, 0)
	w := &fakeWaker{wakeErr: fmt.Errorf("%w: short of memory", errdefs.Refine(errdefs.ErrNoRoom, "wake refused"))}
	_, addr := newGateway(t, w, up.addr, Config{RetryAfter: 3})
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "3" || !strings.Contains(string(b), "short of memory") {
		t.Errorf("refused wake: %s Retry-After %q %s", resp.Status, resp.Header.Get("Retry-After"), b)
	}
}

// TestHeaderTooLarge: an endless header block is cut at 1 MiB with 431,
// not buffered.
func TestHeaderTooLarge(t *testing.T) {
	h, _ := counter()
	up := newUpstream(t, h, 0)
	_, addr := newGateway(t, &fakeWaker{hot: true}, up.addr, Config{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
		line := "X-Junk: " + strings.Repeat("a", 1000) + "\r\n"
		for i := 0; i < 2000; i++ {
			if _, err := io.WriteString(c, line); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("2 MB of header: %v %v, want 431", resp, err)
	}
}

// TestBodyTouches: a request body and an answer body keep the sandbox
// marked active while they flow.
func TestBodyTouches(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d", n)
	}), 0)
	w := &fakeWaker{hot: true}
	_, addr := newGateway(t, w, up.addr, Config{})
	resp, err := http.Post("http://"+addr+"/", "application/octet-stream", strings.NewReader(strings.Repeat("y", 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "1048576" {
		t.Errorf("upload answered %q", b)
	}
	if n := w.touches.Load(); n < 4 {
		t.Errorf("%d touches for a 1 MiB upload", n)
	}
}

// TestStats: the gateway's count of open connections and of those in
// flight (the node's sandstorm_gateway_connections and
// sandstorm_gateway_requests_in_flight) follow a connection through its
// life: silent (in flight: waiting for its first bytes), a request being
// answered (in flight), idle between requests (open, not in flight), and
// closed (neither).
func TestStats(t *testing.T) {
	entered, finish := make(chan struct{}, 1), make(chan struct{})
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-finish
		}
		io.WriteString(w, "ok")
	}), 0)
	g, addr := newGateway(t, &fakeWaker{hot: true}, up.addr, Config{})
	stats := func(conns, inFlight int) func() bool {
		return func() bool { c, f := g.Stats(); return c == conns && f == inFlight }
	}
	if c, f := g.Stats(); c != 0 || f != 0 {
		t.Fatalf("Stats with nothing open = %d, %d", c, f)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testenv.WaitFor(t, 10*time.Second, "a silent connection: open and in flight", stats(1, 1))
	if g.Busy("sb") {
		t.Error("a silent connection makes its sandbox Busy (it would keep it hot for as long as it stays open)")
	}
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: sb\r\n\r\n")
	<-entered
	if cn, f := g.Stats(); cn != 1 || f != 1 {
		t.Errorf("with a request being answered Stats = %d, %d; want 1, 1", cn, f)
	}
	if !g.Busy("sb") {
		t.Error("a sandbox answering a request is not Busy")
	}
	close(finish)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	testenv.WaitFor(t, 10*time.Second, "idle between requests: open, not in flight", stats(1, 0))
	if g.Busy("sb") {
		t.Error("a sandbox with an idle kept connection is Busy")
	}
	c.Close()
	testenv.WaitFor(t, 10*time.Second, "closed: neither", stats(0, 0))
}

// TestDialInterval: the schedule of dials into a starting sandbox is fine
// at first (a fast starter is not held back by a long poll), grows with
// the wait (a slow one is not slowed by hundreds of refused connects), and
// is bounded both ways.
func TestDialInterval(t *testing.T) {
	prev := time.Duration(0)
	for ms := 0; ms <= 30000; ms++ {
		el := time.Duration(ms) * time.Millisecond
		i := DialInterval(el)
		if i < dialMin || i > dialMax {
			t.Fatalf("DialInterval(%v) = %v, outside [%v, %v]", el, i, dialMin, dialMax)
		}
		if i < prev {
			t.Fatalf("DialInterval(%v) = %v, shorter than at the millisecond before (%v)", el, i, prev)
		}
		prev = i
		// Never much later than the wait so far: a program that listens
		// after t is answered within half of t from 10 ms, a fifth from
		// 40 ms.
		if el >= 10*time.Millisecond && i > el/2 || el >= 40*time.Millisecond && i > el/5 {
			t.Fatalf("DialInterval(%v) = %v, too long for that wait", el, i)
		}
	}
	// How many refused connects a start that listens after t costs.
	attempts := func(t time.Duration) int {
		n := 0
		for el := time.Duration(0); el < t; el += DialInterval(el) {
			n++
		}
		return n
	}
	for _, c := range []struct {
		t   time.Duration
		max int
	}{{100 * time.Millisecond, 20}, {300 * time.Millisecond, 35}, {700 * time.Millisecond, 50}, {5 * time.Second, 160}} {
		// A 2 ms retry made t/2 ms of them: 50, 150, 350, 2,500.
		if n := attempts(c.t); n > c.max {
			t.Errorf("a start of %v costs %d dials, want at most %d", c.t, n, c.max)
		}
	}
}

// TestDialWaitsForTheSandbox: a sandbox whose port listens only some time
// after it is woken (a cold start) gets the request that woke it, after
// dials spaced as DialInterval says (each one touches its idle timer).
//
// The count is checked without a clock's help: every touch counted
// happened before the moment its count was read, and the gateway's dial
// loop starts after the client's start, so k touches mean the loop slept
// k-1 times in that window, each at least DialInterval of the time spent
// so far: k is at most the number of the schedule's points in the
// window, however slow the machine. (Counting touches up to the answer
// also counted the forwarding's own touches, and failed on a busy CI;
// counting open's touch as a dial failed there too, with 5 touches in
// 6.3 ms where the schedule has 4 dials.)
func TestDialWaitsForTheSandbox(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close() // refused until the "program" below listens
	w := &fakeWaker{}
	_, addr := newGateway(t, w, target, Config{})
	listening := make(chan struct{})
	var dials int64
	var window time.Duration
	start := time.Now()
	go func() {
		// Listen once the gateway has dialled a few times.
		for w.touches.Load() < 5 {
			time.Sleep(time.Millisecond)
		}
		// One touch is open's, made before the dial loop starts.
		dials = w.touches.Load() - 1
		window = time.Since(start)
		ln, err := net.Listen("tcp", target.String())
		if err != nil {
			t.Errorf("listen on %s: %v", target, err)
			close(listening)
			return
		}
		h, _ := counter()
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		close(listening)
	}()
	body, _ := get(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, "http://"+addr+"/")
	<-listening
	if body != "count=1\n" {
		t.Fatalf("body %q, want count=1", body)
	}
	// A schedule that did not grow would have dialled window/dialMin
	// times.
	want := int64(0)
	for el := time.Duration(0); el <= window; el += DialInterval(el) {
		want++
	}
	if dials > want {
		t.Errorf("%d dials in the first %v, want at most %d (DialInterval's schedule)", dials, window, want)
	}
}
