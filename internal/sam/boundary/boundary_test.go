package boundary

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/net/proxy"

	"sandstorm/internal/sam/policy"
	"sandstorm/internal/testenv"
)

var spoofed = map[string]string{
	"X-Sam-Principal":     "root",
	"X-Sam-Service":       "inference://big",
	"X-Sam-Admin":         "1",
	"Authorization":       "Bearer stolen",
	"Proxy-Authorization": "Basic eDp5",
	"Cookie":              "session=1",
	"X-Api-Key":           "k",
	"Api-Key":             "k",
	"Forwarded":           "for=192.0.2.1",
	"X-Forwarded-For":     "192.0.2.1",
	"X-Forwarded-Host":    "evil.example",
	"X-Real-Ip":           "192.0.2.1",
}

func checkIdentity(t *testing.T, got echo, principal string) {
	t.Helper()
	if v := got.Header.Values(HeaderPrincipal); len(v) != 1 || v[0] != principal {
		t.Errorf("%s = %q, want exactly %q", HeaderPrincipal, v, principal)
	}
	for k := range spoofed {
		if k == HeaderPrincipal {
			continue
		}
		if v := got.Header.Get(k); k == HeaderService && v != "" && v != "inference://small" && v != "mcp://present" {
			t.Errorf("spoofed %s reached the mesh: %q", k, got.Header.Get(k))
			continue
		}
		if k != HeaderService && got.Header.Get(k) != "" {
			t.Errorf("spoofed %s reached the mesh: %q", k, got.Header.Get(k))
		}
	}
	// No spelling of an identity header but the boundary's own: a
	// lenient upstream (any WSGI server) reads X-Sam_Principal as
	// X-Sam-Principal.
	for k, v := range got.Header {
		f := foldHeader(k)
		own := k == HeaderPrincipal || k == HeaderService
		if !own && (strings.HasPrefix(f, "x-sam-") || strings.HasPrefix(f, "x-forwarded-") || identityHeaders[f]) {
			t.Errorf("spoofed %s reached the mesh: %q", k, v)
		}
	}
	if got.Header.Get("X-Custom") != "kept" {
		t.Errorf("ordinary header X-Custom not forwarded: %v", got.Header)
	}
}

// spelled are identity headers spelled as a lenient upstream folds them,
// sent with these exact names (not Go's canonical ones).
var spelled = map[string]string{
	"X-Sam_Principal":     "root",
	"x_sam_principal":     "root",
	"X-SAM-PRINCIPAL":     "root",
	"x-sam_service":       "inference://big",
	"X_Forwarded_For":     "192.0.2.1",
	"Api_Key":             "k",
	"PROXY_AUTHORIZATION": "Basic eDp5",
}

func spoof(req *http.Request) *http.Request {
	for k, v := range spoofed {
		req.Header.Set(k, v)
	}
	for k, v := range spelled {
		req.Header[k] = []string{v}
	}
	req.Header.Set("X-Custom", "kept")
	return req
}

// The mesh through SOCKS5 (golang.org/x/net/proxy): agent paths are
// forwarded with the boundary's identity header and without the agent's;
// every other path is 403 with a JSON body.
func TestMeshThroughSOCKS5(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	c := e.httpClient(t)

	req, _ := http.NewRequest("GET", "http://mesh.sam.alt/v1/models?limit=2", nil)
	status, got := getJSON(t, c, spoof(req))
	if status != 200 || got.Path != "/v1/models" || got.Query != "limit=2" || got.Method != "GET" {
		t.Fatalf("GET /v1/models: %d %+v", status, got)
	}
	checkIdentity(t, got, "agent-a")

	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/mcp", "/mcp/", "/mcp/calc", "/v1/models/gpt-small"} {
		req, _ := http.NewRequest("POST", "http://mesh.sam.alt"+p, strings.NewReader(`{"model":"m"}`))
		status, got := getJSON(t, c, spoof(req))
		if status != 200 || got.Path != p || got.Body != `{"model":"m"}` {
			t.Errorf("POST %s: %d %+v", p, status, got)
			continue
		}
		checkIdentity(t, got, "agent-a")
	}

	admin := []string{"/", "/admin", "/metrics", "/healthz", "/readyz", "/v1", "/v1/embeddings", "/mcpx", "/v1/models/",
		"/v1/models/../../admin", "/%2e%2e/admin", "/mcp/../metrics", "//v1/models", "/v1/models/./x", "/v1%2fmodels"}
	for _, p := range admin {
		resp, err := c.Get("http://mesh.sam.alt" + p)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var eb struct {
			Error struct{ Message, Type string }
		}
		if resp.StatusCode != 403 || json.Unmarshal(body, &eb) != nil || eb.Error.Type == "" {
			t.Errorf("GET %s: %d %s, want 403 with a JSON error", p, resp.StatusCode, body)
		}
	}
	st := e.b.Stats()
	if st.MeshRefused != uint64(len(admin)) || st.Refusals != uint64(len(admin)) {
		t.Errorf("refused %d, refusals %d, want %d", st.MeshRefused, st.Refusals, len(admin))
	}
	if st.MeshForwarded != 7 || st.HeadersStripped != 7 {
		t.Errorf("forwarded %d, stripped %d, want 7, 7", st.MeshForwarded, st.HeadersStripped)
	}
	if st.Flows["mesh/allowed"] == 0 || st.Denied != 0 {
		t.Errorf("flows: %v", st.Flows)
	}
	t.Logf("stats: %+v", st)
}

