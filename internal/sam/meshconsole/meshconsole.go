// Package meshconsole is sam-one's web console (issue 17, item 7): who
// is in the mesh (members, their credentials' expiry, revoked or not,
// connected to the router now or not), the principals of the policy in
// force and what each may use, and the recent refusals with their
// reasons: the control plane's and the router's (Ring), and those the
// members report of their agents — by their boundaries and sam-nodes,
// with principal, target, reason and count (Agents; internal/sam/refusals).
//
// It follows the master's console (internal/console): one page of plain
// HTML, CSS and JavaScript embedded in the binary (no build step); the
// operator pastes the control plane's admin token once and gets an
// HttpOnly, Secure, SameSite=Strict session cookie (console.Sessions,
// reused) that may only read — GET /v1/console, which the page polls.
// Everything that changes the mesh stays behind the admin token itself:
// a stolen session shows the mesh, it cannot change it.
package meshconsole

import (
	"context"
	"embed"
	"io/fs"
	"net/http"
	"time"

	"sandstorm/api"
	"sandstorm/internal/console"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
)

//go:embed static
var static embed.FS

// CookieName is sam-one's session cookie: not the master console's
// (console.CookieName), since a laptop may run both on one host.
const CookieName = "sam_one_session"

// Console serves the page, its login and its one read.
type Console struct {
	// Sessions: console.NewSessionsCookie(admin token, CookieName).
	Sessions *console.Sessions
	// IsAdmin reports whether r carries the admin token (a script's read
	// of GET /v1/console, without a session).
	IsAdmin func(r *http.Request) bool
	// State is what GET /v1/console answers.
	State func(ctx context.Context) (api.MeshConsole, error)
	// TokenFile is where the admin token is, which the login names.
	TokenFile string
}

// Register adds the console's routes to mux: GET / and /console/<file>
// (the page, which holds nothing), POST and DELETE /v1/session, GET
// /v1/console.
func (c *Console) Register(mux *http.ServeMux) {
	mux.Handle("GET /{$}", c.page())
	mux.Handle("GET /console/", c.page())
	mux.HandleFunc("POST /v1/session", c.Sessions.ServeLogin(c.TokenFile))
	mux.HandleFunc("DELETE /v1/session", c.Sessions.ServeLogout)
	mux.HandleFunc("GET /v1/console", c.state)
}

func (c *Console) page() http.Handler {
	sub, _ := fs.Sub(static, "static")
	files := http.StripPrefix("/console", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		console.PageHeaders(w.Header())
		if r.URL.Path == "/" {
			w.Header().Set("Cache-Control", "no-store")
			// FileServer redirects .../index.html to ./; served directly.
			b, err := fs.ReadFile(sub, "index.html")
			if err != nil {
				errdefs.WriteHTTP(w, err)
				return
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Write(b)
			return
		}
		files.ServeHTTP(w, r)
	})
}

func (c *Console) state(w http.ResponseWriter, r *http.Request) {
	if !c.Sessions.Reads(r) && (c.IsAdmin == nil || !c.IsAdmin(r)) {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "log in to the console (POST /v1/session) or present the admin token"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	s, err := c.State(ctx)
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	httpjson.Write(w, http.StatusOK, s)
}
