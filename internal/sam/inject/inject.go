package inject

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"sandstorm/internal/secrets"
)

// Binding is one secret bound to a sandbox: the marker the sandbox was
// given, the value the boundary puts in its place, and the names it may
// go to (secrets.CheckHosts). Or it is a header rule (E2B's network.rules
// transforms): no marker, and Headers set on every request to its hosts,
// replacing any of the same name.
type Binding struct {
	Name   string   `json:"name"`
	Marker string   `json:"marker"`
	Value  string   `json:"value"`
	Hosts  []string `json:"hosts"`
	// Body: the marker is replaced in request bodies too (inBody says
	// why that is not the default).
	Body bool `json:"body,omitempty"`
	// Headers are a header rule's: names to values.
	Headers map[string]string `json:"headers,omitempty"`
}

// Set is one sandbox's bindings, its CA, and the roots that verify the
// real servers. A nil *Set has no bindings.
type Set struct {
	bindings []Binding
	iss      *Issuer
	roots    *x509.CertPool
	// sessions resumes TLS to the servers: a new flow to a server seen
	// before skips the full handshake (its certificate was verified then).
	sessions tls.ClientSessionCache
}

// NewSet is bindings with the sandbox's CA (NewCA's PEM) and roots (nil:
// the system's).
func NewSet(bindings []Binding, caCert, caKey []byte, roots *x509.CertPool) (*Set, error) {
	for _, b := range bindings {
		rule := len(b.Headers) > 0 && b.Marker == "" && b.Value == "" && !b.Body
		secret := strings.HasPrefix(b.Marker, secrets.MarkerPrefix) && b.Value != "" && len(b.Headers) == 0
		if !(rule || secret) || len(b.Hosts) == 0 {
			return nil, fmt.Errorf("secret %q: a binding needs hosts, and a marker and a value or headers (not both)", b.Name)
		}
	}
	iss, err := NewIssuer(caCert, caKey)
	if err != nil {
		return nil, err
	}
	return &Set{bindings: bindings, iss: iss, roots: roots, sessions: tls.NewLRUClientSessionCache(64)}, nil
}

// WithRoots is s verifying the servers with roots instead (nil: the
// system's): a flow to a node's own ingress, whose certificate the
// fleet's CA signed.
func (s *Set) WithRoots(roots *x509.CertPool) *Set {
	c := *s
	c.roots = roots
	return &c
}

// For is the bindings that may be sent to host.
func (s *Set) For(host string) []Binding {
	if s == nil {
		return nil
	}
	var out []Binding
	for _, b := range s.bindings {
		if secrets.HostMatches(b.Hosts, host) {
			out = append(out, b)
		}
	}
	return out
}

// Opening is how a flow opened: whether its sandbox began a TLS
// handshake, and the bytes each side sent before that was known, to be
// passed on first.
type Opening struct {
	TLS             bool
	Sandbox, Server []byte
}

// Open waits for whichever side of a flow speaks first, as the gateway's
// sniff does (internal/gateway/raw.go): the sandbox (prefix, if it holds
// its first bytes already) or the server. Many protocols start with the
// server (SMTP, SSH, MySQL); TLS never does (RFC 8446 §2: the client's
// ClientHello comes first), so a server that speaks first ends the wait
// at once and the flow is not TLS. A sandbox that sends a handshake
// record (type 22) while the server is silent is; after wait with
// neither having spoken, the flow is not TLS either and is spliced. A
// read still pending on the side that did not speak is cut short with a
// past deadline, which leaves its connection usable (net.Conn).
func Open(sandbox, server net.Conn, prefix []byte, wait time.Duration) (Opening, error) {
	if len(prefix) > 0 {
		return Opening{TLS: prefix[0] == 0x16, Sandbox: prefix}, nil
	}
	sch, fch := firstRead(sandbox, 1), firstRead(server, 32<<10)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var s, f chunk
	select {
	case s = <-sch:
		f = cut(server, fch)
		if len(s.b) == 0 {
			return Opening{}, s.err // the sandbox closed before a byte
		}
	case f = <-fch:
		// The server spoke (or closed) first: whatever it said goes to
		// the sandbox, and the splice finds any close it came with.
		s = cut(sandbox, sch)
	case <-timer.C:
		s, f = cut(sandbox, sch), cut(server, fch)
	}
	return Opening{TLS: len(s.b) > 0 && s.b[0] == 0x16 && len(f.b) == 0, Sandbox: s.b, Server: f.b}, nil
}

type chunk struct {
	b   []byte
	err error
}

// firstRead reads up to size bytes from c once, in the background.
func firstRead(c net.Conn, size int) <-chan chunk {
	ch := make(chan chunk, 1)
	go func() {
		b := make([]byte, size)
		n, err := c.Read(b)
		ch <- chunk{b[:n], err}
	}()
	return ch
}

// cut ends c's pending first read and returns what it had read.
func cut(c net.Conn, ch <-chan chunk) chunk {
	c.SetReadDeadline(time.Now())
	r := <-ch
	c.SetReadDeadline(time.Time{})
	if errors.Is(r.err, os.ErrDeadlineExceeded) {
		r.err = nil
	}
	return r
}

