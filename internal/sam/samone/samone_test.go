package samone

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"sandstorm/api"
	"sandstorm/internal/pki"
	"sandstorm/internal/sam/controlplane"
	"sandstorm/internal/sam/meshconsole"
	"sandstorm/internal/sam/meshrouter"
)

type running struct {
	one   *One
	dir   string
	base  string
	admin *controlplane.Client
	http  *http.Client // trusts the CA, no token
}

// start runs a sam-one on loopback in a temporary data dir.
func start(t *testing.T) *running {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	one, err := Start(ctx, Options{DataDir: dir, Listen: "127.0.0.1:0", RouterListen: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- one.Serve(ctx, func(a string) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	r := &running{one: one, dir: dir, base: "https://" + <-addr}
	caPEM, err := os.ReadFile(filepath.Join(dir, "pki", pki.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	r.http = &http.Client{Timeout: 10 * time.Second, Transport: tr}
	tok, err := os.ReadFile(filepath.Join(dir, controlplane.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	r.admin = &controlplane.Client{Base: r.base, Name: "sam", HTTP: r.http, AdminToken: strings.TrimSpace(string(tok))}
	return r
}

func (r *running) state(t *testing.T) api.MeshConsole {
	t.Helper()
	s, err := r.one.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func refusalWith(s api.MeshConsole, by, sub string) *api.MeshRefusal {
	for _, f := range s.Refusals {
		if f.By == by && strings.Contains(f.Reason, sub) {
			return &f
		}
	}
	return nil
}

// memberHost is a libp2p host whose key is priv, connected to the router.
func memberHost(t *testing.T, r *running, priv ed25519.PrivateKey) host.Host {
	t.Helper()
	key, err := meshrouter.Identity(priv)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Connect(ctx, peer.AddrInfo{ID: r.one.Router.Host.ID(), Addrs: r.one.Router.Host.Addrs()}); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestSamOne: the router is a member enrolled in-process (its key 0600 in
// the data dir, its credential good against the control plane's own
// keys); the data dir serves sam-control-plane's operator client; a node
// enrolled with a token and connected to the router with its credential
// shows connected; refusals of the control plane (a bad token, a revoked
// member's refresh) and of the router (a credential not bound to the
// peer's key) are kept with their reasons.
func TestSamOne(t *testing.T) {
	r := start(t)
	ctx := context.Background()

	fi, err := os.Stat(filepath.Join(r.dir, RouterKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("router key: %v, mode %v", err, fi.Mode().Perm())
	}
	ms, err := r.admin.Members(ctx)
	if err != nil || len(ms) != 1 || ms[0].Name != "router" {
		t.Fatalf("members: %v %+v; want the router", err, ms)
	}
	// The router's credential, as members see it: it verifies against
	// GET /v1/keys.
	keys, err := r.admin.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := controlplane.NewVerifier(keys)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := v.Verify(*r.one.cred.Load(), time.Now()); err != nil || c.Member != "router" {
		t.Fatalf("the router's credential: %v %+v", err, c)
	}

	// A node enrols with a token, connects and presents its credential.
	tok, err := r.admin.CreateToken(ctx, api.MeshTokenRequest{MaxUses: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	cred, err := r.admin.Enrol(ctx, tok.Token, "node-a", priv)
	if err != nil {
		t.Fatal(err)
	}
	h := memberHost(t, r, priv)
	ans, err := meshrouter.Present(ctx, h, r.one.Router.Host.ID(), cred.Credential)
	if err != nil {
		t.Fatalf("present: %v", err)
	}
	if c, err := v.Verify(ans.Credential, time.Now()); err != nil || c.Member != "router" {
		t.Errorf("the router answered with %v %+v, want its own credential", err, c)
	}
	s := r.state(t)
	var row *api.MeshConsoleMember
	for i := range s.Members {
		if s.Members[i].Name == "node-a" {
			row = &s.Members[i]
		}
	}
	if row == nil || !row.Connected || row.PeerID != h.ID().String() || row.CredentialExpires.IsZero() {
		t.Fatalf("node-a in the console: %+v; want connected, its peer ID %s, an expiry", row, h.ID())
	}

	// Refused by the control plane: a spent token.
	_, priv2, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := r.admin.Enrol(ctx, tok.Token, "node-b", priv2); err == nil {
		t.Fatal("a spent token enrolled node-b")
	}
	if f := refusalWith(r.state(t), "control-plane", "bootstrap token unknown, spent or expired"); f == nil || f.What != "enrol" || f.Who != "node-b" {
		t.Errorf("the spent token's refusal: %+v in %+v", f, r.state(t).Refusals)
	}
	// Refused by the router: node-a's credential presented by another
	// peer.
	thief := memberHost(t, r, priv2)
	if _, err := meshrouter.Present(ctx, thief, r.one.Router.Host.ID(), cred.Credential); err == nil {
		t.Fatal("the router took node-a's credential from another peer")
	}
	if f := refusalWith(r.state(t), "router", "bound to another peer's key"); f == nil || f.Who != thief.ID().String() {
		t.Errorf("the router's refusal: %+v in %+v", f, r.state(t).Refusals)
	}
	// Revoked: node-a's refresh is refused, and it is no longer connected
	// as a member (the gate checks again against the store at once).
	if err := r.admin.Revoke(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.admin.Refresh(ctx, "node-a", priv); err == nil {
		t.Fatal("a revoked member refreshed")
	}
	s = r.state(t)
	if f := refusalWith(s, "control-plane", "was revoked"); f == nil || f.What != "refresh" {
		t.Errorf("the revoked refresh's refusal: %+v in %+v", f, s.Refusals)
	}
	for _, m := range s.Members {
		if m.Name == "node-a" && (m.Connected || m.RevokedAt.IsZero()) {
			t.Errorf("revoked node-a: %+v", m)
		}
	}
	if s.Refusals[0].Seq <= s.Refusals[len(s.Refusals)-1].Seq {
		t.Errorf("refusals not newest first: %+v", s.Refusals)
	}
}

// TestConsoleSession: the page is served to anyone; GET /v1/console needs
// a session or the admin token; the session's cookie is HttpOnly, Secure
// and SameSite=Strict, and it cannot write — neither the control plane's
// operator calls nor the policy.
func TestConsoleSession(t *testing.T) {
	r := start(t)
	get := func(c *http.Client, method, path, body string, h map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, r.base+path, strings.NewReader(body))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp, sb.String()
	}
	if resp, body := get(r.http, "GET", "/", "", nil); resp.StatusCode != 200 || !strings.Contains(body, "admin-token") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("the page: %d %q", resp.StatusCode, resp.Header)
	}
	if resp, _ := get(r.http, "GET", "/console/console.js", "", nil); resp.StatusCode != 200 {
		t.Errorf("console.js: %d", resp.StatusCode)
	}
	if resp, _ := get(r.http, "GET", "/v1/console", "", nil); resp.StatusCode != 401 {
		t.Errorf("no session: %d, want 401", resp.StatusCode)
	}
	if resp, _ := get(r.http, "POST", "/v1/session", `{"token":"nope"}`, nil); resp.StatusCode != 401 {
		t.Errorf("a wrong token logged in: %d", resp.StatusCode)
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Timeout: 10 * time.Second, Transport: r.http.Transport, Jar: jar}
	resp, _ := get(c, "POST", "/v1/session", `{"token":"`+r.admin.AdminToken+`"}`, nil)
	if resp.StatusCode != 204 {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	var ck *http.Cookie
	for _, k := range resp.Cookies() {
		if k.Name == meshconsole.CookieName {
			ck = k
		}
	}
	if ck == nil || !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("session cookie %+v: want HttpOnly, Secure, SameSite=Strict", ck)
	}
	resp, body := get(c, "GET", "/v1/console", "", nil)
	var s api.MeshConsole
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &s) != nil || len(s.Members) != 1 {
		t.Fatalf("GET /v1/console with the session: %d %s", resp.StatusCode, body)
	}
	// The session writes nothing.
	for _, w := range []struct{ method, path, body string }{
		{"POST", "/v1/tokens", `{"max_uses":1,"ttl_s":60}`},
		{"PUT", "/v1/policy", "roles: []\nbindings: []\n"},
		{"POST", "/v1/members/router/revoke", ""},
		{"POST", "/v1/keys/rotate", ""},
	} {
		if resp, body := get(c, w.method, w.path, w.body, nil); resp.StatusCode != 401 {
			t.Errorf("%s %s with the session: %d %s, want 401", w.method, w.path, resp.StatusCode, body)
		}
	}
	if ms, _ := r.admin.Members(context.Background()); len(ms) != 1 || !ms[0].RevokedAt.IsZero() {
		t.Errorf("the router after the session's tries: %+v", ms)
	}
	// The admin token reads it too (a script).
	if resp, _ := get(r.http, "GET", "/v1/console", "", map[string]string{"Authorization": "Bearer " + r.admin.AdminToken}); resp.StatusCode != 200 {
		t.Errorf("GET /v1/console with the admin token: %d", resp.StatusCode)
	}
	resp, _ = get(c, "DELETE", "/v1/session", "", nil)
	if resp, _ := get(c, "GET", "/v1/console", "", nil); resp.StatusCode != 401 {
		t.Errorf("after logout: %d, want 401", resp.StatusCode)
	}
}

// TestRouterKeyKept: a restart keeps the router's key, hence its peer ID
// (members' --router stays right), and its member.
func TestRouterKeyKept(t *testing.T) {
	dir := t.TempDir()
	ids := []string{}
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		one, err := Start(ctx, Options{DataDir: dir, Listen: "127.0.0.1:0", RouterListen: []string{"/ip4/127.0.0.1/tcp/0"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, one.Router.Host.ID().String())
		one.Close()
	}
	if ids[0] != ids[1] {
		t.Errorf("the router's peer ID changed across a restart: %v", ids)
	}
}

// TestAgentRefusalsReported: what a member reports its agents were
// refused, with its credential, is in the console's state under that
// member, with the principal, target, reason and count, and what it
// could not itemise counted on its row of members; a report without a
// member's credential is refused and shows nowhere but as a refusal.
func TestAgentRefusalsReported(t *testing.T) {
	r := start(t)
	ctx := context.Background()
	tok, err := r.admin.CreateToken(ctx, api.MeshTokenRequest{MaxUses: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	member := &controlplane.Client{Base: r.base, Name: "sam", HTTP: r.http}
	cred, err := member.Enrol(ctx, tok.Token, "node-a", priv)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rep := api.RefusalReport{Dropped: 41, Rows: []api.RefusalRow{{Principal: "agent-a", By: api.RefusedByBoundary, What: api.RefusedDNS,
		Target: "example.com", Reason: "destination not granted", Count: 12, First: now, Last: now}}}
	if err := member.ReportRefusals(ctx, cred.Credential, rep); err != nil {
		t.Fatal(err)
	}
	if err := member.ReportRefusals(ctx, "not-a-credential", rep); err == nil {
		t.Fatal("a report without a credential was taken")
	}
	s := r.state(t)
	if len(s.AgentRefusals) != 1 {
		t.Fatalf("agent refusals: %+v", s.AgentRefusals)
	}
	got := s.AgentRefusals[0]
	if got.Member != "node-a" || got.Principal != "agent-a" || got.Target != "example.com" || got.Reason != "destination not granted" || got.Count != 12 {
		t.Errorf("row %+v", got)
	}
	for _, m := range s.Members {
		if m.Name == "node-a" && m.RefusalsDropped != 41 {
			t.Errorf("node-a's dropped: %d", m.RefusalsDropped)
		}
	}
	if refusalWith(s, "control-plane", "") == nil {
		t.Error("the refused report is not among the control plane's refusals")
	}
	// The console's JSON carries them, flat.
	b, _ := json.Marshal(s)
	if !strings.Contains(string(b), `"agent_refusals":[{"member":"node-a","principal":"agent-a","by":"boundary","what":"dns","target":"example.com"`) {
		t.Errorf("GET /v1/console's JSON: %s", b)
	}
}
