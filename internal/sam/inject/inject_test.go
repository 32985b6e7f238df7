package inject

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/internal/secrets"
)

// upstream is a real HTTPS server on loopback with a certificate for
// names from a CA of the test's own; it records what each request held.
type upstream struct {
	addr  string
	roots *x509.CertPool
	mu    sync.Mutex
	seen  []string
}

func startUpstream(t *testing.T, names ...string) *upstream {
	t.Helper()
	return startUpstreamProtos(t, nil, names...)
}

// startUpstreamProtos is startUpstream offering protos by ALPN (with
// "h2", it speaks HTTP/2 to a client that asks).
func startUpstreamProtos(t *testing.T, protos []string, names ...string) *upstream {
	t.Helper()
	caPEM, keyPEM, err := NewCA("upstream", names)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := NewIssuer(caPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{roots: x509.NewCertPool()}
	u.roots.AppendCertsFromPEM(caPEM)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{NextProtos: protos, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return iss.Leaf(h.ServerName)
	}})
	if err != nil {
		t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo":
			echo(w, r)
			return
		case "/reflect":
			reflectBack(w, r)
			return
		case "/ws":
			wsEcho(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		line := r.Host + " " + r.URL.RequestURI() + " " + r.Proto + " auth=" + r.Header.Get("Authorization") + " body=" + string(body)
		u.mu.Lock()
		u.seen = append(u.seen, line)
		u.mu.Unlock()
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/plain")
			for i := 0; i < 3; i++ {
				io.WriteString(w, "chunk\n")
				w.(http.Flusher).Flush()
			}
			return
		}
		io.WriteString(w, "ok "+line)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return u
}

// last is the last request the server saw.
func (u *upstream) last() string {
	r := u.requests()
	if len(r) == 0 {
		return ""
	}
	return r[len(r)-1]
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}

// sandboxSide runs Serve for one flow to host and returns the sandbox's
// end of it, a TLS client trusting only the sandbox's CA, offering protos
// by ALPN.
func sandboxSide(t *testing.T, s *Set, caPEM []byte, u *upstream, host, sni string, protos ...string) (*client, chan Result) {
	t.Helper()
	inner, outer := net.Pipe()
	far, err := net.Dial("tcp", u.addr)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan Result, 1)
	go func() {
		op, err := Open(inner, far, nil, 5*time.Second)
		if err != nil || !op.TLS {
			res <- Result{Err: err}
			return
		}
		r := s.Serve(inner, op.Sandbox, far, host, 5*time.Second, func() {})
		inner.Close()
		far.Close()
		res <- r
	}()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := tls.Client(outer, &tls.Config{ServerName: sni, RootCAs: pool, NextProtos: protos})
	t.Cleanup(func() { c.Close() })
	return &client{c, bufio.NewReader(c)}, res
}

// client is the sandbox's end: one reader for the connection's life.
type client struct {
	*tls.Conn
	br *bufio.Reader
}

func get(t *testing.T, c *client, req string) (string, error) {
	t.Helper()
	if _, err := io.WriteString(c, req); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(c.br, nil)
	for err == nil && resp.StatusCode == http.StatusContinue {
		resp, err = http.ReadResponse(c.br, nil)
	}
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Status + " " + string(b), err
}