// Result is what a flow carried: bytes to and from the server (TLS, as
// on the wire), the secrets put in its requests, those the server sent
// back (scrubbed: the sandbox was given their markers), and why it ended
// early.
type Result struct {
	Out, In  int64
	Used     []string
	Scrubbed []string
	Err      error
}

// Serve carries a TLS flow from the sandbox (its first bytes in prefix)
// to host over far, an open connection to host's address: it ends the
// sandbox's TLS with a certificate for host from the sandbox's CA (only
// for host: any other name in its SNI is refused), opens TLS over far
// verifying host's real certificate, and passes HTTP requests and their
// answers through, each request's markers replaced by the secrets bound
// to host. The server's TLS is opened while the sandbox's handshake
// waits, offering what the sandbox offered of h2 and HTTP/1.1, and the
// sandbox is given the protocol the server chose: HTTP/2 (gRPC) where
// the server speaks it, HTTP/1.1 otherwise. touch is called on every
// request (the sandbox's activity). Serve returns when either side is
// done; the caller closes both connections.
func (s *Set) Serve(sandbox net.Conn, prefix []byte, far net.Conn, host string, timeout time.Duration, touch func()) (r Result) {
	bound := s.For(host)
	cf := &counted{Conn: far}
	var u, back usage
	defer func() { r.Out, r.In, r.Used, r.Scrubbed = cf.out.Load(), cf.in.Load(), u.list(), back.list() }()
	var up *tls.Conn
	var upErr error
	in := tls.Server(&prefixed{Conn: sandbox, r: io.MultiReader(bytes.NewReader(prefix), sandbox)}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			if h.ServerName != "" && !strings.EqualFold(strings.TrimSuffix(h.ServerName, "."), host) {
				return nil, fmt.Errorf("the client asked for %q on a flow to %q", h.ServerName, host)
			}
			leaf, err := s.iss.Leaf(host)
			if err != nil {
				return nil, err
			}
			up, upErr = s.dial(cf, host, h.SupportedProtos, timeout)
			proto := "http/1.1"
			if upErr == nil && up.ConnectionState().NegotiatedProtocol == "h2" {
				proto = "h2"
			}
			return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{proto}, Certificates: []tls.Certificate{*leaf}}, nil
		},
	})
	in.SetDeadline(time.Now().Add(2 * timeout)) // the server's handshake is inside it
	if err := in.Handshake(); err != nil {
		r.Err = fmt.Errorf("the sandbox's TLS handshake (does it trust its CA?): %w", err)
		if upErr != nil {
			r.Err = fmt.Errorf("%s's TLS: %w", host, upErr) // the cause, when the sandbox's failed after it
		}
		return r
	}
	in.SetDeadline(time.Time{})
	br := bufio.NewReader(in)
	if upErr != nil {
		r.Err = fmt.Errorf("%s's TLS: %w", host, upErr)
		answer(in, br, timeout, http.StatusBadGateway, "sandstorm boundary: "+r.Err.Error()+"; no secret was sent")
		return r
	}
	if in.ConnectionState().NegotiatedProtocol == "h2" {
		r.Err = serveH2(in, up, bound, &u, &back, touch)
		return r
	}
	r.Err = relay(in, br, up, bound, &u, &back, touch)
	return r
}

// dial opens TLS to host over far, verifying its certificate, offering
// of offered (the sandbox's ALPN) those this boundary can pass on.
func (s *Set) dial(far net.Conn, host string, offered []string, timeout time.Duration) (*tls.Conn, error) {
	protos := []string{}
	for _, p := range []string{"h2", "http/1.1"} {
		if slices.Contains(offered, p) {
			protos = append(protos, p)
		}
	}
	if len(protos) == 0 {
		protos = []string{"http/1.1"} // the sandbox offered no ALPN: HTTP/1.1
	}
	up := tls.Client(far, &tls.Config{ServerName: host, RootCAs: s.roots, MinVersion: tls.VersionTLS12, NextProtos: protos,
		ClientSessionCache: s.sessions})
	up.SetDeadline(time.Now().Add(timeout))
	if err := up.Handshake(); err != nil {
		return nil, err
	}
	up.SetDeadline(time.Time{})
	return up, nil
}

