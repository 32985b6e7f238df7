package controlplane

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/sam/oidctest"
)

var (
	samClient   = oidctest.Client{ID: "sam-mesh", Secret: "s1"}
	otherClient = oidctest.Client{ID: "other-app", Secret: "s2"}
	oidcUsers   = []oidctest.User{
		{ID: "u-alice", Username: "alice", Password: "pw", Email: "alice@ops.example", EmailVerified: true},
		{ID: "u-bob", Username: "bob", Password: "pw", Email: "bob@elsewhere.example", EmailVerified: true},
		{ID: "u-carol", Username: "carol", Password: "pw", Email: "carol@ops.example", EmailVerified: false},
	}
)

func TestOIDCEnrolment(t *testing.T) { eachIssuerPlane(t, testOIDCEnrolment) }

// eachIssuerPlane runs fn on both stores against a control plane that
// takes ID tokens of a real issuer (zitadel/oidc's provider on loopback
// HTTPS) for client sam-mesh, from verified addresses of ops.example.
func eachIssuerPlane(t *testing.T, fn func(t *testing.T, p *plane, iss *oidctest.Issuer)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			iss := oidctest.Start(t, oidcUsers, samClient, otherClient)
			p := newPlane(t, b.where(t), func(c *Config) {
				c.OIDC = &OIDCConfig{Issuer: iss.URL, ClientID: samClient.ID, HTTP: iss.HTTP, AllowEmails: []string{"@ops.example"}}
			})
			fn(t, p, iss)
		})
	}
}

// testOIDCEnrolment: an ID token of an allowed identity enrols (the node
// still proves its key with a signed challenge) and the credential
// verifies; the same ID token cannot enrol a second node; an ID token for
// another client (audience), from another issuer, expired, tampered with,
// of an identity not allowed or with an unverified address is refused,
// and so is a replayed challenge.
func testOIDCEnrolment(t *testing.T, p *plane, iss *oidctest.Issuer) {
	ctx := context.Background()
	c := p.member()
	alice := iss.IDToken(t, samClient, "alice", "pw")
	priv := key(t)
	cred, err := c.EnrolOIDC(ctx, alice, "node-a", priv)
	if err != nil {
		t.Fatalf("enrol with a good ID token: %v", err)
	}
	keys, _ := c.Keys(ctx)
	v, _ := NewVerifier(keys)
	if cl, err := v.Verify(cred.Credential, *p.now.Load()); err != nil || cl.Member != "node-a" || !cl.Key.Equal(priv.Public()) {
		t.Fatalf("the OIDC-enrolled credential: %+v, %v", cl, err)
	}
	if _, err := c.EnrolOIDC(ctx, alice, "node-b", key(t)); !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "already") {
		t.Errorf("the same ID token again: %v, want refused", err)
	}

	other := oidctest.Start(t, oidcUsers, samClient)
	// One bit of the signature flipped, the header and claims as issued.
	parts := strings.Split(iss.IDToken(t, samClient, "alice", "pw"), ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0x01
	tampered := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(raw)
	for name, c2 := range map[string]struct {
		tok  string
		kind error
		says string
	}{
		"another client's (audience)": {iss.IDToken(t, otherClient, "alice", "pw"), errdefs.ErrUnauthorized, "audience"},
		// Signed by a key the configured issuer does not publish: refused
		// at the signature, before its "iss" is read.
		"another issuer's": {other.IDToken(t, samClient, "alice", "pw"), errdefs.ErrUnauthorized, "signature"},
		// Signed by the configured issuer's own key, but under another
		// issuer name (the same provider reached at another host): the
		// "iss" check is what refuses it.
		"of another issuer name, the same keys": {iss.Alias(t).IDToken(t, samClient, "alice", "pw"), errdefs.ErrUnauthorized, "issued by a different provider"},
		"tampered with":                         {tampered, errdefs.ErrUnauthorized, "signature"},
		"an identity not allowed":               {iss.IDToken(t, samClient, "bob", "pw"), errdefs.ErrForbidden, "not allowed"},
		"an unverified address":                 {iss.IDToken(t, samClient, "carol", "pw"), errdefs.ErrForbidden, "not allowed"},
		"not a JWT":                             {"not.a.jwt", errdefs.ErrUnauthorized, "refused"},
	} {
		if _, err := c.EnrolOIDC(ctx, c2.tok, "node-x", key(t)); !errors.Is(err, c2.kind) || !strings.Contains(err.Error(), c2.says) {
			t.Errorf("an ID token %s: %v, want %v naming %q", name, err, c2.kind, c2.says)
		}
	}

	// A replayed challenge: the enrolment sent again as it was, with a
	// fresh ID token, is refused.
	fresh := iss.IDToken(t, samClient, "alice", "pw")
	var ch api.Challenge
	if err := c.do(ctx, http.MethodPost, "/v1/challenge", nil, &ch); err != nil {
		t.Fatal(err)
	}
	pk := key(t)
	req := api.EnrolRequest{OIDCToken: fresh, Name: "node-c", PublicKey: base64.StdEncoding.EncodeToString(pk.Public().(ed25519.PublicKey)),
		Challenge: ch.Challenge, Signature: base64.StdEncoding.EncodeToString(meshcred.SignChallenge(pk, ch.Challenge, "cp-test"))}
	if err := c.do(ctx, http.MethodPost, "/v1/enrol", req, nil); err != nil {
		t.Fatalf("an enrolment with a fresh ID token: %v", err)
	}
	req.OIDCToken, req.Name = iss.IDToken(t, samClient, "alice", "pw"), "node-d"
	if err := c.do(ctx, http.MethodPost, "/v1/enrol", req, nil); !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "challenge") {
		t.Errorf("a replayed challenge: %v, want refused", err)
	}
	// Both a bootstrap token and an ID token, or neither: a 400.
	req.Token = "samb_x"
	if err := c.do(ctx, http.MethodPost, "/v1/enrol", req, nil); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("both a token and an ID token: %v, want bad input", err)
	}

	// Expired: the example issuer's ID tokens live an hour.
	late := iss.IDToken(t, samClient, "alice", "pw")
	p.add(61 * time.Minute)
	if _, err := c.EnrolOIDC(ctx, late, "node-e", key(t)); !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("an expired ID token: %v, want refused", err)
	}
}

// TestOIDCFailsClosed: a control plane with no issuer configured refuses
// ID tokens; one with an issuer but no allow rule enrols nobody by OIDC.
func TestOIDCFailsClosed(t *testing.T) {
	iss := oidctest.Start(t, oidcUsers, samClient)
	ctx := context.Background()
	none := newPlane(t, filepath.Join(t.TempDir(), "cp.db"))
	if _, err := none.member().EnrolOIDC(ctx, iss.IDToken(t, samClient, "alice", "pw"), "node-a", key(t)); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("an ID token at a control plane without OIDC: %v, want refused", err)
	}
	norule := newPlane(t, filepath.Join(t.TempDir(), "cp.db"), func(c *Config) {
		c.OIDC = &OIDCConfig{Issuer: iss.URL, ClientID: samClient.ID, HTTP: iss.HTTP}
	})
	if _, err := norule.member().EnrolOIDC(ctx, iss.IDToken(t, samClient, "alice", "pw"), "node-a", key(t)); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("an ID token with no allow rule: %v, want refused", err)
	}
}
