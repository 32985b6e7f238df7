package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxHeaderBytes bounds a request's or response's header block, as
// net/http's server does by default (http.DefaultMaxHeaderBytes).
const maxHeaderBytes = http.DefaultMaxHeaderBytes

// serveHTTP forwards an HTTP/1.x connection request by request: read a
// request from the client, send it into the sandbox, relay the answer, and
// between requests let Drain close the sandbox's side. Bytes are relayed
// as net/http frames them (RFC 9112 message framing), so the gateway knows
// where each exchange ends; headers pass unchanged, hop-by-hop ones
// included, because both ends see one hop. p is busy on entry (its first
// request was sniffed).
func (g *Gateway) serveHTTP(sg *sandboxGate, p *pair, target netip.AddrPort, prefix []byte) {
	src := &budget{r: io.MultiReader(bytes.NewReader(prefix), p.client)}
	g.httpLoop(sg, p, target, src, bufio.NewReaderSize(src, 32<<10), nil, "")
}

// httpLoop is serveHTTP's loop over the requests of a connection read
// through src and cr. first, when set, is its first request, already read
// (the Host-routed listener reads it to know the sandbox). host, when set,
// binds the connection to that Host: a later request for another is
// answered 421 (RFC 9110 §15.5.20) and the connection closed.
func (g *Gateway) httpLoop(sg *sandboxGate, p *pair, target netip.AddrPort, src *budget, cr *bufio.Reader, first0 *http.Request, host string) {
	var up net.Conn
	var ur *bufio.Reader
	first := true
	for {
		if !first {
			sg.done(p)
			if g.handover.Load() {
				return // the process is being replaced: no next request here
			}
		}
		var req *http.Request
		var err error
		if first && first0 != nil {
			req = first0
		} else {
			req, err = readRequest(src, cr)
		}
		if err != nil {
			switch {
			case errors.Is(err, errHeaderTooLarge):
				writeStatus(p.client, http.StatusRequestHeaderFieldsTooLarge, "request header over 1 MiB")
			case !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrUnexpectedEOF):
				writeStatus(p.client, http.StatusBadRequest, "malformed request: "+err.Error())
			}
			return
		}
		if host != "" && !strings.EqualFold(req.Host, host) {
			writeStatus(p.client, http.StatusMisdirectedRequest, "this connection is for "+host+"; open another for "+req.Host)
			return
		}
		g.waker.Touch(sg.id)
		if !first {
			if err := g.wakeAndAdmit(sg, p); err != nil {
				if !errors.Is(err, net.ErrClosed) {
					g.log.Info("gateway refused", "sandbox", sg.id, "err", err)
					writeUnavailable(p.client, err, g.cfg.RetryAfter)
				}
				return
			}
		}
		first = false
		// Drain may have closed the sandbox's side since the last request,
		// or the server its idle connection (Node.js does after 5 s).
		if cur := sg.currentUpstream(p); cur != nil && cur == up && !alive(up, ur) {
			sg.mu.Lock()
			if p.upstream == up {
				p.upstream = nil
			}
			sg.mu.Unlock()
			resetClose(up)
		}
		if cur := sg.currentUpstream(p); cur == nil || cur != up {
			if cur == nil {
				c, err := g.dial(sg.id, target)
				if err != nil {
					g.log.Warn("gateway dial", "sandbox", sg.id, "target", target, "err", err)
					g.waker.Unreachable(sg.id)
					writeUnavailable(p.client, fmt.Errorf("sandbox did not accept on %s: %w", target, err), g.cfg.RetryAfter)
					return
				}
				if !sg.setUpstream(p, c) {
					return
				}
				cur = c
			}
			up, ur = cur, bufio.NewReaderSize(cur, 32<<10)
		}
		keep, upgraded := g.exchange(sg, req, p.client, up, ur)
		if upgraded {
			// 101 Switching Protocols (a WebSocket, say): from here on
			// it is bytes, and Drain resets it like any raw connection.
			sg.mu.Lock()
			p.http = false
			sg.setBusy(p, false)
			sg.mu.Unlock()
			g.forwardRaw(sg, p, up, firstBytes{client: drain(cr), upstream: drain(ur)})
			return
		}
		if !keep {
			return
		}
	}
}

