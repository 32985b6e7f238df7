package boundary

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

// pipelinedMeshRequest sends the SOCKS5 greeting, the CONNECT to
// mesh.sam.alt and a GET /v1/models in one write, as a client that does not
// wait for each reply may, and returns the principal the node saw.
func pipelinedMeshRequest(t *testing.T, sock string) string {
	t.Helper()
	c := dialSock(t, sock)
	defer c.Close()
	msg := append(socksConnect("mesh.sam.alt", 80), "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Principal: someone-else\r\nConnection: close\r\n\r\n"...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	var rep [12]byte // method selection (2) and reply (10)
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		t.Fatalf("replies: %v", err)
	}
	if rep[0] != 5 || rep[1] != 0 || rep[3] != socksSucceeded {
		t.Fatalf("replies % x", rep)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e echo
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	return e.Header.Get(HeaderPrincipal)
}

// The boundaries of a process share their keep-alive connections to the
// node (one MeshPool, as a Set and sandstormd hold them): after the first
// flow a new flow dials nothing (admission is the decision alone), and
// every request on a shared connection carries the principal of the
// boundary that forwarded it — never one the agent sent, never another
// boundary's, even when the previous request on that connection was.
func TestMeshConnectionsReusedAcrossFlows(t *testing.T) {
	mesh := newFakeMesh(t)
	pol := mustPolicy(t, testPolicy)
	dir := t.TempDir()
	pool := NewMeshPool(mesh.dial, 0)
	t.Cleanup(pool.Close)
	var socks []string
	for _, principal := range []string{"agent-a", "agent-b"} {
		sock := fmt.Sprintf("%s/%s.sock", dir, principal)
		e := newEnv(t, principal, netip.Addr{}, func(c *Config) { c.Mesh = nil; c.MeshPool = pool; c.SocketPath = sock })
		e.pol.Store(pol)
		socks = append(socks, sock)
	}
	for round := 0; round < 5; round++ {
		for i, want := range []string{"agent-a", "agent-b"} {
			if got := pipelinedMeshRequest(t, socks[i]); got != want {
				t.Fatalf("round %d: the node saw principal %q through %s's boundary", round, got, want)
			}
		}
	}
	// One, then reused; a flow may arrive a moment before the connection
	// its predecessor used is back in the idle pool, and then the
	// transport dials one more, so not exactly 1.
	if n := mesh.dials.Load(); n < 1 || n > 3 {
		t.Errorf("the node was dialled %d times for 10 flows through 2 boundaries sharing a pool, want 1 (then reused), at most 3", n)
	}
}

// With no connection to the node open, admission dials one, so a node that
// is gone is still a refusal at the handshake (SOCKS5 0x04), not a flow
// that fails later; the boundary notices its idle connections closing.
func TestMeshNodeGoneAfterReuse(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	if got := pipelinedMeshRequest(t, e.sock); got != "agent-a" {
		t.Fatalf("principal %q", got)
	}
	if e.b.pool.Open() == 0 {
		t.Fatal("no connection to the node kept after a flow")
	}
	e.mesh.srv.Close() // closes the listener and every connection
	testenv.WaitFor(t, 10*time.Second, "the boundary has no connection to the node", func() bool { return e.b.pool.Open() == 0 })
	if rep := e.rawSOCKS(t, "mesh.sam.alt", 80); rep != socksHostUnreachable {
		t.Errorf("mesh gone: reply %#x, want host unreachable", rep)
	}
	if st := e.b.Stats(); st.Flows["mesh/unreachable"] != 1 {
		t.Errorf("stats %v", st.Flows)
	}
}

// Bytes a client sends right behind its SOCKS5 request, before the reply,
// reach the far side of an external flow: the handshake's buffer passes
// them on.
func TestSOCKSPipelinedExternal(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	ln, _ := echoServer(t, "127.0.0.1:0")
	c := dialSock(t, e.sock)
	defer c.Close()
	msg := append(socksConnect("allowed.test", portOf(t, ln)), "early\nbye\n"...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	var rep [12]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil || rep[3] != socksSucceeded {
		t.Fatalf("replies % x %v", rep, err)
	}
	br := bufio.NewReader(c)
	for _, want := range []string{"ECHO early\n", "BYE\n"} {
		if line, err := br.ReadString('\n'); line != want {
			t.Fatalf("got %q %v, want %q", line, err, want)
		}
	}
}

// A denied request sent in the same write as the greeting gets both
// replies (method selection, then not allowed) and nothing is dialled.
func TestSOCKSPipelinedDenied(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	c := dialSock(t, e.sock)
	defer c.Close()
	c.Write(socksConnect("denied.example", 80))
	var rep [12]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil || rep[0] != 5 || rep[1] != 0 || rep[3] != socksNotAllowed {
		t.Fatalf("replies % x %v", rep, err)
	}
	if resolved, dialled := e.rec.touched(); len(resolved)+len(dialled) != 0 || e.mesh.dials.Load() != 0 {
		t.Errorf("touched: %v %v %d", resolved, dialled, e.mesh.dials.Load())
	}
}

// An answer the node's side cuts mid-stream reaches the agent cut (its
// chunked body unterminated, not a clean end it would take for the
// whole answer), and the boundary logs it: the one trace of such a cut.
func TestMeshAnswerCutIsLogged(t *testing.T) {
	var logged testenv.SyncBuffer
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) {
		c.Log = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	resp, err := e.httpClient(t).Post("http://mesh.sam.alt/v1/chat/completions?stream=1", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: {\"n\":0}\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	e.mesh.srv.Close() // every connection to the node, the answer's too
	if rest, err := io.ReadAll(br); err == nil {
		t.Fatalf("the cut answer ended cleanly after %q", rest)
	}
	testenv.WaitFor(t, 5*time.Second, "the boundary logs the cut", func() bool {
		return strings.Contains(logged.String(), "mesh_answer=cut") && strings.Contains(logged.String(), "principal=agent-a")
	})
}

// An answer that starts before the request's body is read to its end (an
// MCP server's event stream opens at once) is passed on while the rest of
// the body still comes: the sandbox sends half its body, waits for the
// answer's header, then sends the rest, which the node must get whole.
// Without full duplex the boundary's server would close or drain the
// body at the answer's first flush (TestE2BMCP cut an answer so).
func TestMeshAnswerBeforeBody(t *testing.T) {
	sock := t.TempDir() + "/node.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "data: %s\n\n", body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) {
		c.Mesh = func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }
	})
	c := dialSock(t, e.sock)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := append(socksConnect("mesh.sam.alt", 80), "POST /mcp HTTP/1.1\r\nHost: mesh.sam.alt\r\nContent-Length: 10\r\n\r\n01234"...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	var rep [12]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil || rep[3] != socksSucceeded {
		t.Fatalf("replies % x, %v", rep, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the answer's header before the body's end: %v", err)
	}
	if _, err := io.WriteString(c, "56789"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: 0123456789\n" {
		t.Fatalf("the answer: %q, %v; want the whole body echoed", line, err)
	}
}
