package warm

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// TestConnectProbeLeavesWithAnEnd: a probe by connection alone (no path)
// ends it so that the server reads an end of stream, not a reset (which
// Python's http.server logs as a ConnectionResetError traceback, in every
// clone's log when a clone's readiness was this probe), and the server's
// side is closed by the time the probe returns. A server that does not
// close is reset after a short wait, as before.
func TestConnectProbeLeavesWithAnEnd(t *testing.T) {
	for _, closes := range []bool{true, false} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		seen := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				seen <- err
				return
			}
			if !closes {
				// Reads the end, then keeps its side open: the probe
				// resets it.
				io.Copy(io.Discard, c)
				c.SetWriteDeadline(time.Now().Add(10 * time.Second))
				for err == nil {
					_, err = c.Write(make([]byte, 4096))
				}
				seen <- err
				c.Close()
				return
			}
			_, err = c.Read(make([]byte, 1))
			seen <- err
			c.Close()
		}()
		target := netip.MustParseAddrPort(ln.Addr().String())
		if err := ProbeOnce(context.Background(), &net.Dialer{Timeout: time.Second}, target, ""); err != nil {
			t.Fatalf("probe: %v", err)
		}
		err = <-seen
		switch {
		case closes && !errors.Is(err, io.EOF):
			t.Errorf("the server read %v, want EOF (a reset is what a server logs)", err)
		case !closes && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE):
			t.Errorf("a server that keeps its side open: %v, want a reset once the probe gave up waiting", err)
		}
		ln.Close()
	}
}
