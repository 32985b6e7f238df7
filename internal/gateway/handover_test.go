package gateway

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

// echoUpstream is a server that speaks first and echoes: a raw protocol.
func echoUpstream(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Serve(t, ln, func(c net.Conn) {
		io.WriteString(c, "220 hello\r\n")
		io.Copy(c, c)
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// ended reports whether the peer closed c (EOF or a reset), waiting at most
// 10 s for it.
func ended(c net.Conn, br *bufio.Reader) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := br.ReadByte()
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestHandover: the request in flight is answered in full with
// "Connection: close" and its connection closed after; an HTTP connection
// idle between requests is closed at once; a raw one is reset; Handover
// returns once the answer is out, and says so.
func TestHandover(t *testing.T) {
	entered, finish := make(chan struct{}), make(chan struct{})
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-finish
		}
		io.WriteString(w, "answer "+r.URL.Path)
	}), 0)
	g := New(Config{}, &fakeWaker{hot: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(g.CloseAll)
	raw := echoUpstream(t)
	lo := netip.MustParseAddr("127.0.0.1")
	if err := g.Listen("web", lo, up.addr.Addr(), map[int]int{int(up.addr.Port()): 0}); err != nil {
		t.Fatal(err)
	}
	if err := g.Listen("raw", lo, raw.Addr(), map[int]int{int(raw.Port()): 0}); err != nil {
		t.Fatal(err)
	}
	addrOf := func(id string) string {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.sands[id].listeners[0].Addr().String()
	}
	dial := func(id string) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addrOf(id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	// An idle keep-alive client: one answered request, then nothing.
	idle, idleR := dial("web")
	io.WriteString(idle, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(idleR, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatal("an answer before the handover said Connection: close")
	}
	// A raw connection.
	rawC, rawR := dial("raw")
	rawC.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := rawR.ReadString('\n'); err != nil || line != "220 hello\r\n" {
		t.Fatalf("raw greeting %q, %v", line, err)
	}
	// A request in flight.
	slow, slowR := dial("web")
	io.WriteString(slow, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	testenv.WaitFor(t, 10*time.Second, "the idle client counted idle", func() bool { return g.Active("web") == 1 })

	done := make(chan HandoverResult, 1)
	go func() { done <- g.Handover(30 * time.Second) }()
	if !ended(idle, idleR) {
		t.Error("the idle keep-alive connection was not closed by the handover")
	}
	if !ended(rawC, rawR) {
		t.Error("the raw connection was not cut by the handover")
	}
	select {
	case r := <-done:
		t.Fatalf("Handover returned %+v with a request still in flight", r)
	default:
	}
	close(finish)
	resp, err = http.ReadResponse(slowR, nil)
	if err != nil {
		t.Fatalf("the request in flight got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "answer /slow" || !resp.Close {
		t.Fatalf("in-flight answer %q, Connection: close %v; want it whole, with Connection: close", body, resp.Close)
	}
	if !ended(slow, slowR) {
		t.Error("the connection stayed open after its last answer")
	}
	r := <-done
	if r.Answered != 1 || r.Idle != 1 || r.Cut != 1 {
		t.Fatalf("Handover = %+v, want 1 answered, 1 idle, 1 cut", r)
	}
}

// TestHandoverWaitIsBounded: a request still unanswered when the wait
// runs out is cut, and Handover returns.
func TestHandoverWaitIsBounded(t *testing.T) {
	entered, finish := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(finish) })
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-finish
	}), 0)
	g, addr := newGateway(t, &fakeWaker{hot: true}, up.addr, Config{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	r := g.Handover(200 * time.Millisecond)
	if r.Answered != 1 || r.Cut != 1 {
		t.Fatalf("Handover = %+v, want the one request counted answered-to-be and then cut", r)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if isTimeout(err) || strings.Contains(string(b), "HTTP/1.1 200") {
		t.Fatalf("after the bounded handover the client read %q, %v; want the connection ended unanswered", b, err)
	}
}

// TestListenHook: every gateway listener is opened through Config.Listen
// when it is set (how a reload hands them to the next process).
func TestListenHook(t *testing.T) {
	var asked []string
	hook := func(network, address string, open func() (net.Listener, error)) (net.Listener, error) {
		asked = append(asked, network+" "+address)
		return open()
	}
	g := New(Config{Listen: hook}, &fakeWaker{hot: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(g.CloseAll)
	port := testenv.FreePort(t)
	if err := g.Listen("sb", netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.1"), map[int]int{8000: port}); err != nil {
		t.Fatal(err)
	}
	if want := "tcp 127.0.0.1:" + strconv.Itoa(port); len(asked) != 1 || asked[0] != want {
		t.Fatalf("hook asked for %q, want [%q]", asked, want)
	}
}
