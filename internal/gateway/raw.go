package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"sandstorm/internal/errdefs"
)

// chunk is the result of one Read.
type chunk struct {
	b   []byte
	err error
}

// firstBytes is what sniff saw: who spoke first and what they said.
type firstBytes struct {
	// http: the client spoke first, and with an HTTP/1.x request line.
	http bool
	// client and upstream are the first chunk each side sent, if any.
	// When the client spoke first, upstream is empty; when the sandbox
	// did, the client's first read is still running and arrives on
	// pending.
	client, upstream []byte
	clientErr        error
	upstreamErr      error
	pending          <-chan chunk
}

// sniff waits for whichever side speaks first. Many protocols start with
// the server (SMTP, SSH, MySQL…), so the client cannot simply be read
// first; the sandbox is read too, and once the client has spoken the
// sandbox's read is cut short with a past deadline (a pending Read returns
// os.ErrDeadlineExceeded and the connection stays usable).
func (g *Gateway) sniff(client, up net.Conn) firstBytes {
	cch := make(chan chunk, 1)
	go func() {
		buf := make([]byte, 32<<10)
		n, err := client.Read(buf)
		cch <- chunk{buf[:n], err}
	}()
	uch := make(chan chunk, 1)
	go func() {
		buf := make([]byte, 32<<10)
		n, err := up.Read(buf)
		uch <- chunk{buf[:n], err}
	}()
	select {
	case c := <-cch:
		up.SetReadDeadline(time.Now())
		u := <-uch
		up.SetReadDeadline(time.Time{})
		if errors.Is(u.err, os.ErrDeadlineExceeded) {
			u.err = nil
		}
		f := firstBytes{client: c.b, clientErr: c.err, upstream: u.b, upstreamErr: u.err}
		f.http = len(u.b) == 0 && u.err == nil && len(c.b) > 0 && requestLine(c.b)
		return f
	case u := <-uch:
		return firstBytes{upstream: u.b, upstreamErr: u.err, pending: cch}
	}
}

// requestLine reports whether b starts with an HTTP/1.x request line (RFC
// 9112 §3: method SP request-target SP HTTP-version CRLF) or enough of one
// to be sure: a token of capitals, a space, and, if the line is complete,
// "HTTP/1." before its end. HTTP/2's preface ("PRI * HTTP/2.0") is not.
func requestLine(b []byte) bool {
	sp := bytes.IndexByte(b, ' ')
	if sp <= 0 || sp > 16 {
		return false
	}
	for _, c := range b[:sp] {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	if string(b[:sp]) == "PRI" {
		return false
	}
	line := b
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		line = bytes.TrimRight(b[:i], "\r")
		return bytes.HasSuffix(line, []byte(" HTTP/1.1")) || bytes.HasSuffix(line, []byte(" HTTP/1.0"))
	}
	// The line goes on past the first read (a long URL): the method is
	// enough to go by; ReadRequest will refuse it if it is not HTTP.
	return len(line) >= 32<<10
}

// forwardRaw moves bytes both ways until either side ends, starting with
// what sniff read. Into the sandbox, it thaws a sandbox frozen while the
// connection was open before each write. The sandbox's side is reset,
// never sent a FIN (see the package comment), so a client's half-close is
// not passed on.
func (g *Gateway) forwardRaw(sg *sandboxGate, p *pair, up net.Conn, f firstBytes) {
	done := make(chan struct{}, 2)
	go func() { // sandbox → client
		defer func() { done <- struct{}{} }()
		if len(f.upstream) > 0 {
			if _, err := p.client.Write(f.upstream); err != nil {
				return
			}
		}
		if f.upstreamErr != nil {
			return
		}
		g.copy(p.client, up, sg.id, false)
	}()
	go func() { // client → sandbox
		defer func() { done <- struct{}{} }()
		c := chunk{f.client, f.clientErr}
		if f.pending != nil {
			c = <-f.pending
		}
		if len(c.b) > 0 {
			if !g.writeInto(up, c.b, sg.id) {
				return
			}
		}
		if c.err != nil {
			return
		}
		g.copy(up, p.client, sg.id, true)
	}()
	<-done
}

// writeInto writes b into the sandbox, first thawing it if a tier change
// froze it while the connection was open.
func (g *Gateway) writeInto(up net.Conn, b []byte, id string) bool {
	g.waker.Touch(id)
	if !g.waker.IsHot(id) {
		ctx, cancel := contextWithAdmission(g)
		err := g.waker.Wake(ctx, id)
		cancel()
		if err != nil {
			return false
		}
	}
	_, err := up.Write(b)
	return err == nil
}

// copy moves bytes from src to dst until either fails.
func (g *Gateway) copy(dst, src net.Conn, id string, intoSandbox bool) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if intoSandbox {
				if !g.writeInto(dst, buf[:n], id) {
					return
				}
			} else {
				g.waker.Touch(id)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// refuse turns a connection away. If the client speaks HTTP (its first bytes
// are a request line) it gets a 503 with Retry-After and a JSON body in the
// API's error shape; any other protocol gets a reset.
func (g *Gateway) refuse(c net.Conn, why error) {
	defer resetClose(c)
	g.log.Info("gateway refused", "err", why)
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	br := bufio.NewReader(c)
	head, _ := br.Peek(8)
	if !looksHTTP(head) {
		return
	}
	writeUnavailable(c, why, g.cfg.RetryAfter)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	// Let the client read the answer before the reset.
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	io.Copy(io.Discard, br)
}

// writeUnavailable answers a refused wake as the API would (its status and
// error shape from errdefs.Table: a wake with no room is 503, with
// Retry-After), closing the connection. The gateway speaks to the raw
// connection, so it writes the response itself.
func writeUnavailable(w io.Writer, why error, retryAfter int) {
	if _, ok := errdefs.Lookup(why); !ok {
		// A wake that failed for a reason of no kind (a start that broke)
		// is a 503 to the client, as a refusal: the next request tries
		// again, from whatever the node settled the sandbox to.
		why = errdefs.Mark(errdefs.ErrNoRoom, why)
	}
	status, e := errdefs.ToWire(why)
	b, _ := json.Marshal(e)
	retry := ""
	if status == http.StatusServiceUnavailable {
		retry = fmt.Sprintf("Retry-After: %d\r\n", retryAfter)
	}
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		status, http.StatusText(status), retry, len(b)+1, b)
}

func looksHTTP(b []byte) bool {
	for _, m := range []string{"GET ", "POST", "PUT ", "HEAD", "DELE", "PATC", "OPTI", "CONN", "TRAC"} {
		if len(b) >= 4 && string(b[:4]) == m {
			return true
		}
	}
	return false
}
