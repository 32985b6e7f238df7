package templates

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/dialguard"
)

// A team's pull reaches a configured mirror, and nothing else that the
// dial guard refuses: not a loopback registry it names, and not one a
// public registry redirects it to.
func TestTeamTransport(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "http://localhost:"+r.URL.Port()+"/v2/", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)

	get := func(tr http.RoundTripper, target string) error {
		resp, err := (&http.Client{Transport: tr}).Get(target)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	// Configured as a mirror: reached.
	tr := newTeamTransport(nil, map[string]string{"docker.io": u.Host}, nil)
	if err := get(tr, srv.URL+"/v2/"); err != nil {
		t.Fatalf("a configured mirror refused: %v", err)
	}
	// Not a mirror: the same loopback registry is refused, before a
	// byte reaches it.
	before := hits
	tr = newTeamTransport(nil, map[string]string{"docker.io": "mirror.example:5000"}, nil)
	err := get(tr, srv.URL+"/v2/")
	var ref *dialguard.Refusal
	if !errors.As(err, &ref) || ref.Class != dialguard.Loopback || !errors.Is(err, errdefs.ErrForbidden) || !strings.Contains(err.Error(), "--registry-mirror") {
		t.Fatalf("a loopback registry a team named: err %v, want a forbidden loopback refusal saying what to do", err)
	}
	if hits != before {
		t.Fatalf("the refused registry was reached %d times", hits-before)
	}
	// A mirror that redirects elsewhere: the redirect's target is a
	// request of its own, judged again (localhost is not the mirror's
	// spelling, so it goes through the guard).
	tr = newTeamTransport(nil, map[string]string{"docker.io": u.Host}, nil)
	err = get(tr, srv.URL+"/redirect")
	if !errors.As(err, &ref) {
		t.Fatalf("a redirect to loopback: err %v, want a refusal", err)
	}
}
