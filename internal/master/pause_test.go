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

// TestSnapshotsOnV1: a snapshot is taken, listed (of a sandbox, by
// name), started from (a sandbox of its own, with the snapshot's memory:
// a clone of it) and deleted on /v1 as on /e2b.
func TestSnapshotsOnV1(t *testing.T) {
	n := newFakeNode()
	srv, _ := newAPI(t, n)
	if r := do(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "src"}`); r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r := do(t, srv, "POST", "/v1/sandboxes/src/snapshots", `{"name": "v1"}`)
	var snap api.Snapshot
	if json.Unmarshal([]byte(r.body), &snap); r.status != http.StatusCreated || snap.ID == "" || snap.Name != "v1" || snap.Of == "" {
		t.Fatalf("take: %d %s", r.status, r.body)
	}
	var l api.List[api.Snapshot]
	json.Unmarshal([]byte(do(t, srv, "GET", "/v1/snapshots?name=v1", "").body), &l)
	if len(l.Items) != 1 || l.Items[0].ID != snap.ID {
		t.Errorf("list by name: %+v", l.Items)
	}
	r = do(t, srv, "POST", "/v1/snapshots/"+snap.ID+"/sandboxes", `{"labels": {"k": "v"}}`)
	var sb api.Sandbox
	if json.Unmarshal([]byte(r.body), &sb); r.status != http.StatusCreated || sb.ID == "" || sb.ID == snap.ID || sb.Labels["k"] != "v" {
		t.Errorf("start from it: %d %s", r.status, r.body)
	}
	if r := do(t, srv, "POST", "/v1/snapshots/src/sandboxes", ``); r.status != http.StatusNotFound {
		t.Errorf("a sandbox as a snapshot: %d", r.status)
	}
	if r := do(t, srv, "DELETE", "/v1/snapshots/"+snap.ID, ""); r.status != http.StatusNoContent {
		t.Errorf("delete: %d %s", r.status, r.body)
	}
	json.Unmarshal([]byte(do(t, srv, "GET", "/v1/snapshots", "").body), &l)
	if len(l.Items) != 0 {
		t.Errorf("after delete: %+v", l.Items)
	}
}
