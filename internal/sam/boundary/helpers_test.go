package boundary

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/proxy"

	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sam/policy"
)

const testPolicy = `
roles:
  - name: agent
    services: ["inference://*", "mcp://present"]
    egress: ["allowed.test", "example.com", "refused.test", "nxdomain.test", "198.51.100.2", "*.wild.test"]
  - name: plain
    services: ["inference://small"]
bindings:
  - principal: agent-a
    roles: [agent]
  - principal: agent-b
    roles: [plain]
`

func mustPolicy(t testing.TB, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeMesh is a real HTTP server on a Unix socket standing in for the
// sam-node's agent listener. It echoes what it received as JSON, and
// streams /v1/chat/completions as server-sent events, one event per value
// sent on release.
type fakeMesh struct {
	sock    string
	srv     *http.Server
	dials   atomic.Int64
	release chan struct{}
}

type echo struct {
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Query  string      `json:"query"`
	Host   string      `json:"host"`
	Header http.Header `json:"header"`
	Body   string      `json:"body"`
}

func newFakeMesh(t testing.TB) *fakeMesh {
	t.Helper()
	m := &fakeMesh{sock: filepath.Join(t.TempDir(), "node.sock"), release: make(chan struct{})}
	ln, err := net.Listen("unix", m.sock)
	if err != nil {
		t.Fatal(err)
	}
	m.srv = &http.Server{Handler: http.HandlerFunc(m.serve)}
	go m.srv.Serve(ln)
	t.Cleanup(func() { m.srv.Close() })
	return m
}

func (m *fakeMesh) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/v1/chat/completions" && r.URL.Query().Get("stream") == "1" {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Echo-Principal", r.Header.Get(HeaderPrincipal))
		fl := w.(http.Flusher)
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			fl.Flush()
			select {
			case <-m.release:
			case <-r.Context().Done():
				return
			case <-time.After(30 * time.Second):
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(echo{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host, Header: r.Header, Body: string(body)})
}

func (m *fakeMesh) dial(ctx context.Context) (net.Conn, error) {
	m.dials.Add(1)
	var d net.Dialer
	return d.DialContext(ctx, "unix", m.sock)
}

// recorder records every resolution and dial a boundary makes, so a test
// can prove a denied destination was never touched. It is also the tests'
// stand-in for the world outside the node: names resolve to documentation
// addresses (198.51.100.0/24, RFC 5737), which the guard lets through like
// any public address, and a dial to 198.51.100.N:port reaches the test's
// server on 127.0.0.N:port.
type recorder struct {
	mu       sync.Mutex
	resolved []string
	dialled  []string
	hosts    map[string]string // name → address; absent: not found
}

func newRecorder() *recorder {
	return &recorder{hosts: map[string]string{
		"allowed.test": "198.51.100.1",
		"example.com":  "198.51.100.1",
		"refused.test": "198.51.100.3",
		"a.wild.test":  "198.51.100.1",
	}}
}

func (r *recorder) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.resolved = append(r.resolved, host)
	a, ok := r.hosts[host]
	r.mu.Unlock()
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

func (r *recorder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.dialled = append(r.dialled, addr)
	r.mu.Unlock()
	to, err := outside(addr)
	if err != nil {
		return nil, err
	}
	return (&net.Dialer{}).DialContext(ctx, network, to)
}

// The tests' outside world: the documentation range, and one private
// network (for egress_private).
var testOutside = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("10.20.0.0/24")}

// outside maps an address of the tests' outside world to the loopback
// address its server listens on. Any other address is not dialled at all
// (a unit test sends nothing off the machine): the dial is refused.
func outside(addr string) (string, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", err
	}
	for _, p := range testOutside {
		if p.Contains(ap.Addr()) {
			b := ap.Addr().As4()
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, b[3]}), ap.Port()).String(), nil
		}
	}
	return "", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

// testGuard is the real address guard with a routing table of the tests'
// own: every address is routed through a gateway on eth0 unless routes
// says otherwise. So the classes are decided exactly as on a node.
func testGuard(routes map[string]dialguard.Route) *dialguard.Guard {
	return &dialguard.Guard{
		SandboxNets:     []netip.Prefix{netip.MustParsePrefix("10.213.0.0/16")},
		SandboxIfPrefix: "ssv",
		Lookup: func(a netip.Addr) (dialguard.Route, error) {
			if r, ok := routes[a.String()]; ok {
				return r, nil
			}
			return dialguard.Route{Type: dialguard.RouteUnicast, Oif: "eth0", Gateway: true}, nil
		},
	}
}

