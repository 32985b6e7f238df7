package master

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/apikey"
)

// TestTeamsSeeOnlyTheirOwn: a team's key makes and sees its own
// sandboxes; another team's answer 404 on every route — get, delete, a
// transition, logs, commands and files — exactly as a missing one; the
// operator sees all; what is the operator's alone is 403 to a key; a
// malformed, unknown or revoked key is 401.
func TestTeamsSeeOnlyTheirOwn(t *testing.T) {
	srv, st := newAPI(t, newFakeNode())
	ctx := context.Background()
	keyA, rowA := apikey.New("red", time.Now())
	keyB, rowB := apikey.New("blue", time.Now())
	st.Teams().PutAPIKey(ctx, rowA)
	st.Teams().PutAPIKey(ctx, rowB)
	a, b := "Bearer "+keyA, "Bearer "+keyB

	if r := doAs(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "mine"}`, a); r.status != http.StatusCreated {
		t.Fatalf("create with a team key: %d %s", r.status, r.body)
	}
	if r := doAs(t, srv, "GET", "/v1/sandboxes/mine", "", a); r.status != http.StatusOK {
		t.Errorf("the owner's get: %d %s", r.status, r.body)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/mine"},
		{"DELETE", "/v1/sandboxes/mine"},
		{"POST", "/v1/sandboxes/mine/freeze"},
		{"GET", "/v1/sandboxes/mine/logs"},
		{"POST", "/v1/sandboxes/mine/envd/process.Process/List"},
		{"GET", "/v1/sandboxes/mine/envd/files?path=/etc/passwd"},
	} {
		r := doAs(t, srv, c.method, c.path, "{}", b)
		if r.status != http.StatusNotFound || !strings.Contains(r.err.Message, "not found") {
			t.Errorf("another team's %s %s: %d %s, want 404 as for a missing one", c.method, c.path, r.status, r.body)
		}
		if missing := doAs(t, srv, c.method, strings.Replace(c.path, "mine", "nosuch", 1), "{}", b); missing.status != r.status {
			t.Errorf("%s %s: another team's %d, a missing one's %d: they must not differ", c.method, c.path, r.status, missing.status)
		}
	}
	if r := doAs(t, srv, "GET", "/v1/sandboxes", "", b); strings.Contains(r.body, "mine") {
		t.Errorf("another team's list shows it: %s", r.body)
	}
	if r := doAs(t, srv, "GET", "/v1/sandboxes", "", a); !strings.Contains(r.body, `"mine"`) {
		t.Errorf("the owner's list lacks it: %s", r.body)
	}
	if r := do(t, srv, "GET", "/v1/sandboxes/mine", ""); r.status != http.StatusOK {
		t.Errorf("the operator's get: %d", r.status)
	}
	// X-API-KEY, as the E2B SDK sends it, is the same key.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/mine", nil)
	req.Header.Set("X-API-KEY", keyA)
	if resp, err := srv.Client().Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("X-API-KEY: %v %v", resp, err)
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/templates", `{}`},
		{"DELETE", "/v1/templates/web", ""},
		{"GET", "/v1/nodes", ""},
		{"POST", "/v1/api-keys", `{"team": "red"}`},
		{"GET", "/v1/api-keys", ""},
		{"POST", "/v1/sandboxes/mine/move", `{}`},
	} {
		if r := doAs(t, srv, c.method, c.path, c.body, a); r.status != http.StatusForbidden {
			t.Errorf("a team key's %s %s: %d, want 403", c.method, c.path, r.status)
		}
	}
	if r := doAs(t, srv, "GET", "/v1/templates", "", a); r.status != http.StatusOK {
		t.Errorf("a team key lists the templates it may use: %d", r.status)
	}
	for what, auth := range map[string]string{
		"malformed": "Bearer e2b_xyz",
		"unknown":   "Bearer e2b_" + strings.Repeat("0", 40),
	} {
		if r := doAs(t, srv, "GET", "/v1/sandboxes", "", auth); r.status != http.StatusUnauthorized {
			t.Errorf("a %s key: %d, want 401", what, r.status)
		}
	}
	st.Teams().DeleteAPIKey(ctx, rowA.ID)
	if r := doAs(t, srv, "GET", "/v1/sandboxes/mine", "", a); r.status != http.StatusUnauthorized || !strings.Contains(r.err.Message, "revoked") {
		t.Errorf("a revoked key: %d %s", r.status, r.body)
	}
}

// TestAPIKeysRoutes: the operator makes a key (shown once), lists keys
// (never shown) and revokes one.
func TestAPIKeysRoutes(t *testing.T) {
	srv, _ := newAPI(t, newFakeNode())
	r := do(t, srv, "POST", "/v1/api-keys", `{"team": "red"}`)
	if r.status != http.StatusCreated || !strings.Contains(r.body, `"key": "e2b_`) {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	key := r.body[strings.Index(r.body, "e2b_") : strings.Index(r.body, "e2b_")+44]
	if !apikey.Valid(key) {
		t.Fatalf("key %q is not E2B's shape", key)
	}
	l := do(t, srv, "GET", "/v1/api-keys", "")
	if strings.Contains(l.body, key) || !strings.Contains(l.body, key[40:]) {
		t.Errorf("list shows the key, or not its last four: %s", l.body)
	}
	if r := do(t, srv, "POST", "/v1/api-keys", `{"team": "Bad Team!"}`); r.status != http.StatusBadRequest {
		t.Errorf("a bad team name: %d", r.status)
	}
	id := l.body[strings.Index(l.body, "key-") : strings.Index(l.body, "key-")+12]
	if r := do(t, srv, "DELETE", "/v1/api-keys/"+id, ""); r.status != http.StatusNoContent {
		t.Errorf("revoke: %d %s", r.status, r.body)
	}
	if r := do(t, srv, "DELETE", "/v1/api-keys/"+id, ""); r.status != http.StatusNotFound {
		t.Errorf("revoke twice: %d", r.status)
	}
}