func TestServeReplacesMarkersForItsHostsOnly(t *testing.T) {
	u := startUpstream(t, "api.test", "other.test")
	marker := secrets.NewMarker()
	const value = "s3cr3t-value"
	caPEM, keyPEM, err := NewCA("sb1", []string{"api.test"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSet([]Binding{{Name: "api", Marker: marker, Value: value, Hosts: []string{"api.test"}}}, caPEM, keyPEM, u.roots)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.For("other.test")) != 0 || len(s.For("API.test")) != 1 {
		t.Fatalf("For: other.test %v, API.test %v", s.For("other.test"), s.For("API.test"))
	}
	c, res := sandboxSide(t, s, caPEM, u, "api.test", "api.test")
	basic := base64.StdEncoding.EncodeToString([]byte("x-token:" + marker))
	body := "marker-in-body=" + marker
	got, err := get(t, c, "GET /v1?key="+marker+" HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+marker+"\r\n\r\n")
	// The server was sent the value; its answer, which quotes what it
	// was sent, reaches the sandbox with the marker back in its place.
	if last := u.last(); !strings.Contains(last, "auth=Bearer "+value) || !strings.Contains(last, "/v1?key="+value) {
		t.Errorf("header and query, as the server saw them: %q", last)
	}
	if err != nil || !strings.Contains(got, "auth=Bearer "+marker) || strings.Contains(got, value) {
		t.Errorf("header and query, as the sandbox was answered: %q, %v", got, err)
	}
	got, err = get(t, c, "POST /b HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic "+basic+"\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	want := base64.StdEncoding.EncodeToString([]byte("x-token:" + value))
	if err != nil || !strings.Contains(got, "auth=Basic "+want) || !strings.Contains(got, "body="+body) {
		t.Errorf("basic credentials replaced, body untouched: %q, %v", got, err)
	}
	got, err = get(t, c, "GET /stream HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx")
	if err != nil || got != "200 OK chunk\nchunk\nchunk\n" {
		t.Errorf("a streamed answer after 100 Continue: %q, %v", got, err)
	}
	c.Close()
	r := <-res
	if !slices.Equal(r.Used, []string{"api"}) || r.Out == 0 || r.In == 0 {
		t.Errorf("result %+v", r)
	}
	for _, line := range u.requests() {
		if head, _, _ := strings.Cut(line, " body="); strings.Contains(head, marker) {
			t.Errorf("a marker outside the body reached the server: %q", line)
		}
	}
}

func TestServeRefusesOtherNamesAndUnverifiedServers(t *testing.T) {
	u := startUpstream(t, "api.test")
	caPEM, keyPEM, _ := NewCA("sb2", []string{"api.test"})
	marker := secrets.NewMarker()
	s, err := NewSet([]Binding{{Name: "api", Marker: marker, Value: "v", Hosts: []string{"api.test"}}}, caPEM, keyPEM, u.roots)
	if err != nil {
		t.Fatal(err)
	}
	// An SNI other than the flow's destination gets no certificate.
	c, res := sandboxSide(t, s, caPEM, u, "api.test", "evil.test")
	if err := c.Handshake(); err == nil {
		t.Error("a certificate was issued for a name other than the destination")
	}
	if r := <-res; r.Err == nil {
		t.Error("Serve took a handshake for another name")
	}
	// A server whose certificate the node's roots do not verify gets no
	// request: the sandbox is answered 502, saying why.
	noRoots, _ := NewSet([]Binding{{Name: "api", Marker: marker, Value: "v", Hosts: []string{"api.test"}}}, caPEM, keyPEM, x509.NewCertPool())
	before := len(u.requests())
	c, res = sandboxSide(t, noRoots, caPEM, u, "api.test", "api.test")
	got, err := get(t, c, "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: "+marker+"\r\n\r\n")
	if err != nil || !strings.HasPrefix(got, "502") || !strings.Contains(got, "no secret was sent") {
		t.Errorf("an unverified server: %q, %v", got, err)
	}
	if r := <-res; r.Err == nil || len(r.Used) != 0 {
		t.Errorf("result %+v", r)
	}
	if len(u.requests()) != before {
		t.Error("the unverified server got a request")
	}
}

func TestCAMayOnlySignItsHosts(t *testing.T) {
	caPEM, keyPEM, err := NewCA("sb3", []string{"api.test", "*.corp.test"})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := NewIssuer(caPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	for host, ok := range map[string]bool{"api.test": true, "x.corp.test": true, "corp.test": false, "evil.test": false, "x.api.test": true} {
		leaf, err := iss.Leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		_, verr := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: pool})
		if (verr == nil) != ok {
			t.Errorf("a leaf for %s verifies: %v (want %v)", host, verr, ok)
		}
	}
	if b, _ := pem.Decode(keyPEM); b == nil {
		t.Error("the key is not PEM")
	}
}

// TestOpen: whichever side speaks first decides, and a server that
// speaks first is not kept waiting for the handshake timeout.
func TestOpen(t *testing.T) {
	pair := func() (sandbox, sandboxPeer, server, serverPeer net.Conn) {
		a, b := net.Pipe()
		c, d := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close(); c.Close(); d.Close() })
		return a, b, c, d
	}
	sb, sbPeer, srv, _ := pair()
	go sbPeer.Write([]byte("GET / HTTP/1.1\r\n"))
	op, err := Open(sb, srv, nil, time.Minute)
	if op.TLS || err != nil || string(op.Sandbox) != "G" || len(op.Server) != 0 {
		t.Errorf("plain HTTP: %+v %v", op, err)
	}
	if op, _ := Open(sb, srv, []byte{0x16, 3, 1}, time.Minute); !op.TLS {
		t.Error("a handshake record already read")
	}
	sb, sbPeer, srv, _ = pair()
	go sbPeer.Write([]byte{0x16, 3, 1, 0, 5})
	if op, err := Open(sb, srv, nil, time.Minute); !op.TLS || err != nil || !bytes.Equal(op.Sandbox, []byte{0x16}) {
		t.Errorf("a ClientHello: %+v %v", op, err)
	}
	// SMTP: the server's greeting comes first and ends the wait at once
	// (the wait here is longer than the test's deadline).
	sb, sbPeer, srv, srvPeer := pair()
	go srvPeer.Write([]byte("220 mail.example ESMTP\r\n"))
	op, err = Open(sb, srv, nil, time.Hour)
	if op.TLS || err != nil || string(op.Server) != "220 mail.example ESMTP\r\n" || len(op.Sandbox) != 0 {
		t.Errorf("a server that speaks first: %+v %v", op, err)
	}
	// The sandbox's connection is still usable after its read was cut.
	go sbPeer.Write([]byte("x"))
	sb.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := sb.Read(make([]byte, 1)); n != 1 || err != nil {
		t.Errorf("after the cut read: %d %v", n, err)
	}
	// Neither speaks: not TLS, after the wait.
	sb, _, srv, _ = pair()
	if op, err := Open(sb, srv, nil, 50*time.Millisecond); op.TLS || len(op.Sandbox) != 0 || len(op.Server) != 0 || err != nil {
		t.Errorf("both silent: %+v %v", op, err)
	}
	// The sandbox closes before a byte: an error, nothing to pass on.
	sb, sbPeer, srv, _ = pair()
	sbPeer.Close()
	if _, err := Open(sb, srv, nil, time.Minute); err == nil {
		t.Error("a sandbox that closed: no error")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// reflectBack answers the Authorization it was sent, in a header and in
// its body, as ?as= says: plain (a stated length), big (over
// MaxBufferedBody, chunked), gzip (though asked for identity), br (a
// coding the boundary cannot read).
func reflectBack(w http.ResponseWriter, r *http.Request) {
	v := r.Header.Get("Authorization")
	w.Header().Set("X-Echo", v)
	body := "you sent " + v + " asking for " + r.Header.Get("Accept-Encoding")
	switch r.URL.Query().Get("as") {
	case "gzip":
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		io.WriteString(gz, body)
		gz.Close()
	case "br":
		w.Header().Set("Content-Encoding", "br")
		io.WriteString(w, body)
	case "big":
		io.WriteString(w, strings.Repeat("x", MaxBufferedBody)+body)
	default:
		io.WriteString(w, body)
	}
}

// echo answers each line of the request's body as it comes (in upper
// case), before the next is sent (a stream both ways, as gRPC's), then a
// trailer.
func echo(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		// Upper case: what it was sent, but not a secret's value, which
		// the boundary would scrub on the way back.
		io.WriteString(w, "echo "+strings.ToUpper(sc.Text())+"\n")
		w.(http.Flusher).Flush()
	}
	w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
}

// TestServeHeaderRules: a header rule (E2B's network.rules) sets its
// header on each request to its host, replacing the sandbox's own, and is
// named in the result; NewSet refuses a binding that is neither a secret
// nor a rule.
func TestServeHeaderRules(t *testing.T) {
	u := startUpstream(t, "api.test")
	caPEM, keyPEM, _ := NewCA("sb-rules", []string{"api.test"})
	rule := Binding{Name: "rule:api.test", Hosts: []string{"api.test"}, Headers: map[string]string{"Authorization": "Bearer from-the-rule"}}
	s, err := NewSet([]Binding{rule}, caPEM, keyPEM, u.roots)
	if err != nil {
		t.Fatal(err)
	}
	c, res := sandboxSide(t, s, caPEM, u, "api.test", "api.test")
	got, err := get(t, c, "GET /r HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer the-sandbox-own\r\n\r\n")
	if err != nil || !strings.Contains(got, "auth=Bearer from-the-rule") {
		t.Errorf("a header rule: %q, %v", got, err)
	}
	c.Close()
	if r := <-res; !slices.Equal(r.Used, []string{"rule:api.test"}) {
		t.Errorf("result %+v", r)
	}
	for _, bad := range []Binding{
		{Name: "both", Hosts: []string{"api.test"}, Marker: secrets.NewMarker(), Value: "v", Headers: map[string]string{"X": "y"}},
		{Name: "neither", Hosts: []string{"api.test"}},
		{Name: "no hosts", Headers: map[string]string{"X": "y"}},
		{Name: "a rule in bodies", Hosts: []string{"api.test"}, Headers: map[string]string{"X": "y"}, Body: true},
	} {
		if _, err := NewSet([]Binding{bad}, caPEM, keyPEM, u.roots); err == nil {
			t.Errorf("NewSet took %+v", bad)
		}
	}
}
