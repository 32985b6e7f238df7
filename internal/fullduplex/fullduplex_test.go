package fullduplex

import (
	"bufio"
	"bytes"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestEarlyAnswer: a proxy forwarding full duplex to an upstream that
// answers before it reads a chunked body, while the client is still
// sending it. Without Guard the test process dies of the panic in the
// transport's goroutine.
func TestEarlyAnswer(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	var logs syncBuf
	px := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := Guard(w, r)
		defer body.Stop()
		p := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, Transport: &http.Transport{DisableKeepAlives: true}, FlushInterval: -1,
			ModifyResponse: body.Respond}
		p.ServeHTTP(w, r)
	}))
	px.Config.ErrorLog = log.New(&logs, "", 0)
	px.Start()
	defer px.Close()
	for i := 0; i < 20; i++ {
		pr, pw := io.Pipe()
		answered := make(chan struct{})
		go func() {
			pw.Write([]byte("abc"))
			<-answered // the rest of the body after the answer
			pw.Write([]byte("def"))
			pw.Close()
		}()
		req, _ := http.NewRequest("POST", px.URL, pr)
		resp, err := http.DefaultClient.Do(req)
		close(answered)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "ok" {
			t.Errorf("answer %q", b)
		}
		resp.Body.Close()
	}
	px.Close() // its handlers done, their transports' reads too
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("server log: %s", logs.String())
	}
}

// TestKeptAlive: a proxy's connection is kept between requests whose
// bodies it read whole or that had none, even when something in front
// wrapped the empty body (the ingress counts what it reads): closing it
// made every such call pay a new handshake.
func TestKeptAlive(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	px := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = io.NopCloser(r.Body) // as a wrapper in front would
		body := Guard(w, r)
		defer body.Stop()
		p := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, FlushInterval: -1, ModifyResponse: body.Respond}
		p.ServeHTTP(w, r)
	}))
	conns := 0
	px.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns++
		}
	}
	px.Start()
	defer px.Close()
	for _, c := range []struct{ method, body string }{{"GET", ""}, {"POST", ""}, {"POST", "abc"}, {"GET", ""}} {
		req, _ := http.NewRequest(c.method, px.URL, strings.NewReader(c.body))
		resp, err := px.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close {
			t.Errorf("%s with a body of %d bytes: the proxy closed its connection", c.method, len(c.body))
		}
	}
	if conns != 1 {
		t.Errorf("4 requests took %d connections, want 1", conns)
	}
}

// TestUnreadBodyThenNextRequest: the proxy fails before the transport
// reads the body (the upstream is gone) and the caller answers with an
// error; the client then sends its next request on the same connection.
// A full-duplex handler that returns with its body unread makes net/http
// read that body to its end after the handler (which starts a background
// read) and then read the next request over it: "invalid concurrent
// Body.Read call" (golang/go#68560), seen in a daemon's log when a
// sandbox was deleted under an envd call. The answer must close the
// connection instead, and the server log stay clean.
func TestUnreadBodyThenNextRequest(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	u, _ := url.Parse(dead.URL)
	dead.Close()
	var logs syncBuf
	px := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := Guard(w, r)
		var failed error
		p := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, FlushInterval: -1,
			ModifyResponse: body.Respond, ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) { failed = err }}
		p.ServeHTTP(w, r)
		body.Stop()
		if failed != nil {
			http.Error(w, failed.Error(), http.StatusBadGateway) // as a caller's error mapping does, after Stop
		}
	}))
	px.Config.ErrorLog = log.New(&logs, "", 0)
	px.Start()
	defer px.Close()
	for _, te := range []string{"", "chunked"} {
		c, err := net.Dial("tcp", px.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		req := "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
		if te != "" {
			req = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
		}
		io.WriteString(c, req)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s body: %v", te, err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusBadGateway || !resp.Close {
			t.Errorf("%s body: %s, close %v; want 502 and the connection closed", te, resp.Status, resp.Close)
		}
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := http.ReadResponse(br, nil); err == nil {
			t.Errorf("%s body: a second request was answered on a connection said closed", te)
		}
		c.Close()
	}
	px.Close()
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("server log: %s", logs.String())
	}
}