func (r *recorder) touched() (resolved, dialled []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.resolved...), append([]string(nil), r.dialled...)
}

type env struct {
	b    *Boundary
	mesh *fakeMesh
	rec  *recorder
	sock string
	addr netip.Addr
	pol  atomic.Pointer[policy.Policy]
}

// newEnv starts a boundary for principal with testPolicy, a fake mesh, a
// recording resolver and dialer, a Unix socket and (if addr is valid) the
// TCP listeners on addr.
func newEnv(t testing.TB, principal string, addr netip.Addr, mod func(*Config)) *env {
	t.Helper()
	e := &env{mesh: newFakeMesh(t), rec: newRecorder(), sock: filepath.Join(t.TempDir(), "agent.sock"), addr: addr}
	e.pol.Store(mustPolicy(t, testPolicy))
	cfg := Config{
		Principal:  principal,
		Policy:     e.pol.Load,
		Mesh:       e.mesh.dial,
		SocketPath: e.sock,
		ListenAddr: addr,
		Resolve:    e.rec.resolve,
		Dial:       e.rec.dial,
		Guard:      testGuard(nil),
	}
	if addr.IsLoopback() {
		// The kernel picks 127.0.0.1 as the source of a connection to any
		// other loopback address.
		cfg.Peer = netip.MustParseAddr("127.0.0.1")
	}
	if mod != nil {
		mod(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	e.b = b
	return e
}

// socksDialer is golang.org/x/net/proxy's SOCKS5 client over the boundary's
// Unix socket (network "unix") or its proxy port ("tcp").
func (e *env) socksDialer(t testing.TB, network string, auth *proxy.Auth) proxy.ContextDialer {
	t.Helper()
	addr := e.sock
	if network == "tcp" {
		addr = netip.AddrPortFrom(e.addr, DefaultProxyPort).String()
	}
	d, err := proxy.SOCKS5(network, addr, auth, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	return d.(proxy.ContextDialer)
}

// httpClient reaches everything through the boundary's SOCKS5 socket.
func (e *env) httpClient(t testing.TB) *http.Client {
	d := e.socksDialer(t, "unix", nil)
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 30 * time.Second}
}

// rawSOCKS sends a no-auth greeting and a CONNECT for host:port (domain
// address type) over the Unix socket and returns the reply code.
func (e *env) rawSOCKS(t testing.TB, host string, port uint16) byte {
	t.Helper()
	c := dialSock(t, e.sock)
	defer c.Close()
	return socksExchange(t, c, socksConnect(host, port))
}

// socksConnect is a no-auth greeting and a CONNECT for host:port (domain
// address type), in one message.
func socksConnect(host string, port uint16) []byte {
	req := []byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}
	req = append(req, host...)
	return append(req, byte(port>>8), byte(port))
}

// dialSock connects to a boundary's Unix socket, with 10 s for the
// exchange the test makes on it.
func dialSock(t testing.TB, sock string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// socksExchange writes a complete greeting+request and returns the reply
// code (0xFF if the method was refused).
func socksExchange(t testing.TB, c net.Conn, req []byte) byte {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var sel [2]byte
	if _, err := io.ReadFull(c, sel[:]); err != nil {
		t.Fatalf("method selection: %v", err)
	}
	if sel[1] == 0xFF {
		return 0xFF
	}
	var rep [4]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		t.Fatalf("reply: %v", err)
	}
	if rep[0] != 5 {
		t.Fatalf("reply version %d", rep[0])
	}
	return rep[1]
}

// echoServer is a TCP server on addr that echoes each line in upper case
// and closes after "bye".
func echoServer(t testing.TB, addr string) (net.Listener, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if line == "bye\n" {
						io.WriteString(c, "BYE\n")
						return
					}
					io.WriteString(c, "ECHO "+line)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln, &accepted
}

func portOf(t testing.TB, ln net.Listener) uint16 {
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func getJSON(t testing.TB, c *http.Client, req *http.Request) (int, echo) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	var e echo
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("%s: %v: %s", req.URL, err, body)
		}
	}
	return resp.StatusCode, e
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
