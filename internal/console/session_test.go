package console

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestSessions: only the API token starts a session; its cookie is
// HttpOnly and SameSite=Strict; it authorises GETs only, until it expires
// or is logged out.
func TestSessions(t *testing.T) {
	s := NewSessions("tok")
	now := time.Unix(1e9, 0)
	s.now = func() time.Time { return now }
	w := httptest.NewRecorder()
	if s.Login(w, httptest.NewRequest("POST", "/v1/session", nil), "wrong") {
		t.Fatal("a wrong token logged in")
	}
	if len(w.Result().Cookies()) != 0 {
		t.Fatal("a wrong token got a cookie")
	}
	w = httptest.NewRecorder()
	if !s.Login(w, httptest.NewRequest("POST", "/v1/session", nil), "tok") {
		t.Fatal("the token did not log in")
	}
	cs := w.Result().Cookies()
	if len(cs) != 1 || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Value == "tok" {
		t.Fatalf("cookie %+v", cs)
	}
	req := func(method string) *http.Request {
		r := httptest.NewRequest(method, "/v1/sandboxes", nil)
		r.AddCookie(cs[0])
		return r
	}
	if !s.Reads(req("GET")) {
		t.Error("a live session cannot GET")
	}
	for _, m := range []string{"POST", "DELETE", "PUT"} {
		if s.Reads(req(m)) || !s.Live(req(m)) {
			t.Errorf("a session may %s, or its %s is not known as one", m, m)
		}
	}
	forged := httptest.NewRequest("GET", "/", nil)
	forged.AddCookie(&http.Cookie{Name: CookieName, Value: "00"})
	if s.Reads(forged) || s.Live(forged) {
		t.Error("a made-up session reads, or is live")
	}
	now = now.Add(SessionTTL + time.Second)
	if s.Reads(req("GET")) {
		t.Error("an expired session reads")
	}
	now = now.Add(-SessionTTL)
	s.Logout(httptest.NewRecorder(), req("GET"))
	if s.Reads(req("GET")) {
		t.Error("a logged-out session reads")
	}
}
