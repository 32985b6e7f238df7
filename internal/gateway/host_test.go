package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseHost(t *testing.T) {
	for _, c := range []struct {
		host string
		port int
		ref  string
		ok   bool
	}{
		{"8000-web1.sandbox.localhost", 8000, "web1", true},
		{"8000-web1.sandbox.localhost:8090", 8000, "web1", true},
		{"8000-WEB-1.Sandbox.Localhost.", 8000, "web-1", true},
		{"8000-3f2a9c81d00e.sandbox.localhost", 8000, "3f2a9c81d00e", true},
		{"web1.sandbox.localhost", 0, "", false},       // no port
		{"08000-web1.sandbox.localhost", 0, "", false}, // not canonical
		{"70000-web1.sandbox.localhost", 0, "", false}, // out of range
		{"8000-.sandbox.localhost", 0, "", false},      // no sandbox
		{"8000-a.b.sandbox.localhost", 0, "", false},   // two labels
		{"8000-web1.sandbox.localhost.evil", 0, "", false},
		{"8000-web1.other.localhost", 0, "", false},
		{"sandbox.localhost", 0, "", false},
		{"", 0, "", false},
	} {
		port, ref, ok := ParseHost(c.host, "sandbox.localhost")
		if port != c.port || ref != c.ref || ok != c.ok {
			t.Errorf("ParseHost(%q) = %d, %q, %v; want %d, %q, %v", c.host, port, ref, ok, c.port, c.ref, c.ok)
		}
	}
}

// TestHostRouting: one listener reaches a sandbox's port by Host, wakes it
// like any other connection, refuses a Host it does not know with 404,
// and a request for another sandbox on the same connection with 421.
func TestHostRouting(t *testing.T) {
	h, _ := counter()
	up := newUpstream(t, h, 0)
	w := &fakeWaker{}
	g, _ := newGateway(t, w, up.addr, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go g.ServeHosts(ln, "sandbox.localhost", func(ref string) (string, bool) { return "sb", ref == "one" })
	port := up.addr.Port()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	get := func(host string) *http.Response {
		t.Helper()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET with Host %s: %v", host, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Status += " " + strings.TrimSpace(string(b))
		return resp
	}
	host := itoaPort(port) + "-one.sandbox.localhost"
	for i := 1; i <= 2; i++ {
		if r := get(host); r.StatusCode != 200 || !strings.Contains(r.Status, "count=") {
			t.Fatalf("request %d by Host: %s", i, r.Status)
		}
	}
	if w.wakeCount() != 1 {
		t.Errorf("%d wakes, want 1", w.wakeCount())
	}
	if r := get(itoaPort(port) + "-two.sandbox.localhost"); r.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("another sandbox on the same connection: %s, want 421", r.Status)
	}

	for _, host := range []string{"1-one.sandbox.localhost", itoaPort(port) + "-nobody.sandbox.localhost", "example.com"} {
		c2, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c2.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c2, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		r, err := http.ReadResponse(bufio.NewReader(c2), nil)
		c2.Close()
		if err != nil || r.StatusCode != http.StatusNotFound {
			t.Errorf("Host %s: %v %v, want 404", host, r, err)
		}
	}
}

func itoaPort(p uint16) string { return strconv.Itoa(int(p)) }
