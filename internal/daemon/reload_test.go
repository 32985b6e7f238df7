package daemon

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

// TestStreamsEndAtAReload: a response that has flushed (a stream) is ended
// by end(); one that has not (an ordinary request in flight) is left to
// finish; a stream that starts after end() is ended at its first flush.
func TestStreamsEndAtAReload(t *testing.T) {
	s := newStreamSet()
	streaming := make(chan struct{})
	finish := make(chan struct{})
	h := s.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/events":
			io.WriteString(w, "data: x\n\n")
			w.(http.Flusher).Flush()
			if r.URL.Query().Get("signal") != "" {
				close(streaming)
			}
			<-r.Context().Done()
		case "/slow":
			<-finish
			if r.Context().Err() != nil {
				http.Error(w, "cancelled", 500)
				return
			}
			io.WriteString(w, "done")
		}
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	events := make(chan error, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/events?signal=1")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		events <- err
	}()
	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-streaming
	// The slow request is in: wait until the set holds both.
	for deadline := time.Now().Add(10 * time.Second); ; {
		s.mu.Lock()
		n := len(s.live)
		s.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in the set, want 2", n)
		}
		time.Sleep(time.Millisecond)
	}
	if n := s.end(); n != 1 {
		t.Fatalf("end() ended %d streams, want 1", n)
	}
	if err := testenv.Within(t, events, 10*time.Second, "the stream was not ended"); err != nil {
		t.Fatalf("the stream ended with %v, want a clean end", err)
	}
	close(finish)
	if got := <-slow; got != "done" {
		t.Fatalf("the request in flight got %q, want it answered", got)
	}
	// A stream that begins now ends at its first flush.
	resp, err := http.Get(srv.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "data: x\n\n" {
		t.Fatalf("a stream started after end(): %q, %v", b, err)
	}
	resp.Body.Close()
}

// TestStreamWriterPassesHijack: the tunnel a node dials in on takes its
// connection over through the wrapper.
func TestStreamWriterPassesHijack(t *testing.T) {
	s := newStreamSet()
	srv := httptest.NewServer(s.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nhello")
		bw.Flush()
		c.Close()
	})))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("hijacked answer %v, %v", resp, err)
	}
	b, _ := io.ReadAll(br)
	if string(b) != "hello" {
		t.Fatalf("after the hijack: %q", b)
	}
}

// TestReloadRefusals: `sandstormd reload` says what is wrong without
// signalling anything when no daemon serves the data dir.
func TestReloadRefusals(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if _, _, err := Reload(ctx, dir); err == nil || !strings.Contains(err.Error(), "no sandstormd serves") {
		t.Fatalf("no pid file: %v", err)
	}
	// A PID that is not running: a child that has exited and been reaped.
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	os.WriteFile(filepath.Join(dir, "sandstormd.pid"), []byte(strconv.Itoa(p.Pid)+"\n"), 0o644)
	if _, _, err := Reload(ctx, dir); err == nil || !strings.Contains(err.Error(), "is not running") {
		t.Fatalf("dead pid: %v", err)
	}
	// A live process (this test) with no readiness file: it is not
	// signalled (SIGHUP would end a process that does not handle it).
	os.WriteFile(filepath.Join(dir, "sandstormd.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
	if _, _, err := Reload(ctx, dir); err == nil || !strings.Contains(err.Error(), "predates reloads") {
		t.Fatalf("no readiness file: %v", err)
	}
}

// TestDrainAnswersARequestThatComesLate: a connection accepted before a
// reload whose request arrives after the drain began is answered (with
// Connection: close), not dropped as http.Server.Shutdown alone drops it.
func TestDrainAnswersARequestThatComesLate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := drainable(&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "answer") })})
	go srv.Serve(ln)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The server has the connection (StateNew) before the drain begins.
	tr, _ := conns.Load(srv)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		tr.(*connTracker).mu.Lock()
		n := len(tr.(*connTracker).fresh)
		tr.(*connTracker).mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never saw the connection")
		}
	}
	ln.Close() // as the pause does
	drained := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drainServer(ctx, srv)
		close(drained)
	}()
	time.Sleep(50 * time.Millisecond) // the request comes late: after the drain began
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the late request got no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "answer" || !resp.Close {
		t.Fatalf("late answer %q, Connection: close %v", b, resp.Close)
	}
	<-drained
}

// lateListener hands Serve a connection it accepted only after its Close
// has been called: a connection accepted just before the pause closed the
// listener, which Serve has not yet told ConnState of.
type lateListener struct {
	net.Listener
	closed chan struct{}
	once   sync.Once
}

func (l *lateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	<-l.closed // held until the pause: Serve cannot track it before
	return c, nil
}

func (l *lateListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// TestDrainWaitsForServeToTrackItsLastConnection: a connection Serve
// accepted as the pause closed its listener, not yet tracked when the
// drain begins, still has its request answered (serveDrainable; without
// it the drain saw no connection, Shutdown began, and the request read
// after was dropped unanswered: curl's empty reply).
func TestDrainWaitsForServeToTrackItsLastConnection(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &lateListener{Listener: raw, closed: make(chan struct{})}
	srv := drainable(&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "answer") })})
	served := make(chan struct{})
	go func() { serveDrainable(srv, ln); close(served) }()
	c, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The request is on its way before the pause; the server has not
	// seen the connection yet (lateListener holds it in Accept).
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	tr, _ := conns.Load(srv)
	testenv.WaitFor(t, 10*time.Second, "Serve running", func() bool { return tr.(*connTracker).serving.Load() == 1 })
	ln.Close() // as the pause does: Accept hands the connection over now
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drainServer(ctx, srv)
	<-served
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the connection accepted as the listener closed got no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "answer" {
		t.Fatalf("answer %q", b)
	}
}