// Server-sent events reach the agent as the node writes them: the fake mesh
// waits for the test before each next event, so the first one must arrive
// alone.
func TestMeshStreamsSSE(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	c := e.httpClient(t)
	resp, err := c.Post("http://mesh.sam.alt/v1/chat/completions?stream=1", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Echo-Principal") != "agent-a" {
		t.Fatalf("status %d, principal %q", resp.StatusCode, resp.Header.Get("X-Echo-Principal"))
	}
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if want := fmt.Sprintf("data: {\"n\":%d}\n", i); line != want {
			t.Fatalf("event %d = %q, want %q", i, line, want)
		}
		br.ReadString('\n')          // the blank line ending the event
		e.mesh.release <- struct{}{} // only now may the node write the next one
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("end of stream %q", rest)
	}
}

// MCP Streamable HTTP (POST, GET for SSE, DELETE) keeps its headers;
// <svc>.mcp.sam.alt goes to /mcp/<svc>; <svc>.inference.sam.alt carries
// X-Sam-Service.
func TestMeshServicesAndMCP(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	c := e.httpClient(t)
	for _, m := range []string{"POST", "GET", "DELETE"} {
		req, _ := http.NewRequest(m, "http://mesh.sam.alt/mcp", strings.NewReader(`{"jsonrpc":"2.0"}`))
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", "s-123")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		status, got := getJSON(t, c, spoof(req))
		if status != 200 || got.Method != m || got.Path != "/mcp" || got.Header.Get("Mcp-Session-Id") != "s-123" ||
			got.Header.Get("Accept") != "application/json, text/event-stream" || got.Header.Get("Mcp-Protocol-Version") != "2025-06-18" {
			t.Errorf("%s /mcp: %d %+v", m, status, got)
		}
		checkIdentity(t, got, "agent-a")
	}
	for _, p := range []string{"/", "/mcp"} {
		req, _ := http.NewRequest("POST", "http://present.mcp.sam.alt"+p, nil)
		status, got := getJSON(t, c, spoof(req))
		if status != 200 || got.Path != "/mcp/present" || got.Header.Get(HeaderService) != "mcp://present" {
			t.Errorf("present.mcp.sam.alt%s: %d %+v", p, status, got)
		}
		checkIdentity(t, got, "agent-a")
	}
	if resp, err := c.Get("http://present.mcp.sam.alt/admin"); err != nil || resp.StatusCode != 403 {
		t.Errorf("present.mcp.sam.alt/admin: %v %v", resp, err)
	}
	req, _ := http.NewRequest("POST", "http://small.inference.sam.alt/v1/chat/completions", strings.NewReader("{}"))
	status, got := getJSON(t, c, spoof(req))
	if status != 200 || got.Path != "/v1/chat/completions" || got.Header.Get(HeaderService) != "inference://small" {
		t.Errorf("small.inference.sam.alt: %d %+v", status, got)
	}
	checkIdentity(t, got, "agent-a")
	if resp, err := c.Get("http://small.inference.sam.alt/mcp"); err != nil || resp.StatusCode != 403 {
		t.Errorf("small.inference.sam.alt/mcp: %v %v", resp, err)
	}
}

