package master

import (
	"encoding/json"
	"net/http"
	"testing"

	"sandstorm/api"
)

// TestPauseResume: /v1's pause is E2B's: the sandbox is paused (shown so)
// in the snapshot tier, or with memory false the detached tier, until a
// resume; a second pause is a conflict; a resume brings it back hot.
func TestPauseResume(t *testing.T) {
	n := newFakeNode()
	srv, _ := newAPI(t, n)
	if r := do(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "p"}`); r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	sbOf := func(r answer) api.Sandbox {
		var sb api.Sandbox
		json.Unmarshal([]byte(r.body), &sb)
		return sb
	}
	r := do(t, srv, "POST", "/v1/sandboxes/p/pause", "")
	if sb := sbOf(r); r.status != http.StatusOK || !sb.Paused || sb.Tier != api.TierSnapshot {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	if sb := sbOf(do(t, srv, "GET", "/v1/sandboxes/p", "")); !sb.Paused {
		t.Errorf("GET after pause: %+v", sb)
	}
	if r := do(t, srv, "POST", "/v1/sandboxes/p/pause", ""); r.status != http.StatusConflict {
		t.Errorf("a second pause: %d", r.status)
	}
	r = do(t, srv, "POST", "/v1/sandboxes/p/resume", "")
	if sb := sbOf(r); r.status != http.StatusOK || sb.Paused || sb.Tier != api.TierHot {
		t.Errorf("resume: %d %s", r.status, r.body)
	}
	r = do(t, srv, "POST", "/v1/sandboxes/p/pause", `{"memory": false}`)
	if sb := sbOf(r); r.status != http.StatusOK || sb.Tier != api.TierDetached {
		t.Errorf("pause without memory: %d %s", r.status, r.body)
	}
	if r := do(t, srv, "POST", "/v1/sandboxes/nope/pause", ""); r.status != http.StatusNotFound {
		t.Errorf("pause of a missing sandbox: %d", r.status)
	}
}
