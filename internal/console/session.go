package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
)

// The console's login: a person pastes the API token once, and the master
// answers with a session cookie that is HttpOnly (no script on the page
// can read it, so the page never holds the token or the session),
// SameSite=Strict (no other site's page can send it) and Secure when the
// API is HTTPS. A session authorises reads only (GET): the console shows,
// it does not act, so a stolen session cannot change anything.

// CookieName is the console's session cookie.
const CookieName = "sandstorm_session"

// SessionTTL is how long a console session lasts.
const SessionTTL = 12 * time.Hour

// Sessions are the console's logins, in memory (a restarted master asks
// for the token again).
type Sessions struct {
	token  []byte
	cookie string // its cookie's name
	mu     sync.Mutex
	ids    map[string]time.Time // session → expiry
	now    func() time.Time
}

// NewSessions makes the logins of a master whose API token is token.
func NewSessions(token string) *Sessions { return NewSessionsCookie(token, CookieName) }

// NewSessionsCookie is NewSessions with its own cookie name: a browser
// keeps cookies by host, not by port (RFC 6265 §8.5), so two consoles on
// one machine (the master's and sam-one's, on a laptop) must not share a
// name, or logging in to one logs out of the other.
func NewSessionsCookie(token, cookie string) *Sessions {
	return &Sessions{token: []byte(token), cookie: cookie, ids: map[string]time.Time{}, now: time.Now}
}

// Login checks token and, if it is the API token, starts a session and
// sets its cookie on w. It reports whether it did.
func (s *Sessions) Login(w http.ResponseWriter, r *http.Request, token string) bool {
	if subtle.ConstantTimeCompare([]byte(token), s.token) != 1 {
		return false
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return false
	}
	id := hex.EncodeToString(b[:])
	now := s.now()
	s.mu.Lock()
	for k, exp := range s.ids { // forget expired ones as new ones come
		if now.After(exp) {
			delete(s.ids, k)
		}
	}
	s.ids[id] = now.Add(SessionTTL)
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: s.cookie, Value: id, Path: "/", MaxAge: int(SessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	return true
}

// Logout ends the session r carries and clears its cookie.
func (s *Sessions) Logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(s.cookie); err == nil {
		s.mu.Lock()
		delete(s.ids, c.Value)
		s.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: s.cookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// Reads reports whether r may read with its session: a GET (or HEAD)
// carrying a live session cookie.
func (s *Sessions) Reads(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && s.Live(r)
}

// Live reports whether r carries a live session, whatever its method:
// the API tells such a caller that a session only reads, rather than
// that it sent no token.
func (s *Sessions) Live(r *http.Request) bool {
	c, err := r.Cookie(s.cookie)
	if err != nil {
		return false
	}
	s.mu.Lock()
	exp, ok := s.ids[c.Value]
	s.mu.Unlock()
	return ok && s.now().Before(exp)
}

// maxLogin bounds POST /v1/session's body.
const maxLogin = 4 << 10

// ServeLogin is POST /v1/session {"token": "..."} on both consoles (the
// master's and the mesh's): 204 with the session cookie, or 401 naming
// where the token is kept (tokenAt), so the person knows what to paste.
func (s *Sessions) ServeLogin(tokenAt string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Token string `json:"token"`
		}
		if err := httpjson.Decode(w, r, &req, maxLogin); err != nil {
			errdefs.WriteHTTP(w, err)
			return
		}
		if !s.Login(w, r, req.Token) {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "wrong token: paste the one in %s", tokenAt))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// ServeLogout is DELETE /v1/session: 204, the session ended.
func (s *Sessions) ServeLogout(w http.ResponseWriter, r *http.Request) {
	s.Logout(w, r)
	w.WriteHeader(http.StatusNoContent)
}