// Denied destinations get SOCKS reply 0x02 (and 403 on CONNECT) and are
// never resolved or dialled: an external name not in policy, 127.0.0.1,
// localhost, a literal IP, the host's own addresses, an absent service.
func TestDenials(t *testing.T) {
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.2"), nil)
	denied := []string{"denied.test", "127.0.0.1", "localhost", "LOCALHOST.", "192.0.2.99", "::1", "0.0.0.0", "absent.mcp.sam.alt",
		"x.y.sam.alt", "sam.alt", "wild.test", "169.254.64.1", "a..b", "", "bad host", "evil.allowed.test"}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			denied = append(denied, p.Addr().String())
		}
	}
	for _, h := range denied {
		if rep := e.rawSOCKS(t, h, 80); rep != socksNotAllowed {
			t.Errorf("SOCKS to %q: reply %#x, want 0x02", h, rep)
		}
	}
	// The same through the other address types and through CONNECT.
	for _, ip := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), netip.MustParseAddr("192.0.2.2")} {
		c, _ := net.Dial("unix", e.sock)
		req := []byte{5, 1, 0, 5, 1, 0}
		if ip.Is4() {
			a := ip.As4()
			req = append(append(req, 1), a[:]...)
		} else {
			a := ip.As16()
			req = append(append(req, 4), a[:]...)
		}
		if rep := socksExchange(t, c, append(req, 0, 80)); rep != socksNotAllowed {
			t.Errorf("SOCKS to IP %s: reply %#x", ip, rep)
		}
		c.Close()
	}
	for _, h := range []string{"denied.test:443", "127.0.0.1:22", "localhost:80", "[::1]:80", "absent.mcp.sam.alt:80"} {
		if status := rawCONNECT(t, "unix", e.sock, h); status != 403 {
			t.Errorf("CONNECT %s: %d, want 403", h, status)
		}
	}
	// Proxy-port too.
	if status := rawCONNECT(t, "tcp", "127.77.0.2:1080", "127.0.0.1:1080"); status != 403 {
		t.Errorf("CONNECT to the boundary itself: %d", status)
	}
	resolved, dialled := e.rec.touched()
	if len(resolved) != 0 || len(dialled) != 0 || e.mesh.dials.Load() != 0 {
		t.Fatalf("a denied destination was touched: resolved %v, dialled %v, mesh dials %d", resolved, dialled, e.mesh.dials.Load())
	}
	st := e.b.Stats()
	if st.Allowed != 0 || st.Denied == 0 || st.Refusals != st.Denied {
		t.Errorf("stats: %+v", st)
	}
}

// A refused flow on the sandbox-facing port gets its answer, then a reset,
// never a FIN.
func TestRefusalThenReset(t *testing.T) {
	newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.12"), nil)
	socks, _ := net.Dial("tcp", "127.77.0.12:1080")
	defer socks.Close()
	if rep := socksExchange(t, socks, socksConnect("denied.test", 80)); rep != socksNotAllowed {
		t.Fatalf("reply %#x", rep)
	}
	rest := make([]byte, 6) // BND.ADDR and BND.PORT
	io.ReadFull(socks, rest)
	if _, err := socks.Read(make([]byte, 1)); !isReset(err) {
		t.Errorf("after the SOCKS refusal: %v, want a reset", err)
	}

	conn, _ := net.Dial("tcp", "127.77.0.12:1080")
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "CONNECT denied.test:443 HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if _, err := br.ReadByte(); !isReset(err) {
		t.Errorf("after the CONNECT refusal: %v, want a reset", err)
	}
}

// A service that exists but is not granted and one that does not exist are
// refused alike, over SOCKS, CONNECT and DNS, so nothing can be probed.
func TestAbsentAndPresentServicesAlike(t *testing.T) {
	e := newEnv(t, "agent-b", netip.MustParseAddr("127.77.0.3"), nil)
	if a, p := e.rawSOCKS(t, "absent.mcp.sam.alt", 80), e.rawSOCKS(t, "present.mcp.sam.alt", 80); a != p || a != socksNotAllowed {
		t.Errorf("SOCKS replies absent %#x, present %#x", a, p)
	}
	a, p := rawCONNECTResponse(t, "unix", e.sock, "absent.mcp.sam.alt:80"), rawCONNECTResponse(t, "unix", e.sock, "present.mcp.sam.alt:80")
	if a != p || !strings.HasPrefix(a, "403 ") {
		t.Errorf("CONNECT responses differ:\n%s\n%s", a, p)
	}
	qa, qp := dnsQuery(t, "udp", "127.77.0.3:53", "absent.mcp.sam.alt.", dns.TypeA), dnsQuery(t, "udp", "127.77.0.3:53", "present.mcp.sam.alt.", dns.TypeA)
	if qa.Rcode != dns.RcodeNameError || qa.Rcode != qp.Rcode || len(qa.Answer) != len(qp.Answer) || len(qa.Ns) != len(qp.Ns) {
		t.Errorf("DNS answers differ: %v / %v", qa, qp)
	}
	// agent-b is granted small only
	if rep := e.rawSOCKS(t, "small.inference.sam.alt", 80); rep != socksSucceeded {
		t.Errorf("granted model: %#x", rep)
	}
	if e.mesh.dials.Load() != 1 {
		t.Errorf("mesh dialled %d times, want once (for the granted model)", e.mesh.dials.Load())
	}
}

