package envdlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sandstorm/internal/errdefs"

	"sandstorm/internal/testenv"
)

// freeAddr is a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return addr
}

// fakeEnvd serves h at addr, as an envd started in the sandbox would.
func fakeEnvd(t *testing.T, addr netip.AddrPort, h http.Handler) {
	t.Helper()
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

var testCfg = Config{Ready: 2 * time.Second, Log: slog.New(slog.DiscardHandler)}

// TestLinkStartsEnvdOnce: the first call finds nothing listening, starts
// envd (Exec, once, with envd's detach command line) and is answered by
// it; the next call reuses the kept connection without starting again.
func TestLinkStartsEnvdOnce(t *testing.T) {
	addr := freeAddr(t)
	var execs atomic.Int32
	sb := Sandbox{ID: "s1", Target: addr, Exec: func(ctx context.Context, args []string) ([]byte, error) {
		execs.Add(1)
		if !strings.HasSuffix(args[0], "/sandstorm-envd") || args[1] != "--detach" {
			t.Errorf("envd started as %q", args)
		}
		fakeEnvd(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "envd at "+r.URL.Path)
		}))
		return nil, nil
	}}
	var l Link
	for i := 0; i < 2; i++ {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/anything", nil)
		if err := l.Serve(testCfg, rec, req, "/health", func(context.Context) (Sandbox, error) { return sb, nil }); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got := rec.Body.String(); got != "envd at /health" {
			t.Fatalf("call %d answered %q", i, got)
		}
	}
	if n := execs.Load(); n != 1 {
		t.Errorf("envd started %d times, want once", n)
	}
}

// TestLinkInitThatNeverAnswers: an envd that is the sandbox's init is
// waited for, never started, and one that does not answer in time is a
// timeout (the API's 504), not a generic failure.
func TestLinkInitThatNeverAnswers(t *testing.T) {
	sb := Sandbox{ID: "s1", Target: freeAddr(t), Init: true, Exec: func(context.Context, []string) ([]byte, error) {
		t.Error("an init envd was started by exec")
		return nil, nil
	}}
	var l Link
	cfg := testCfg
	cfg.Ready = 100 * time.Millisecond
	err := l.Serve(cfg, httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil), "/health",
		func(context.Context) (Sandbox, error) { return sb, nil })
	if !errors.Is(err, errdefs.ErrTimeout) {
		t.Errorf("got %v, want a timeout", err)
	}
}

// TestLinkCutEndsCalls: a call in flight keeps the link busy, and a Cut
// (before a snapshot, detach or delete) ends it and the link is idle.
func TestLinkCutEndsCalls(t *testing.T) {
	addr := freeAddr(t)
	fakeEnvd(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // a stream that never ends by itself
	}))
	sb := Sandbox{ID: "s1", Target: addr}
	var l Link
	done := make(chan error, 1)
	answered := &answerSeen{ResponseRecorder: httptest.NewRecorder(), seen: make(chan struct{})}
	go func() {
		release := l.Hold()
		defer release()
		done <- l.Serve(testCfg, answered, httptest.NewRequest(http.MethodGet, "/", nil), "/stream",
			func(context.Context) (Sandbox, error) { return sb, nil })
	}()
	<-answered.seen
	if !l.Busy() {
		t.Error("a call in flight does not keep the link busy")
	}
	l.Cut(errdefs.New(errdefs.ErrUnavailable, "sandbox s1 was moved"))
	if err := testenv.Within(t, done, 10*time.Second, "Cut did not end the call"); err != nil {
		t.Errorf("a cut call returned %v (nothing to report: the answer had started)", err)
	}
	if l.Busy() {
		t.Error("the link is still busy after its only call ended")
	}
}

// answerSeen is a recorder that says when the answer's status was sent.
type answerSeen struct {
	*httptest.ResponseRecorder
	seen chan struct{}
}

func (a *answerSeen) WriteHeader(code int) {
	a.ResponseRecorder.WriteHeader(code)
	close(a.seen)
}

// dialStarting waits for a port that refuses at first (a program still
// starting after a cold wake) and connects once it listens; a port that
// never listens fails once ready is over.
func TestDialStarting(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	var attempts atomic.Int32
	secondTry := make(chan struct{})
	d := &net.Dialer{Control: func(_, _ string, _ syscall.RawConn) error {
		if attempts.Add(1) == 2 {
			close(secondTry) // the first was refused
		}
		return nil
	}}
	got := make(chan error, 1)
	go func() {
		c, err := dialStarting(context.Background(), d, addr, 30*time.Second)
		if err == nil {
			c.Close()
		}
		got <- err
	}()
	<-secondTry
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := <-got; err != nil {
		t.Errorf("a port that came to listen: %v", err)
	}
	closed := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	if _, err := dialStarting(context.Background(), &net.Dialer{}, closed, 50*time.Millisecond); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a port that never listens: %v, want connection refused", err)
	}
}
