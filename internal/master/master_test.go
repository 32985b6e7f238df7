package master

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/store"
)

// fakeNode is the master's own node, in memory (fleettest.Node).
type fakeNode = fleettest.Node

func newFakeNode() *fakeNode { return fleettest.NewNode() }

const token = "test-token"

// api is a master over node, with template "web" registered.
func newAPI(t *testing.T, n *fakeNode) (*httptest.Server, *store.Store) {
	t.Helper()
	e := fleettest.New(t, n)
	st := e.Store
	srv := httptest.NewServer(Handler(Config{Store: st, Fleet: e.Fleet, CA: e.CA, Token: token, DataDir: t.TempDir(), MaxUpload: 1 << 20, Log: e.Log}))
	t.Cleanup(srv.Close)
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "bin", "app"), []byte("#!/bin/sh\n"), 0o755)
	if r := do(t, srv, "POST", "/v1/templates", fmt.Sprintf(`{"name": "web", "rootfs_dir": %q, "process": {"args": ["/bin/app"]}, "ports": [8000]}`, rootfs)); r.status != http.StatusCreated {
		t.Fatalf("register web: %d %s", r.status, r.body)
	}
	return srv, st
}

type answer struct {
	status int
	header http.Header
	body   string
	err    api.Error
}

func do(t *testing.T, srv *httptest.Server, method, path, body string) answer {
	t.Helper()
	return doAs(t, srv, method, path, body, "Bearer "+token)
}

func doAs(t *testing.T, srv *httptest.Server, method, path, body, auth string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if resp.StatusCode >= 300 {
		if err := json.Unmarshal(b, &a.err); err != nil || a.err.Code == "" || a.err.Message == "" {
			t.Errorf("%s %s: HTTP %d is not {code, message} JSON: %q", method, path, resp.StatusCode, b)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: error as %q", method, path, ct)
		}
	}
	return a
}

// TestAuth: every route but the open ones needs the token: 401 with a
// WWW-Authenticate challenge (RFC 6750) and what to send, whatever the
// route; the right token gets through.
func TestAuth(t *testing.T) {
	srv, _ := newAPI(t, newFakeNode())
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes"}, {"POST", "/v1/sandboxes"}, {"GET", "/v1/sandboxes/x"}, {"DELETE", "/v1/sandboxes/x"},
		{"POST", "/v1/sandboxes/x/freeze"}, {"GET", "/v1/templates"}, {"POST", "/v1/templates"}, {"GET", "/v1/nodes"},
		{"POST", "/v1/nodes"}, {"DELETE", "/v1/nodes/n"}, {"POST", "/v1/nodes/join-tokens"}, {"GET", "/v1/node"}, {"GET", "/nowhere"},
	} {
		for _, auth := range []string{"", "Bearer wrong", "Basic " + token, token} {
			a := doAs(t, srv, r.method, r.path, "{}", auth)
			if a.status != http.StatusUnauthorized || a.err.Code != api.CodeUnauthorized || !strings.Contains(a.err.Message, "api-token") {
				t.Errorf("%s %s with %q: %d %+v", r.method, r.path, auth, a.status, a.err)
			}
			if !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s: no Bearer challenge", r.method, r.path)
			}
		}
	}
	if a := do(t, srv, "GET", "/v1/sandboxes", ""); a.status != http.StatusOK || strings.TrimSpace(a.body) != `{
  "items": []
}` {
		t.Errorf("an empty list with the token: %d %q (want items: [], not null)", a.status, a.body)
	}
	if a := doAs(t, srv, "GET", "/v1/ca", "", ""); a.status != http.StatusOK || !strings.Contains(a.body, "BEGIN CERTIFICATE") {
		t.Errorf("the CA is public: %d", a.status)
	}
}