// No policy at all: everything is denied, the mesh included.
func TestNoPolicyDeniesEverything(t *testing.T) {
	for _, pf := range []func() *policy.Policy{nil, func() *policy.Policy { return nil }} {
		e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.4"), func(c *Config) { c.Policy = pf })
		for _, h := range []string{"mesh.sam.alt", "present.mcp.sam.alt", "small.inference.sam.alt", "allowed.test", "198.51.100.2", "localhost"} {
			if rep := e.rawSOCKS(t, h, 80); rep != socksNotAllowed {
				t.Errorf("%s: %#x", h, rep)
			}
			if m := dnsQuery(t, "udp", "127.77.0.4:53", h+".", dns.TypeA); m.Rcode != dns.RcodeNameError {
				t.Errorf("DNS %s: %s", h, dns.RcodeToString[m.Rcode])
			}
		}
		if resolved, dialled := e.rec.touched(); len(resolved)+len(dialled) != 0 || e.mesh.dials.Load() != 0 {
			t.Errorf("touched: %v %v %d", resolved, dialled, e.mesh.dials.Load())
		}
		e.b.Close()
	}
}

// Allowed external destinations: a name the test's resolver maps to
// loopback, an exact IP entry, a wildcard entry; through SOCKS5 over the
// socket and the proxy port, and CONNECT through net/http's own proxy
// support. The far side closing ends the flow with all data delivered and
// then a reset, never a FIN.
func TestExternalAllowed(t *testing.T) {
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.5"), nil)
	ln1, _ := echoServer(t, "127.0.0.1:0")
	ln2, _ := echoServer(t, "127.0.0.2:0")
	for _, network := range []string{"unix", "tcp"} {
		d := e.socksDialer(t, network, nil)
		for _, target := range []string{
			fmt.Sprintf("allowed.test:%d", portOf(t, ln1)),
			fmt.Sprintf("a.wild.test:%d", portOf(t, ln1)),
			fmt.Sprintf("198.51.100.2:%d", portOf(t, ln2)), // an allowed IP literal
		} {
			c, err := d.DialContext(context.Background(), "tcp", target)
			if err != nil {
				t.Fatalf("%s via %s: %v", target, network, err)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			io.WriteString(c, "hello\n")
			if line, err := br.ReadString('\n'); line != "ECHO hello\n" {
				t.Fatalf("%s: %q %v", target, line, err)
			}
			io.WriteString(c, "bye\n")
			if line, err := br.ReadString('\n'); line != "BYE\n" {
				t.Fatalf("%s: %q %v", target, line, err)
			}
			_, err = br.ReadByte()
			if network == "tcp" && !isReset(err) {
				t.Errorf("%s: after the far side closed, read gave %v, want a reset", target, err)
			}
			c.Close()
		}
	}

	// Bytes sent right behind the CONNECT request are not lost.
	pc, _ := net.Dial("unix", e.sock)
	pc.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(pc, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test\r\n\r\nearly\n", portOf(t, ln1))
	pbr := bufio.NewReader(pc)
	if resp, err := http.ReadResponse(pbr, &http.Request{Method: "CONNECT"}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	if line, err := pbr.ReadString('\n'); line != "ECHO early\n" {
		t.Errorf("pipelined bytes: %q %v", line, err)
	}
	pc.Close()

	// CONNECT through net/http's proxy support, to an HTTPS server.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls ok") }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "127.77.0.5:1080"})
	tr.TLSClientConfig.ServerName = "example.com"
	resp, err := (&http.Client{Transport: tr}).Get("https://example.com:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "tls ok" {
		t.Fatalf("through CONNECT: %q", body)
	}
	// Denied the same way through net/http: the proxy's 403 surfaces.
	if _, err := (&http.Client{Transport: tr}).Get("https://denied.test/"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("denied CONNECT through net/http: %v", err)
	}
	// Plain HTTP through the boundary as an HTTP proxy: served for mesh
	// names, 405 for anything else.
	ptr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "127.77.0.5:1080"})}
	req, _ := http.NewRequest("GET", "http://mesh.sam.alt/v1/models", nil)
	status, got := getJSON(t, &http.Client{Transport: ptr}, spoof(req))
	if status != 200 || got.Path != "/v1/models" {
		t.Errorf("mesh through HTTP proxy: %d %+v", status, got)
	}
	checkIdentity(t, got, "agent-a")
	if resp, err := (&http.Client{Transport: ptr}).Get("http://example.com/"); err != nil || resp.StatusCode != 405 {
		t.Errorf("plain HTTP to an external name: %v %v", resp, err)
	}
	// net/http sends requests for several hosts on one proxy connection:
	// each is decided on its own name.
	req, _ = http.NewRequest("POST", "http://present.mcp.sam.alt/mcp", nil)
	if status, got := getJSON(t, &http.Client{Transport: ptr}, spoof(req)); status != 200 || got.Path != "/mcp/present" {
		t.Errorf("present.mcp.sam.alt through HTTP proxy: %d %+v", status, got)
	}
	for _, u := range []string{"http://absent.mcp.sam.alt/mcp", "http://mesh.sam.alt/admin"} {
		if resp, err := (&http.Client{Transport: ptr}).Get(u); err != nil || resp.StatusCode != 403 {
			t.Errorf("%s through HTTP proxy: %v %v", u, resp, err)
		}
	}
	resolved, _ := e.rec.touched()
	for _, r := range resolved {
		if r == "denied.test" {
			t.Errorf("denied.test was resolved")
		}
	}
	t.Logf("stats: %+v", e.b.Stats())
}

