package controlplane

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// plane is a control plane on a real store (SQLite or PostgreSQL), served
// over HTTP on loopback, with a settable clock.
type plane struct {
	srv   *httptest.Server
	admin *Client
	now   atomic.Pointer[time.Time]
}

func (p *plane) member() *Client     { return &Client{Base: p.srv.URL, Name: "cp-test"} }
func (p *plane) add(d time.Duration) { t := p.now.Load().Add(d); p.now.Store(&t) }

func newPlane(t *testing.T, where string, opts ...func(*Config)) *plane {
	t.Helper()
	st, err := store.Open(where)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	iss, err := meshcred.NewIssuer("cp-test")
	if err != nil {
		t.Fatal(err)
	}
	p := &plane{}
	now := time.Now()
	p.now.Store(&now)
	cfg := Config{Name: "cp-test", Store: st, Issuer: iss, AdminToken: "admin-secret", Now: func() time.Time { return *p.now.Load() },
		Log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	s := New(cfg)
	p.srv = httptest.NewServer(s.Handler())
	t.Cleanup(p.srv.Close)
	p.admin = &Client{Base: p.srv.URL, Name: "cp-test", AdminToken: "admin-secret"}
	return p
}

var backends = []struct {
	name  string
	where func(testing.TB) string
}{
	{"sqlite", func(t testing.TB) string { return filepath.Join(t.TempDir(), "cp.db") }},
	{"postgres", testenv.Postgres},
}

func eachStore(t *testing.T, fn func(t *testing.T, p *plane)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, newPlane(t, b.where(t))) })
	}
}

func key(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

func token(t *testing.T, p *plane, uses int, ttl time.Duration) string {
	t.Helper()
	tok, err := p.admin.CreateToken(context.Background(), api.MeshTokenRequest{MaxUses: uses, TTLSeconds: int(ttl / time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Token
}

func TestEnrolment(t *testing.T) { eachStore(t, testEnrolment) }

// testEnrolment: a node with a good token enrols and gets a credential
// that another member verifies offline, bound to its key; a bad, spent
// or expired token is refused, as is a name taken by another key; a
// revoked member's credential is refused by the others from their next
// GET /v1/keys, and it cannot refresh.
func testEnrolment(t *testing.T, p *plane) {
	ctx := context.Background()
	c := p.member()
	tok := token(t, p, 2, time.Hour)
	a, b := key(t), key(t)
	credA, err := c.Enrol(ctx, tok, "node-a", a)
	if err != nil {
		t.Fatalf("enrol with a good token: %v", err)
	}
	keys, err := c.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(keys)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := v.Verify(credA.Credential, *p.now.Load())
	if err != nil || claims.Member != "node-a" || !claims.Key.Equal(a.Public().(ed25519.PublicKey)) {
		t.Fatalf("another member's check of the credential: %+v, %v", claims, err)
	}
	if _, err := c.Enrol(ctx, tok, "node-a", b); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a name taken by another key: %v, want a conflict", err)
	}
	if _, err := c.Enrol(ctx, tok, "node-b", b); err != nil {
		t.Fatalf("the token's second use: %v", err)
	}
	if _, err := c.Enrol(ctx, tok, "node-c", key(t)); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("a third use of a two-use token: %v, want refused", err)
	}
	if _, err := c.Enrol(ctx, "samb_made-up", "node-c", key(t)); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("a made-up token: %v, want refused", err)
	}
	short := token(t, p, 5, time.Minute)
	p.add(2 * time.Minute)
	if _, err := c.Enrol(ctx, short, "node-c", key(t)); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("an expired token: %v, want refused", err)
	}

	// A refresh proves the key again; with another key it is refused.
	if _, err := c.Refresh(ctx, "node-a", a); err != nil {
		t.Errorf("refresh: %v", err)
	}
	if _, err := c.Refresh(ctx, "node-a", b); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("a refresh signed by another key: %v, want refused", err)
	}

	// Revoked: the others refuse its credential once they have the new
	// keys, though it has not expired; it cannot refresh.
	if err := p.admin.Revoke(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	keys, _ = c.Keys(ctx)
	v, _ = NewVerifier(keys)
	if _, err := v.Verify(credA.Credential, *p.now.Load()); !errors.Is(err, meshcred.ErrRevoked) {
		t.Errorf("a revoked member's credential: %v, want ErrRevoked", err)
	}
	if _, err := c.Refresh(ctx, "node-a", a); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("a revoked member's refresh: %v, want forbidden", err)
	}
	ms, err := p.admin.Members(ctx)
	if err != nil || len(ms) != 2 || ms[0].Name != "node-a" || ms[0].RevokedAt.IsZero() {
		t.Errorf("members: %+v, %v", ms, err)
	}
}