// relay passes requests and their answers until one side is done.
func relay(in *tls.Conn, br *bufio.Reader, up *tls.Conn, bound []Binding, u, back *usage, touch func()) error {
	ubr := bufio.NewReader(up)
	sc := scrubs(bound)
	for {
		if _, err := br.Peek(1); err != nil {
			return nil // the sandbox is done (between requests)
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return fmt.Errorf("the sandbox's request: %w", err)
		}
		touch()
		u.add(Replace(req, bound)...)
		u.add(SetHeaders(req, bound)...)
		askIdentity(req, sc)
		if len(sc) > 0 && isWebSocket(req) {
			// No permessage-deflate: the frames must stay readable to
			// be scrubbed (wsscrub.go).
			req.Header.Del("Sec-WebSocket-Extensions")
		}
		if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
			// Answered here: the body is read from the sandbox while the
			// request is written out, so it must not wait for the server.
			req.Header.Del("Expect")
			io.WriteString(in, "HTTP/1.1 100 Continue\r\n\r\n")
		}
		if err := replaceBody(req, bound, u); err != nil {
			return err
		}
		if err := req.Write(up); err != nil {
			return fmt.Errorf("writing the request out: %w", err)
		}
		resp, err := readFinal(ubr, req, in)
		if err != nil {
			return fmt.Errorf("the server's answer: %w", err)
		}
		if err := scrubResponse(resp, req, sc, back); err != nil {
			resp.Body.Close()
			fmt.Fprintf(in, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nsandstorm boundary: %s\n", err)
			return err
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			if len(sc) > 0 && !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
				resp.Body.Close()
				fmt.Fprintf(in, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nsandstorm boundary: the server switched to %q, which the boundary cannot read to keep the secret out of it\n", resp.Header.Get("Upgrade"))
				return fmt.Errorf("an upgrade to %q from a secret's host", resp.Header.Get("Upgrade"))
			}
			resp.Write(in)
			return tunnel(in, br, up, ubr, sc, back)
		}
		err = resp.Write(in)
		resp.Body.Close()
		if err != nil || resp.Close || req.Close {
			return err
		}
	}
}

// readFinal reads the server's answer, passing informational ones (1xx
// but 101) to the sandbox.
func readFinal(ubr *bufio.Reader, req *http.Request, in io.Writer) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(ubr, req)
		if err != nil || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, err
		}
		resp.Write(in)
	}
}

// tunnel copies both ways after an upgrade (a WebSocket): no more HTTP.
// With secrets to scrub (sc), the server's frames are scrubbed
// (scrubWS); a frame it cannot read ends the connection.
func tunnel(in *tls.Conn, br *bufio.Reader, up *tls.Conn, ubr *bufio.Reader, sc []Binding, back *usage) error {
	done := make(chan struct{})
	go func() {
		io.Copy(up, br)
		up.CloseWrite()
		close(done)
	}()
	var err error
	if len(sc) > 0 {
		err = scrubWS(in, ubr, sc, back)
	} else {
		io.Copy(in, ubr)
	}
	in.Close()
	if err != nil {
		up.Close()
	}
	<-done
	return err
}

// answer reads the sandbox's request (so its client reads the answer)
// and answers it with status and msg, closing the connection.
func answer(in *tls.Conn, br *bufio.Reader, timeout time.Duration, status int, msg string) {
	in.SetDeadline(time.Now().Add(timeout))
	if _, err := http.ReadRequest(br); err != nil {
		return
	}
	fmt.Fprintf(in, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		status, http.StatusText(status), len(msg)+1, msg)
}

// Replace puts each binding's value in place of its marker in req's
// header values (inside Basic credentials too, which carry it base64),
// its path and its query, and returns the names of those it put in. The
// body is replaceBody's, and only for a binding stored to go there.
func Replace(req *http.Request, bound []Binding) []string {
	var used []string
	for _, b := range bound {
		if b.Marker == "" {
			continue // a header rule (SetHeaders)
		}
		hit := false
		sub := func(s string) string {
			if strings.Contains(s, b.Marker) {
				hit = true
				return strings.ReplaceAll(s, b.Marker, b.Value)
			}
			return s
		}
		for k, vs := range req.Header {
			for i, v := range vs {
				vs[i] = sub(v)
				if k == "Authorization" || k == "Proxy-Authorization" {
					vs[i] = inBasic(vs[i], sub)
				}
			}
		}
		req.URL.Path, req.URL.RawPath, req.URL.RawQuery = sub(req.URL.Path), sub(req.URL.RawPath), sub(req.URL.RawQuery)
		if hit {
			used = append(used, b.Name)
		}
	}
	return used
}

// SetHeaders sets the headers of bound's header rules on req, replacing
// any of the same name the sandbox sent (E2B: "an existing header with
// the same name is replaced"), and returns the names of the rules.
func SetHeaders(req *http.Request, bound []Binding) []string {
	var used []string
	for _, b := range bound {
		for k, v := range b.Headers {
			req.Header.Set(k, v)
		}
		if len(b.Headers) > 0 {
			used = append(used, b.Name)
		}
	}
	return used
}

// inBasic applies sub to the user:password of a Basic credential.
func inBasic(v string, sub func(string) string) string {
	scheme, enc, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return v
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return v
	}
	if s := sub(string(raw)); s != string(raw) {
		return scheme + " " + base64.StdEncoding.EncodeToString([]byte(s))
	}
	return v
}

// prefixed reads what was read ahead before the connection.
type prefixed struct {
	net.Conn
	r io.Reader
}

func (p *prefixed) Read(b []byte) (int, error) { return p.r.Read(b) }

// counted counts the bytes of a connection each way.
type counted struct {
	net.Conn
	out, in atomic.Int64
}

func (c *counted) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *counted) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

// CloseWrite passes a half-close on (tls.Conn.CloseWrite needs it).
func (c *counted) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