func rawCONNECTResponse(t testing.TB, network, addr, target string) string {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	body, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%s %s", resp.Status, body)
}

func rawCONNECT(t testing.TB, network, addr, target string) int {
	t.Helper()
	s := rawCONNECTResponse(t, network, addr, target)
	var code int
	fmt.Sscanf(s, "%d", &code)
	return code
}

// Reply codes for what is not a plain success, with hand-written bytes.
func TestSOCKS5ReplyCodes(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	dialRaw := func(req []byte) byte {
		c := dialSock(t, e.sock)
		defer c.Close()
		return socksExchange(t, c, req)
	}
	host := []byte{3, 12}
	host = append(host, "allowed.test"...)
	for _, tc := range []struct {
		name string
		req  []byte
		want byte
	}{
		{"BIND", append(append([]byte{5, 1, 0, 5, 2, 0}, host...), 0, 80), socksCmdNotSupported},
		{"UDP ASSOCIATE", append(append([]byte{5, 1, 0, 5, 3, 0}, host...), 0, 80), socksCmdNotSupported},
		{"address type 5", []byte{5, 1, 0, 5, 1, 0, 5, 1, 2, 3, 4}, socksAtypNotSupported},
		{"request version 4", append(append([]byte{5, 1, 0, 4, 1, 0}, host...), 0, 80), socksGeneralFailure},
		{"no acceptable method", []byte{5, 1, 2}, 0xFF},
	} {
		if got := dialRaw(tc.req); got != tc.want {
			t.Errorf("%s: reply %#x, want %#x", tc.name, got, tc.want)
		}
	}
	if rep := e.rawSOCKS(t, "nxdomain.test", 80); rep != socksHostUnreachable {
		t.Errorf("name that does not resolve: %#x", rep)
	}
	if rep := e.rawSOCKS(t, "refused.test", 9); rep != socksConnRefused {
		t.Errorf("refused: %#x", rep)
	}
	if s := rawCONNECT(t, "unix", e.sock, "nxdomain.test:80"); s != 502 {
		t.Errorf("CONNECT to a name that does not resolve: %d", s)
	}
	if s := rawCONNECT(t, "unix", e.sock, "refused.test:9"); s != 502 {
		t.Errorf("CONNECT refused: %d", s)
	}
	// The server counts a refused method after it wrote its answer, so the
	// client may read that answer first: wait for the count.
	want := func(st Stats) bool {
		return st.Flows["external/unreachable"] == 2 && st.Flows["external/refused"] == 2 && st.HandshakeErrors == 5
	}
	deadline := time.Now().Add(5 * time.Second)
	for !want(e.b.Stats()) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := e.b.Stats(); !want(st) {
		t.Errorf("stats %+v", st)
	}
	// Non-CONNECT methods and garbage over HTTP.
	for req, want := range map[string]string{
		"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n":                          "HTTP/1.1 405",
		"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n":        "HTTP/1.1 405",
		"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage-not-http\r\n\r\n": "HTTP/1.1 400",
		"CONNECT nohostport HTTP/1.1\r\n\r\n":                                  "HTTP/1.1 400",
	} {
		c, _ := net.Dial("unix", e.sock)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, req)
		got, _ := io.ReadAll(c)
		c.Close()
		if !bytes.HasPrefix(got, []byte(want)) {
			t.Errorf("%q: got %q, want %s", req, got, want)
		}
	}
	// The mesh unreachable: allowed, but nothing to open.
	u := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) { c.Mesh = nil })
	if rep := u.rawSOCKS(t, "mesh.sam.alt", 80); rep != socksHostUnreachable {
		t.Errorf("mesh unreachable: %#x", rep)
	}
	if s := rawCONNECT(t, "unix", u.sock, "mesh.sam.alt:80"); s != 502 {
		t.Errorf("CONNECT mesh unreachable: %d", s)
	}
	if st := u.b.Stats(); st.Flows["mesh/unreachable"] != 2 {
		t.Errorf("stats %v", st.Flows)
	}
}

