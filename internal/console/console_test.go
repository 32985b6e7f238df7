package console

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/events"
)

// TestStream: a watcher gets the kept events first, then each new one, as
// server-sent events with the kind as the event name and the sequence as
// the id; it ends when the watcher goes away.
func TestStream(t *testing.T) {
	hub := events.New(10)
	hub.Publish(events.Event{Kind: events.Transition, ID: "a", From: "hot", To: "frozen", Ms: 7.5})
	c := &Console{Sessions: NewSessions("tok"), Events: hub, KeepAlive: time.Hour}
	srv := httptest.NewServer(http.HandlerFunc(c.Stream))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	r := bufio.NewReader(resp.Body)
	read := func() string {
		var b strings.Builder
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("stream ended: %v (so far %q)", err, b.String())
			}
			if line == "\n" {
				return b.String()
			}
			b.WriteString(line)
		}
	}
	if got := read(); !strings.Contains(got, "id: 1\nevent: transition\ndata: {") || !strings.Contains(got, `"to":"frozen"`) {
		t.Errorf("first event %q", got)
	}
	hub.Publish(events.Event{Kind: events.Wake, ID: "a", From: "frozen", To: "hot", Ms: 9})
	if got := read(); !strings.Contains(got, "event: wake") || !strings.Contains(got, `"ms":9`) {
		t.Errorf("live event %q", got)
	}
}

// TestPageHeaders: the page is served with a policy that runs only its own
// scripts and lets no one frame it, and is never cached.
func TestPageHeaders(t *testing.T) {
	c := &Console{Sessions: NewSessions("tok"), Events: events.New(0)}
	for _, path := range []string{"/", "/console/console.js"} {
		w := httptest.NewRecorder()
		c.Page().ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != 200 {
			t.Fatalf("%s: %d", path, w.Code)
		}
		if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
	}
	w := httptest.NewRecorder()
	c.Page().ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if !strings.Contains(w.Body.String(), "<title>Sandstorm console</title>") || w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("index: %q cache %q", w.Body.String()[:80], w.Header().Get("Cache-Control"))
	}
}

// TestPageNamesThisMastersTokenFile: the login names where this master's
// token is (a fleet's master keeps it elsewhere than the default), HTML-
// escaped, and so does a wrong token's answer.
func TestPageNamesThisMastersTokenFile(t *testing.T) {
	c := &Console{Sessions: NewSessions("tok"), Events: events.New(0), TokenFile: "/var/lib/fleet <m>/pki/api-token"}
	rec := httptest.NewRecorder()
	c.Page().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	body := rec.Body.String()
	if !strings.Contains(body, "/var/lib/fleet &lt;m&gt;/pki/api-token") || strings.Contains(body, defaultTokenFile) {
		t.Errorf("the login does not name this master's token file:\n%s", body)
	}
	rec = httptest.NewRecorder()
	c.Sessions.ServeLogin(c.TokenAt())(rec, httptest.NewRequest("POST", "/v1/session", strings.NewReader(`{"token":"nope"}`)))
	if rec.Code != 401 || !strings.Contains(rec.Body.String(), `/var/lib/fleet \u003cm\u003e/pki/api-token`) {
		t.Errorf("a wrong token: %d %s", rec.Code, rec.Body.String())
	}
}
