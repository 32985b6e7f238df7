package testenv

// The few helpers that the tests of many packages need alike: a buffer a
// process writes while the test reads it, a free loopback port, and a poll
// for a condition nothing signals.

import (
	"bytes"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer that a command's or a server's output
// goroutines write while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
// Another process may take it before the caller binds it; the tests that
// use it start one listener right after.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// FreeAddr is FreePort as host:port.
func FreeAddr(t testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// WaitFor polls cond until it holds, failing the test after limit. The
// limit bounds a hang; it is not a timing assertion. Polls start at 1 ms
// (a state another goroutine reaches at once is seen at once) and grow to
// 20 ms, so a long wait does not spin.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// Serve accepts on ln until the test ends, when ln is closed, and runs
// handle on each connection in its own goroutine, closing the connection
// after it.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// Within returns what ch gives within limit; if nothing comes by then,
// the test fails at once, saying what (what did not happen). The limit
// bounds a hang; it is not a timing assertion.
func Within[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatal(what)
		var none T
		return none
	}
}