// RFC 1929: with users configured, authentication is required.
func TestSOCKS5UserPass(t *testing.T) {
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.6"), func(c *Config) { c.Users = map[string]string{"agent": "s3cret"} })
	// No-auth only: refused.
	if rep := e.rawSOCKS(t, "mesh.sam.alt", 80); rep != 0xFF {
		t.Errorf("no-auth accepted: %#x", rep)
	}
	// Wrong password.
	c, _ := net.Dial("unix", e.sock)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte{5, 1, 2, 1, 5, 'a', 'g', 'e', 'n', 't', 5, 'w', 'r', 'o', 'n', 'g'})
	var out [4]byte
	if _, err := io.ReadFull(c, out[:]); err != nil || out != [4]byte{5, 2, 1, 1} {
		t.Errorf("wrong password: %v %v", out, err)
	}
	c.Close()
	// x/net/proxy with the right credentials.
	hc := &http.Client{Transport: &http.Transport{DialContext: e.socksDialer(t, "unix", &proxy.Auth{User: "agent", Password: "s3cret"}).DialContext}}
	if resp, err := hc.Get("http://mesh.sam.alt/v1/models"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("with credentials: %v %v", resp, err)
	}
	bad := &http.Client{Transport: &http.Transport{DialContext: e.socksDialer(t, "unix", &proxy.Auth{User: "agent", Password: "nope"}).DialContext}}
	if _, err := bad.Get("http://mesh.sam.alt/v1/models"); err == nil {
		t.Fatal("wrong credentials accepted")
	}
	// CONNECT with and without Proxy-Authorization.
	if s := rawCONNECT(t, "unix", e.sock, "mesh.sam.alt:80"); s != 407 {
		t.Errorf("CONNECT without credentials: %d", s)
	}
	pc, _ := net.Dial("unix", e.sock)
	defer pc.Close()
	fmt.Fprintf(pc, "CONNECT mesh.sam.alt:80 HTTP/1.1\r\nProxy-Authorization: Basic YWdlbnQ6czNjcmV0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(pc), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT with credentials: %v %v", resp, err)
	}
}