// alive reports whether an idle connection into the sandbox can carry the
// next request: the server has neither closed it nor sent anything
// unasked (which would be taken for the next answer). It peeks at the
// socket without blocking (recv MSG_PEEK|MSG_DONTWAIT): a read with a past
// deadline would not do, since Go returns the timeout without looking.
func alive(up net.Conn, ur *bufio.Reader) bool {
	if ur.Buffered() > 0 {
		return false
	}
	sc, ok := up.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	var rerr error
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false
	}
	_ = n // 0 with no error is EOF, more is unasked data: neither is reusable
	return errors.Is(rerr, unix.EAGAIN)
}

// readRequest reads one request, its header block bounded by
// maxHeaderBytes.
func readRequest(src *budget, cr *bufio.Reader) (*http.Request, error) {
	src.left = maxHeaderBytes
	req, err := http.ReadRequest(cr)
	src.left = math.MaxInt64
	return req, err
}

// errHeaderTooLarge ends a request header block over maxHeaderBytes.
var errHeaderTooLarge = errors.New("request header too large")

// budget bounds what a client may send before its request's header block
// ends: http.ReadRequest has no limit of its own (net/http's server sets
// one the same way, on the reader under its bufio.Reader).
type budget struct {
	r    io.Reader
	left int64
}

func (b *budget) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// exchange sends req into the sandbox and relays the answer (1xx interim
// answers included) to the client. It reports whether the connection may
// carry another request, and whether it was upgraded to another protocol.
// The request is written while the answer is read: a client that sent
// "Expect: 100-continue" sends its body only once the 100 is relayed.
func (g *Gateway) exchange(sg *sandboxGate, req *http.Request, client, up net.Conn, ur *bufio.Reader) (keep, upgraded bool) {
	// A client waits on an answer (Busy); one that asks for a stream of
	// events (a GET accepting text/event-stream: an EventSource, an MCP
	// client's standalone stream) subscribes, maybe for hours, and that
	// does not keep the sandbox hot: what comes on it touches and thaws
	// it as any byte does.
	if !(req.Method == http.MethodGet && strings.Contains(req.Header.Get("Accept"), "text/event-stream")) {
		sg.answering.Add(1)
		defer sg.answering.Add(-1)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		// Request.Write would add Go's own.
		req.Header["User-Agent"] = []string{""}
	}
	if req.Body != nil {
		req.Body = touchReader{req.Body, g, sg.id}
	}
	wrote := make(chan error, 1)
	go func() { wrote <- req.Write(up) }()
	for {
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			werr := <-wrote
			g.log.Info("gateway: the sandbox did not answer a request", "sandbox", sg.id, "method", req.Method, "err", err, "write_err", werr)
			writeStatus(client, http.StatusBadGateway, "the sandbox closed the connection without answering")
			return false, false
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			if err := resp.Write(client); err != nil {
				<-wrote
				return false, false
			}
			continue
		}
		if resp.Body != nil {
			resp.Body = touchReader{resp.Body, g, sg.id}
		}
		if g.handover.Load() && resp.StatusCode != http.StatusSwitchingProtocols {
			// This is the connection's last answer (handover.go): say so,
			// so that the client's next request opens a new connection
			// (RFC 9112 §9.6) rather than meeting a closed one.
			resp.Close = true
		}
		err = resp.Write(client)
		resp.Body.Close()
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return false, err == nil
		}
		werr := <-wrote
		g.waker.Touch(sg.id)
		return err == nil && werr == nil && !resp.Close && !req.Close, false
	}
}

// touchReader records activity on every read of a body, so that a long
// upload or download keeps the sandbox hot.
type touchReader struct {
	io.ReadCloser
	g  *Gateway
	id string
}

func (t touchReader) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if n > 0 {
		t.g.waker.Touch(t.id)
	}
	return n, err
}

// drain returns what r has buffered.
func drain(r *bufio.Reader) []byte {
	b, _ := r.Peek(r.Buffered())
	return bytes.Clone(b)
}

// writeStatus answers with a short plain-text error and closes.
func writeStatus(w io.Writer, code int, msg string) {
	body := msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

func contextWithAdmission(g *Gateway) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), g.cfg.Admission)
}