// TestValidation: what the master refuses before any node is asked, each
// a 400 (or 413, or 404) that says what is wrong.
func TestValidation(t *testing.T) {
	n := newFakeNode()
	srv, _ := newAPI(t, n)
	for _, c := range []struct {
		method, path, body string
		status             int
		code, says         string
	}{
		{"POST", "/v1/sandboxes", `{"template": "web", "nme": "x"}`, 400, "bad_request", "unknown field"},
		{"POST", "/v1/sandboxes", `{"template": "web"`, 400, "bad_request", "malformed JSON"},
		{"POST", "/v1/sandboxes", `{"template": "web"} {"template": "web"}`, 400, "bad_request", "more than one value"},
		{"POST", "/v1/sandboxes", `{}`, 400, "bad_request", "template is required"},
		{"POST", "/v1/sandboxes", `{"template": "nope"}`, 404, "not_found", "nope"},
		{"POST", "/v1/sandboxes", `{"template": "web", "name": "` + strings.Repeat("a", 2<<20) + `"}`, 413, "too_large", ""},
		{"POST", "/v1/templates", `{"name": "Bad_Name", "rootfs_dir": "/", "process": {"args": ["/x"]}}`, 400, "bad_request", "template name"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": []}}`, 400, "bad_request", "process.args is empty"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["x"]}}`, 400, "bad_request", "absolute path"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"], "env": ["NOEQUALS"]}}`, 400, "bad_request", "KEY=VALUE"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"]}, "ports": [0]}`, 400, "bad_request", "outside 1-65535"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"]}, "ports": [80, 80]}`, 400, "bad_request", "listed twice"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"]}, "principal": "no spaces"}`, 400, "bad_request", "principal"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"]}, "memory_mib": -1}`, 400, "bad_request", "negative"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "relative", "process": {"args": ["/x"]}}`, 400, "bad_request", "absolute path"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/nonexistent-dir", "process": {"args": ["/x"]}}`, 400, "bad_request", "not a directory"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"]}, "ports": [80], "warm": {"probe": {"port": 80}}}`, 400, "bad_request", "reseed"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"]}, "ports": [80], "warm": {"pool": 99, "reseed": {"signal": "SIGUSR1"}}}`, 400, "bad_request", "warm.pool"},
		{"POST", "/v1/templates", `{"name": "t", "rootfs_dir": "/", "process": {"args": ["/x"]}, "ports": [80], "warm": {"reseed": {"signal": "SIGKILL"}}}`, 400, "bad_request", "SIGHUP, SIGUSR1, SIGUSR2"},
		{"POST", "/v1/templates", `{"name": "web", "rootfs_dir": "/", "process": {"args": ["/bin/sh"]}}`, 409, "exists", "web"},
		{"POST", "/v1/sandboxes/x/explode", ``, 404, "not_found", "no transition"},
		{"GET", "/v1/nowhere", ``, 404, "not_found", "no such endpoint"},
		{"POST", "/v1/nodes", `{"address": ""}`, 400, "bad_request", "pairing code"},
		{"DELETE", "/v1/nodes/local", ``, 409, "conflict", "own process"},
		{"DELETE", "/v1/nodes/ghost", ``, 404, "not_found", "ghost"},
	} {
		a := do(t, srv, c.method, c.path, c.body)
		if a.status != c.status || a.err.Code != c.code || !strings.Contains(a.err.Message, c.says) {
			t.Errorf("%s %s %.60s: %d %s %q, want %d %s saying %q", c.method, c.path, c.body, a.status, a.err.Code, a.err.Message, c.status, c.code, c.says)
		}
		if strings.HasPrefix(a.err.Message, "bad input") || strings.HasPrefix(a.err.Message, "not found: ") {
			t.Errorf("%s %s: the message repeats its code: %q", c.method, c.path, a.err.Message)
		}
	}
	for _, c := range n.Calls {
		if strings.HasPrefix(c, "create") {
			t.Errorf("a refused request reached the node: %v", n.Calls)
		}
	}
}

// TestNodeErrors: each kind of error a node answers is the status, code
// and Retry-After of errdefs.Table, its words kept, for a create, a
// transition and a delete alike (but a delete its node answers "not
// found" to, which is done: the node has it no more).
func TestNodeErrors(t *testing.T) {
	n := newFakeNode()
	srv, _ := newAPI(t, n)
	if a := do(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "one", "memory_mib": 64}`); a.status != http.StatusCreated {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	for _, c := range []struct {
		err    error
		status int
		code   string
		retry  string
	}{
		{errdefs.New(errdefs.ErrNoRoom, "node short on memory: 10 MiB over"), 503, "unavailable", "1"},
		{errdefs.NoRoom(errors.New("a wake slot frees in 5 s"), 5e9), 503, "unavailable", "5"},
		{errdefs.New(errdefs.ErrUnavailable, "node n1 was lost during the call"), 503, "node_down", "3"},
		{errdefs.New(errdefs.ErrConflict, "sandbox one is busy"), 409, "conflict", ""},
		{errdefs.New(errdefs.ErrNotSupported, "the process backend cannot checkpoint"), 409, "not_supported", ""},
		{errdefs.New(errdefs.ErrBadInput, "memory_mib -1 is negative"), 400, "bad_request", ""},
		{errors.New("the disk is on fire"), 500, "internal", ""},
		{errdefs.New(errdefs.ErrNotFound, "sandbox one: not found"), 404, "not_found", ""},
	} {
		n.Err = c.err
		for _, r := range []struct{ method, path, body string }{
			{"POST", "/v1/sandboxes", `{"template": "web"}`},
			{"POST", "/v1/sandboxes/one/freeze", ``},
			{"DELETE", "/v1/sandboxes/one", ``},
		} {
			if errors.Is(c.err, errdefs.ErrNotFound) && r.method == "DELETE" {
				continue // a delete its node has done already is done (fleet.Delete)
			}
			a := do(t, srv, r.method, r.path, r.body)
			if a.status != c.status || a.err.Code != c.code || a.header.Get("Retry-After") != c.retry {
				t.Errorf("%v on %s %s: %d %s Retry-After %q, want %d %s %q", c.err, r.method, r.path, a.status, a.err.Code, a.header.Get("Retry-After"), c.status, c.code, c.retry)
			}
			if !strings.Contains(a.err.Message, c.err.Error()) {
				t.Errorf("%v: the node's words became %q", c.err, a.err.Message)
			}
		}
	}
	n.Err = nil
	if a := do(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "one"}`); a.status != 409 || a.err.Code != "exists" {
		t.Errorf("a name taken: %d %+v", a.status, a.err)
	}
	if a := do(t, srv, "POST", "/v1/sandboxes/one/snapshot", ``); a.status != 200 || !strings.Contains(a.body, `"tier": "snapshot"`) {
		t.Errorf("a snapshot: %d %s", a.status, a.body)
	}
	if a := do(t, srv, "DELETE", "/v1/sandboxes/one", ``); a.status != http.StatusNoContent {
		t.Errorf("a delete: %d %s", a.status, a.body)
	}
	if a := do(t, srv, "GET", "/v1/sandboxes/one", ``); a.status != 404 || a.err.Code != "not_found" {
		t.Errorf("after the delete: %d %+v", a.status, a.err)
	}
}

// TestTemplateDelete: a template a sandbox uses is not deleted (409); once
// unused it is (204), and every node is told to drop it.
func TestTemplateDelete(t *testing.T) {
	n := newFakeNode()
	srv, _ := newAPI(t, n)
	if a := do(t, srv, "POST", "/v1/sandboxes", `{"template": "web", "name": "user"}`); a.status != http.StatusCreated {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	if a := do(t, srv, "DELETE", "/v1/templates/web", ``); a.status != 409 || a.err.Code != "conflict" {
		t.Errorf("deleting a template in use: %d %+v", a.status, a.err)
	}
	if a := do(t, srv, "DELETE", "/v1/sandboxes/user", ``); a.status != http.StatusNoContent {
		t.Fatalf("delete its sandbox: %d %s", a.status, a.body)
	}
	if a := do(t, srv, "DELETE", "/v1/templates/web", ``); a.status != http.StatusNoContent {
		t.Errorf("deleting an unused template: %d %s", a.status, a.body)
	}
	found := false
	for _, c := range n.Calls {
		found = found || c == "drop web"
	}
	if !found {
		t.Errorf("the node was not told to drop it: %v", n.Calls)
	}
	if a := do(t, srv, "GET", "/v1/templates/web", ``); a.status != 404 {
		t.Errorf("after the delete: %d", a.status)
	}
}