// CloseFlows resets every open flow: the client sees ECONNRESET.
func TestCloseFlowsResets(t *testing.T) {
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.7"), nil)
	ln, _ := echoServer(t, "127.0.0.1:0")
	d := e.socksDialer(t, "tcp", nil)
	ext, err := d.DialContext(context.Background(), "tcp", fmt.Sprintf("allowed.test:%d", portOf(t, ln)))
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	br := bufio.NewReader(ext)
	io.WriteString(ext, "one\n")
	if l, _ := br.ReadString('\n'); l != "ECHO one\n" {
		t.Fatal(l)
	}
	// A mesh flow kept alive after one request.
	mesh, err := d.DialContext(context.Background(), "tcp", "mesh.sam.alt:80")
	if err != nil {
		t.Fatal(err)
	}
	defer mesh.Close()
	io.WriteString(mesh, "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\n\r\n")
	mbr := bufio.NewReader(mesh)
	resp, err := http.ReadResponse(mbr, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatal(resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	// A handshake in progress.
	half, _ := net.Dial("tcp", "127.77.0.7:1080")
	defer half.Close()
	half.Write([]byte{5})
	// DNS over TCP, idle.
	dnsc, _ := net.Dial("tcp", "127.77.0.7:53")
	defer dnsc.Close()

	testenv.WaitFor(t, 10*time.Second, "three active flows, four tracked", func() bool {
		e.b.mu.Lock()
		defer e.b.mu.Unlock()
		return e.b.Stats().Active == 3 && len(e.b.flows) == 4
	})
	if n := e.b.CloseFlows(); n != 4 {
		t.Errorf("CloseFlows = %d, want 4 (3 flows and a DNS connection)", n)
	}
	for name, c := range map[string]io.Reader{"external": br, "mesh": mbr, "handshake": half, "dns": dnsc} {
		if _, err := c.Read(make([]byte, 1)); !isReset(err) {
			t.Errorf("%s: read after CloseFlows: %v, want ECONNRESET", name, err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "no active flow", func() bool { return e.b.Stats().Active == 0 })
	// The boundary still takes new flows.
	if rep := e.rawSOCKS(t, "mesh.sam.alt", 80); rep != socksSucceeded {
		t.Errorf("after CloseFlows: %#x", rep)
	}
}

// A handshake that never completes is cut off at the handshake deadline
// and counted.
func TestHandshakeTimeout(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) { c.HandshakeTimeout = 100 * time.Millisecond })
	c, _ := net.Dial("unix", e.sock)
	defer c.Close()
	c.Write([]byte{5, 1})
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open")
	}
	testenv.WaitFor(t, 10*time.Second, "the handshake error counted", func() bool { return e.b.Stats().HandshakeErrors == 1 && e.b.Stats().Active == 0 })
}

// The policy in force decides each new flow, and each new request on an
// open mesh flow.
func TestPolicyChangesBetweenFlows(t *testing.T) {
	e := newEnv(t, "agent-a", netip.Addr{}, nil)
	c, err := e.socksDialer(t, "unix", nil).DialContext(context.Background(), "tcp", "mesh.sam.alt:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	get := func() int {
		io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if s := get(); s != 200 {
		t.Fatalf("first request %d", s)
	}
	e.pol.Store(mustPolicy(t, "roles: [{name: r, egress: [example.com]}]\nbindings: [{principal: someone-else, roles: [r]}]"))
	if s := get(); s != 403 {
		t.Errorf("request after the grant went: %d", s)
	}
	if rep := e.rawSOCKS(t, "mesh.sam.alt", 80); rep != socksNotAllowed {
		t.Errorf("new flow after the grant went: %#x", rep)
	}
}

func dnsQuery(t testing.TB, network, server, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, server)
	if err != nil {
		t.Fatalf("DNS %s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return r
}

// DNS: granted names get a stable synthetic address (the same across
// boundaries, so across restarts), AAAA is empty, everything else NXDOMAIN;
// nothing is forwarded.
func TestDNS(t *testing.T) {
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.8"), nil)
	srv := "127.77.0.8:53"
	got := map[string]netip.Addr{}
	for _, name := range []string{"mesh.sam.alt.", "MESH.sam.alt.", "present.mcp.sam.alt.", "allowed.test.", "a.wild.test.", "small.inference.sam.alt."} {
		for _, network := range []string{"udp", "tcp"} {
			r := dnsQuery(t, network, srv, name, dns.TypeA)
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
				t.Fatalf("%s over %s: %v", name, network, r)
			}
			a, ok := r.Answer[0].(*dns.A)
			if !ok || a.Hdr.Name != name {
				t.Fatalf("%s: answer %v", name, r.Answer[0])
			}
			ip, _ := netip.AddrFromSlice(a.A.To4())
			if !DefaultSynthetic.Contains(ip) {
				t.Errorf("%s: %s not in the synthetic pool", name, ip)
			}
			key := strings.ToLower(name)
			if prev, ok := got[key]; ok && prev != ip {
				t.Errorf("%s: %s then %s", name, prev, ip)
			}
			got[key] = ip
			if n, ok := e.b.Lookup(ip); !ok || n+"." != key {
				t.Errorf("Lookup(%s) = %q %v", ip, n, ok)
			}
		}
		if r := dnsQuery(t, "udp", srv, name, dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
			t.Errorf("AAAA %s: %v", name, r)
		}
	}
	seen := map[netip.Addr]bool{}
	for _, ip := range got {
		if seen[ip] {
			t.Errorf("two names share %s", ip)
		}
		seen[ip] = true
	}
	for _, name := range []string{"denied.test.", "localhost.", "absent.mcp.sam.alt.", "1.0.0.127.in-addr.arpa.", "127.0.0.1.", "google.com."} {
		if r := dnsQuery(t, "udp", srv, name, dns.TypeA); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Errorf("%s: %v", name, r)
		}
	}
	// A restarted boundary (another one for the same principal) gives the
	// same answers.
	e2 := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.9"), nil)
	for name, ip := range got {
		r := dnsQuery(t, "udp", "127.77.0.9:53", name, dns.TypeA)
		if a := r.Answer[0].(*dns.A); !a.A.Equal(ip.AsSlice()) {
			t.Errorf("%s: %s after restart, %s before", name, a.A, ip)
		}
	}
	_ = e2
	if resolved, dialled := e.rec.touched(); len(resolved)+len(dialled) != 0 {
		t.Errorf("DNS resolved or dialled something: %v %v", resolved, dialled)
	}
	// Not a query: no IN class, another opcode.
	m := new(dns.Msg)
	m.SetQuestion("mesh.sam.alt.", dns.TypeA)
	m.Question[0].Qclass = dns.ClassCHAOS
	if r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, srv); err != nil || r.Rcode != dns.RcodeRefused {
		t.Errorf("CHAOS: %v %v", r, err)
	}
	st := e.b.Stats()
	if st.DNSSynthetic == 0 || st.DNSNXDomain != 6 || st.DNSRefused != 1 {
		t.Errorf("DNS stats: %+v", st)
	}
}

