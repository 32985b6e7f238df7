package inject

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http2"

	"sandstorm/internal/secrets"
)

// TestServeScrubsSecretsFromAnswers: a server that sends a secret back
// (an echo, an error quoting the key) is passed on with the marker in its
// place, in headers and body, whatever the body's framing; it was asked
// for identity, a gzip answer is decoded, and one in a coding the
// boundary cannot read is refused, not passed on. Over HTTP/1.1 and
// HTTP/2.
func TestServeScrubsSecretsFromAnswers(t *testing.T) {
	const value = "sk-scrub-0123456789abcdef"
	marker := secrets.NewMarker()
	caPEM, keyPEM, _ := NewCA("sb-scrub", []string{"api.test"})
	for _, protos := range [][]string{{"http/1.1"}, {"h2", "http/1.1"}} {
		u := startUpstreamProtos(t, protos, "api.test")
		s, err := NewSet([]Binding{{Name: "api", Marker: marker, Value: value, Hosts: []string{"api.test"}}}, caPEM, keyPEM, u.roots)
		if err != nil {
			t.Fatal(err)
		}
		c, res := sandboxSide(t, s, caPEM, u, "api.test", "api.test", protos...)
		if err := c.Handshake(); err != nil {
			t.Fatal(err)
		}
		var do func(path string) (*http.Response, string)
		if c.ConnectionState().NegotiatedProtocol == "h2" {
			cc, err := (&http2.Transport{}).NewClientConn(c.Conn)
			if err != nil {
				t.Fatal(err)
			}
			do = func(path string) (*http.Response, string) {
				req, _ := http.NewRequest("GET", "https://api.test"+path, nil)
				req.Header.Set("Authorization", "Bearer "+marker)
				req.Header.Set("Accept-Encoding", "gzip, br")
				resp, err := cc.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}
		} else {
			br := bufio.NewReader(c)
			do = func(path string) (*http.Response, string) {
				io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+marker+"\r\nAccept-Encoding: gzip, br\r\n\r\n")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}
		}
		want := "you sent Bearer " + marker + " asking for identity"
		for _, as := range []string{"plain", "gzip", "big"} {
			resp, body := do("/reflect?as=" + as)
			if !strings.HasSuffix(body, want) || strings.Contains(body, value) || resp.Header.Get("X-Echo") != "Bearer "+marker || resp.Header.Get("Content-Encoding") != "" {
				t.Errorf("%v, %s: %d, X-Echo %q, Content-Encoding %q, body ending %q", protos, as, resp.StatusCode, resp.Header.Get("X-Echo"), resp.Header.Get("Content-Encoding"), body[max(0, len(body)-200):])
			}
		}
		if resp, body := do("/reflect?as=br"); resp.StatusCode != http.StatusBadGateway || strings.Contains(body, value) || !strings.Contains(body, `"br"`) {
			t.Errorf("%v, a coding the boundary cannot read: %d %q", protos, resp.StatusCode, body)
		}
		c.Close()
		if r := <-res; !slices.Equal(r.Scrubbed, []string{"api"}) || !slices.Equal(r.Used, []string{"api"}) {
			t.Errorf("%v: result %+v", protos, r)
		}
	}
}
