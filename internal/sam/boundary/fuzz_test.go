package boundary

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandstorm/internal/sam/policy"
)

// fuzzConn is a connection whose peer sent data and reads nothing back.
type fuzzConn struct {
	r *bytes.Reader
	w bytes.Buffer
}

func (c *fuzzConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *fuzzConn) Write(p []byte) (int, error)      { return c.w.Write(p) }
func (c *fuzzConn) Close() error                     { return nil }
func (c *fuzzConn) LocalAddr() net.Addr              { return &net.UnixAddr{Name: "boundary", Net: "unix"} }
func (c *fuzzConn) RemoteAddr() net.Addr             { return &net.UnixAddr{Name: "agent", Net: "unix"} }
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzSOCKS5Handshake feeds arbitrary bytes to a boundary's flow handler
// (SOCKS5, or HTTP when the first byte is not 0x05): it must not panic, and
// nothing but the policy's one allowed name and one allowed IP may ever be
// resolved or dialled.
func FuzzSOCKS5Handshake(f *testing.F) {
	conn := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	domain := func(h string, port uint16) []byte {
		return append(append([]byte{3, byte(len(h))}, h...), byte(port>>8), byte(port))
	}
	for _, seed := range [][]byte{
		conn([]byte{5, 1, 0, 5, 1, 0}, domain("allowed.test", 443)),
		conn([]byte{5, 1, 0, 5, 1, 0}, domain("denied.test", 443)),
		conn([]byte{5, 1, 0, 5, 1, 0}, domain("localhost", 80)),
		conn([]byte{5, 1, 0, 5, 1, 0}, domain("mesh.sam.alt", 80)),
		conn([]byte{5, 1, 0, 5, 1, 0}, domain("absent.mcp.sam.alt", 80)),
		conn([]byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 22}),
		conn([]byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 2, 0, 80}),
		conn([]byte{5, 1, 0, 5, 1, 0, 4}, make([]byte, 15), []byte{1, 0, 80}),
		conn([]byte{5, 1, 0, 5, 2, 0}, domain("allowed.test", 1)),
		conn([]byte{5, 1, 0, 5, 1, 0, 9, 1, 2, 3}),
		conn([]byte{5, 2, 0, 2, 1, 1, 'u', 1, 'p', 5, 1, 0}, domain("allowed.test", 80)),
		conn([]byte{5, 0}),
		conn([]byte{5, 255}, bytes.Repeat([]byte{0}, 255)),
		conn([]byte{5, 1, 0, 5, 1, 0, 3, 255}, bytes.Repeat([]byte{'a'}, 257)),
		[]byte{5},
		{},
		[]byte("CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
		[]byte("CONNECT denied.test:443 HTTP/1.1\r\n\r\n"),
		[]byte("GET http://mesh.sam.alt/v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\n\r\n"),
		[]byte("GET / HTTP/1.1\r\n\r\n"),
	} {
		f.Add(seed)
	}

	var mu sync.Mutex
	var touched []string
	pol, err := policy.Parse([]byte(`{"roles":[{"name":"r","services":["mcp://present"],"egress":["allowed.test","198.51.100.2"]}],"bindings":[{"principal":"p","roles":["r"]}]}`))
	if err != nil {
		f.Fatal(err)
	}
	b, err := New(Config{
		Principal: "p",
		Policy:    func() *policy.Policy { return pol },
		Users:     nil,
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			mu.Lock()
			touched = append(touched, "resolve "+host)
			mu.Unlock()
			return []netip.Addr{netip.MustParseAddr("198.51.100.1")}, nil
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			touched = append(touched, "dial "+addr)
			mu.Unlock()
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		},
		Guard: testGuard(nil),
		Mesh: func(ctx context.Context) (net.Conn, error) {
			mu.Lock()
			touched = append(touched, "mesh")
			mu.Unlock()
			return nil, io.ErrUnexpectedEOF
		},
		Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mu.Lock()
		touched = touched[:0]
		mu.Unlock()

		// The parser alone: bounded, and what it accepts is sane.
		req, _, err := socksHandshake(bytes.NewReader(data), io.Discard, nil)
		if err == nil && len(req.host) > 255 {
			t.Fatalf("host of %d bytes", len(req.host))
		}

		// The whole flow handler.
		c := &fuzzConn{r: bytes.NewReader(data)}
		b.serveProxy(c)

		mu.Lock()
		defer mu.Unlock()
		for _, what := range touched {
			switch {
			case what == "resolve allowed.test", what == "mesh":
			case len(what) > 5 && what[:5] == "dial ":
				ap, err := netip.ParseAddrPort(what[5:])
				if err != nil || (ap.Addr() != netip.MustParseAddr("198.51.100.1") && ap.Addr() != netip.MustParseAddr("198.51.100.2")) {
					t.Fatalf("dialled %s for input %q", what, data)
				}
			default:
				t.Fatalf("%s for input %q", what, data)
			}
		}
	})
}