// TestCreateSettings: labels, env and a lifetime given at create are kept,
// shown with the sandbox and filtered by; bad ones are refused before
// anything is made.
func TestCreateSettings(t *testing.T) {
	n := newFakeNode()
	srv, st := newAPI(t, n)
	r := do(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "a", "labels": {"app": "x", "tier": "1"}, "env": {"K": "V"}, "lifetime": "90s", "on_timeout": "snapshot"}`)
	if r.status != http.StatusCreated || !strings.Contains(r.body, `"app": "x"`) || !strings.Contains(r.body, `"on_timeout": "snapshot"`) || !strings.Contains(r.body, `"ends_at"`) {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	do(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "b", "labels": {"app": "y"}}`)
	m, _ := st.Teams().GetSandboxMeta(context.Background(), "id-a")
	if m.Env["K"] != "V" || !m.AutoPause || time.Until(m.EndAt) < 80*time.Second {
		t.Errorf("kept %+v", m)
	}
	for q, want := range map[string]string{"label=app=x": `"a"`, "label=app=y": `"b"`, "label=app=x&label=tier=1": `"a"`} {
		l := do(t, srv, "GET", "/v1/sandboxes?"+q, "")
		if !strings.Contains(l.body, `"name": `+want) || strings.Count(l.body, `"name":`) != 1 {
			t.Errorf("?%s: %s, want only %s", q, l.body, want)
		}
	}
	if l := do(t, srv, "GET", "/v1/sandboxes?label=nokey", ""); l.status != http.StatusBadRequest {
		t.Errorf("a label filter without '=': %d", l.status)
	}
	before := len(n.Calls)
	for _, bad := range []string{
		`{"template": "web", "lifetime": "soon"}`,
		`{"template": "web", "lifetime": "-1s"}`,
		`{"template": "web", "on_timeout": "snapshot"}`,
		`{"template": "web", "lifetime": "1m", "on_timeout": "explode"}`,
		`{"template": "web", "env": {"A=B": "c"}}`,
		`{"template": "web", "labels": {"": "c"}}`,
		`{"template": "web", "idle": {"freeze_after": "soon"}}`,
		`{"template": "web", "idle": {"detach_after": "-5m"}}`,
		// allow_out alone makes exceptions to nothing (the CLI refuses it too).
		`{"template": "web", "egress": {"allow_out": ["api.example.com"]}}`,
		`{"template": "web", "egress": {"allow_out": ["http://api.example.com"], "deny_out": ["0.0.0.0/0"]}}`,
		`{"template": "web", "egress": {"deny_out": ["10.0.0.0/33"]}}`,
	} {
		if r := do(t, srv, "POST", "/v1/sandboxes", bad); r.status != http.StatusBadRequest || strings.Contains(r.body, "netip") || strings.Contains(r.body, "denyOut") {
			t.Errorf("create %s: %d %s, want 400 in the API's terms", bad, r.status, r.body)
		}
	}
	if r := do(t, srv, "PUT", "/v1/sandboxes/a/network", `{"allow_out": ["api.example.com"]}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, "does nothing alone") {
		t.Errorf("PUT network with allow_out alone: %d %s, want 400 saying why", r.status, r.body)
	}
	if len(n.Calls) != before {
		t.Errorf("a refused create or update reached the node: %v", n.Calls[before:])
	}
}

// TestTeamsCannotChoosePrincipals: a principal is what the policy grants
// to, so a team names none — its named sandbox is <team>.<name> — and its
// clones stay its own.
func TestTeamsCannotChoosePrincipals(t *testing.T) {
	n := newFakeNode()
	srv, st := newAPI(t, n)
	key, row := apikey.New("red", time.Now())
	st.Teams().PutAPIKey(context.Background(), row)
	a := "Bearer " + key
	if r := doAs(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "x", "principal": "admin"}`, a); r.status != http.StatusForbidden {
		t.Errorf("a team naming a principal: %d, want 403", r.status)
	}
	if r := doAs(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "admin"}`, a); r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if got := n.CallLog(); got[len(got)-1] != "create admin" {
		t.Fatalf("calls %v", got)
	}
	if p := n.Boxes["id-admin"].Principal; p != "red.admin" {
		t.Errorf("the team's sandbox named admin has principal %q", p)
	}
	if r := doAs(t, srv, "POST", "/v1/sandboxes/admin/clone", `{"count": 1, "principal": "admin"}`, a); r.status != http.StatusForbidden {
		t.Errorf("a team naming a clone's principal: %d, want 403", r.status)
	}
}