// Metrics: shared by boundaries, closed label sets, no principal and no
// destination ever a label.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	e1 := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.10"), func(c *Config) { c.Metrics = m })
	e2 := newEnv(t, "agent-b", netip.Addr{}, func(c *Config) { c.Metrics = m })
	e1.rawSOCKS(t, "mesh.sam.alt", 80)
	e1.rawSOCKS(t, "secret-destination.example", 80)
	e2.rawSOCKS(t, "mesh.sam.alt", 80)
	e2.rawSOCKS(t, "present.mcp.sam.alt", 80)
	dnsQuery(t, "udp", "127.77.0.10:53", "mesh.sam.alt.", dns.TypeA)
	dnsQuery(t, "udp", "127.77.0.10:53", "nope.example.", dns.TypeA)
	testenv.WaitFor(t, 10*time.Second, "no active flow on either boundary", func() bool { return e1.b.Stats().Active == 0 && e2.b.Stats().Active == 0 })
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"route": true, "outcome": true, "answer": true, "class": true}
	values := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range mt.GetLabel() {
				if !allowed[lp.GetName()] {
					t.Errorf("%s has label %s", mf.GetName(), lp.GetName())
				}
				if strings.Contains(lp.GetValue(), ".") {
					t.Errorf("%s has a name as a label value: %s", mf.GetName(), lp.GetValue())
				}
				key += "{" + lp.GetName() + "=" + lp.GetValue() + "}"
			}
			values[key] = metricValue(mt)
		}
	}
	for k, want := range map[string]float64{
		"sam_box_flows_total{outcome=allowed}{route=mesh}":              2,
		"sam_box_flows_total{outcome=denied}{route=external}":           1,
		"sam_box_flows_total{outcome=denied}{route=service}":            1,
		"sam_box_refusals_total":                                        2,
		"sam_box_active_flows":                                          0,
		"sam_box_dns_queries_total{answer=synthetic}":                   1,
		"sam_box_dns_queries_total{answer=nxdomain}":                    1,
		"sam_box_admission_seconds":                                     4,
		"sam_box_flows_total{outcome=error}{route=transparent_unknown}": 0,
	} {
		if v, ok := values[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// Start says which listener failed, and leaves nothing behind.
func TestStartErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.77.0.11:53")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sock := t.TempDir() + "/a.sock"
	// A listen address with no peer (the only source it would serve) is
	// refused outright.
	if _, err := New(Config{Principal: "p", SocketPath: sock, ListenAddr: netip.MustParseAddr("127.77.0.11")}); err == nil || !strings.Contains(err.Error(), "Peer") {
		t.Fatalf("a listen address without a peer: %v", err)
	}
	b, err := New(Config{Principal: "p", SocketPath: sock, ListenAddr: netip.MustParseAddr("127.77.0.11"), Peer: netip.MustParseAddr("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start()
	if err == nil || !strings.Contains(err.Error(), "DNS listener (TCP)") {
		t.Fatalf("Start: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	if c, err := net.Dial("tcp", "127.77.0.11:1080"); err == nil {
		c.Close()
		t.Error("proxy listener left open")
	}
	file := t.TempDir() + "/not-a-socket"
	os.WriteFile(file, []byte("x"), 0o600)
	b2, _ := New(Config{Principal: "p", SocketPath: file})
	if err := b2.Start(); err == nil || !strings.Contains(err.Error(), "socket listener") {
		t.Errorf("Start over a file: %v", err)
	}
	for _, p := range []string{"", "a b", "a\nX-Sam-Principal: root", strings.Repeat("a", 257)} {
		if _, err := New(Config{Principal: p}); err == nil {
			t.Errorf("principal %q accepted", p)
		}
	}
	if _, err := New(Config{Principal: "p", Synthetic: netip.MustParsePrefix("fd00::/64")}); err == nil {
		t.Error("IPv6 pool accepted")
	}
	// Close removes the socket.
	b3, _ := New(Config{Principal: "p", SocketPath: sock})
	if err := b3.Start(); err != nil {
		t.Fatal(err)
	}
	b3.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket not removed: %v", err)
	}
}

// Silence the unused import when building without TLS cases.
var _ = tls.VersionTLS12