func TestChallengeReplay(t *testing.T) { eachStore(t, testChallengeReplay) }

// testChallengeReplay: an enrolment replayed as it was sent — the same
// challenge and signature — is refused, as is one whose challenge is
// stale, or signed for another control plane, and none of them spends
// the token.
func testChallengeReplay(t *testing.T, p *plane) {
	ctx := context.Background()
	c := p.member()
	tok := token(t, p, 1, time.Hour)
	priv := key(t)
	pub := base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
	signed := func(audience string) (string, string) {
		var ch api.Challenge
		if err := c.do(ctx, http.MethodPost, "/v1/challenge", nil, &ch); err != nil {
			t.Fatal(err)
		}
		return ch.Challenge, base64.StdEncoding.EncodeToString(meshcred.SignChallenge(priv, ch.Challenge, audience))
	}
	enrol := func(name, ch, sig string) error {
		return c.do(ctx, http.MethodPost, "/v1/enrol", api.EnrolRequest{Token: tok, Name: name, PublicKey: pub, Challenge: ch, Signature: sig}, nil)
	}
	ch, sig := signed("cp-other")
	if err := enrol("node-a", ch, sig); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("signed for another control plane: %v, want refused", err)
	}
	ch, sig = signed("cp-test")
	p.add(2 * time.Minute)
	if err := enrol("node-a", ch, sig); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("a stale challenge: %v, want refused", err)
	}
	ch, sig = signed("cp-test")
	if err := enrol("node-a", ch, sig); err != nil {
		t.Fatalf("a good enrolment (the token unspent by the refused ones): %v", err)
	}
	if err := enrol("node-b", ch, sig); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("the same request replayed: %v, want refused", err)
	}
}

// TestConcurrentEnrolments: twenty nodes race for a three-use token;
// three are enrolled.
func TestConcurrentEnrolments(t *testing.T) {
	p := newPlane(t, filepath.Join(t.TempDir(), "cp.db"))
	tok := token(t, p, 3, time.Hour)
	var ok atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.member().Enrol(context.Background(), tok, "node-"+string(rune('a'+i)), key(t)); err == nil {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 3 {
		t.Errorf("%d of 20 racing enrolments succeeded with a three-use token", ok.Load())
	}
}

// TestAdminOnly: tokens and members need the admin token; bad input is
// a 400 that says what to send.
func TestAdminOnly(t *testing.T) {
	p := newPlane(t, filepath.Join(t.TempDir(), "cp.db"))
	ctx := context.Background()
	anon := p.member()
	if _, err := anon.CreateToken(ctx, api.MeshTokenRequest{MaxUses: 1, TTLSeconds: 60}); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("a token made without the admin token: %v", err)
	}
	if _, err := anon.Members(ctx); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("members listed without the admin token: %v", err)
	}
	if err := anon.Revoke(ctx, "x"); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("a revoke without the admin token: %v", err)
	}
	for _, req := range []api.MeshTokenRequest{{MaxUses: 0, TTLSeconds: 60}, {MaxUses: 1, TTLSeconds: 0}, {MaxUses: 1, TTLSeconds: 30 * 24 * 3600}} {
		if _, err := p.admin.CreateToken(ctx, req); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("token %+v: %v, want bad input", req, err)
		}
	}
	if err := anon.do(ctx, http.MethodPost, "/v1/enrol", map[string]any{"token": "x", "extra": 1}, nil); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("an unknown field: %v, want bad input", err)
	}
	if err := anon.do(ctx, http.MethodPost, "/v1/enrol", api.EnrolRequest{Name: "Bad Name!"}, nil); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a bad name: %v, want bad input", err)
	}
	if err := p.admin.Revoke(ctx, "ghost"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("revoke of no member: %v, want not found", err)
	}
}
