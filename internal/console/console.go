// Package console is the master's web console at / (Sandstorm seed: "where
// every sandbox is, how fast they move between tiers, and each node's
// headroom"): one page of plain HTML, CSS and JavaScript embedded in the
// binary (no build step), reading the same API a client does — with a
// session cookie instead of the token (session.go) — and a stream of
// server-sent events for what happens live (internal/events).
package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"io/fs"
	"net/http"
	"time"

	"sandstorm/api"
	"sandstorm/internal/events"
)

//go:embed static
var static embed.FS

// Console serves the page, its login and its event stream.
type Console struct {
	Sessions *Sessions
	Events   *events.Hub
	// KeepAlive is how often an idle event stream gets a comment line (so
	// proxies and the browser see it is alive); 0 is 15 s.
	KeepAlive time.Duration
	// TokenFile is where this master's API token is, which the login
	// names ("": the default data dir's).
	TokenFile string
}

// defaultTokenFile is the token file the page names unless told another.
const defaultTokenFile = "/var/lib/sandstorm/pki/api-token"

// Page serves GET / and GET /console/<file>: the page and its assets. They
// hold nothing secret; everything shown comes from the API.
func (c *Console) Page() http.Handler {
	sub, _ := fs.Sub(static, "static")
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		PageHeaders(w.Header())
		if r.URL.Path == "/" {
			w.Header().Set("Cache-Control", "no-store")
			// The login names this master's token file: a fleet's master
			// keeps it elsewhere than the default (a newcomer pasted the
			// default one's token into a fleet's console).
			page, err := fs.ReadFile(sub, "index.html")
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if c.TokenFile != "" {
				page = bytes.ReplaceAll(page, []byte(defaultTokenFile), []byte(html.EscapeString(c.TokenFile)))
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Write(page)
			return
		}
		http.StripPrefix("/console", files).ServeHTTP(w, r)
	})
}

// EventSeqHeader is set on GET /v1/sandboxes to the last event number
// published before the list was read: the list reflects every event up to
// it, and a watcher applies later ones on top.
const EventSeqHeader = "X-Sandstorm-Event-Seq"

// TokenAt is where the console's login token is kept, for a person who
// pasted the wrong one.
func (c *Console) TokenAt() string {
	if c.TokenFile == "" {
		return "<data-dir>/pki/api-token"
	}
	return c.TokenFile
}

// Stream serves GET /v1/events: the kept recent events, then each new one,
// as server-sent events ("event: <kind>", "data: <JSON>"; the HTML
// Living Standard §9.2), until the client goes away. Events a client was
// too slow for are lost to it (the hub never waits); the page reloads the
// whole list now and then, so what it shows catches up.
func (c *Console) Stream(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeErr(w, http.StatusInternalServerError, api.CodeInternal, "streaming unsupported")
		return
	}
	past, live, cancel := c.Events.Subscribe(256)
	defer cancel()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	send := func(e events.Event) error {
		b, _ := json.Marshal(e)
		_, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Kind, b)
		return err
	}
	for _, e := range past {
		if send(e) != nil {
			return
		}
	}
	fl.Flush()
	ka := c.KeepAlive
	if ka <= 0 {
		ka = 15 * time.Second
	}
	tick := time.NewTicker(ka)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case e := <-live:
			if send(e) != nil {
				return
			}
			// Whatever else is queued goes in the same write.
			for n := len(live); n > 0; n-- {
				if send(<-live) != nil {
					return
				}
			}
			fl.Flush()
		case <-tick.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.Error{Code: code, Message: msg})
}

// PageHeaders are the headers of every page of a console (this one and
// the mesh's): it runs no script from elsewhere, is framed by no one,
// is not sniffed into another type and tells no one where it was.
func PageHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}
