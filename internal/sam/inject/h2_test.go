package inject

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http2"

	"sandstorm/internal/secrets"
)

// h2Side is sandboxSide's connection to api.test, its handshake done.
func h2Side(t *testing.T, s *Set, caPEM []byte, u *upstream, protos []string) (*tls.Conn, chan Result) {
	t.Helper()
	c, res := sandboxSide(t, s, caPEM, u, "api.test", "api.test", protos...)
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	return c.Conn, res
}

// TestServeHTTP2: a server that speaks h2 is spoken h2 to by the
// sandbox (gRPC needs it): headers replaced, a stream both ways at once
// (each line answered before the next is sent), its trailer passed on.
// One that speaks only HTTP/1.1 is given HTTP/1.1 by a sandbox that
// offers both.
func TestServeHTTP2(t *testing.T) {
	u := startUpstreamProtos(t, []string{"h2", "http/1.1"}, "api.test")
	hdr, body := secrets.NewMarker(), secrets.NewMarker()
	caPEM, keyPEM, _ := NewCA("sb-h2", []string{"api.test"})
	s, err := NewSet([]Binding{
		{Name: "hdr", Marker: hdr, Value: "bearer-value", Hosts: []string{"api.test"}},
		{Name: "body", Marker: body, Value: "body-value", Hosts: []string{"api.test"}, Body: true},
	}, caPEM, keyPEM, u.roots)
	if err != nil {
		t.Fatal(err)
	}
	c, res := h2Side(t, s, caPEM, u, []string{"h2", "http/1.1"})
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q with an h2 server", p)
	}
	cc, err := (&http2.Transport{}).NewClientConn(c)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "https://api.test/v1?k="+hdr, nil)
	req.Header.Set("Authorization", "Bearer "+hdr)
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if last := u.last(); !strings.Contains(last, "/v1?k=bearer-value HTTP/2.0 auth=Bearer bearer-value") {
		t.Errorf("a unary call: the server saw %q", last)
	}
	pr, pw := io.Pipe()
	req, _ = http.NewRequest("POST", "https://api.test/echo", pr)
	resp, err = cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewReader(resp.Body)
	for _, send := range []string{"one " + body, "two " + hdr} {
		io.WriteString(pw, send+"\n")
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		want := "echo " + strings.ToUpper(strings.ReplaceAll(send, body, "body-value")) + "\n"
		if line != want {
			t.Errorf("streamed: %q, want %q", line, want)
		}
	}
	pw.Close()
	if rest, err := io.ReadAll(resp.Body); len(rest) != 0 || err != nil || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("the stream's end: %q %v, trailer %v", rest, err, resp.Trailer)
	}
	cc.Close()
	c.Close()
	if r := <-res; !slices.Equal(r.Used, []string{"hdr", "body"}) {
		t.Errorf("result %+v", r)
	}

	// An HTTP/1.1-only server: the sandbox is given HTTP/1.1.
	u1 := startUpstream(t, "api.test")
	s1, _ := NewSet([]Binding{{Name: "hdr", Marker: hdr, Value: "v", Hosts: []string{"api.test"}}}, caPEM, keyPEM, u1.roots)
	c1, res1 := h2Side(t, s1, caPEM, u1, []string{"h2", "http/1.1"})
	if p := c1.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Errorf("negotiated %q with an HTTP/1.1 server", p)
	}
	got1, err := get(t, &client{c1, bufio.NewReader(c1)}, "GET /x HTTP/1.1\r\nHost: api.test\r\nAuthorization: "+hdr+"\r\n\r\n")
	if err != nil || !strings.Contains(got1, "HTTP/1.1 auth=v") {
		t.Errorf("HTTP/1.1: %q %v", got1, err)
	}
	c1.Close()
	<-res1
}
