package oidctest

import (
	"context"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
)

// TestIDToken: the issuer's ID token verifies with go-oidc against its
// discovered keys, for the client, with the user's claims in it; a wrong
// password gets none.
func TestIDToken(t *testing.T) {
	iss := Start(t, []User{{ID: "u1", Username: "alice", Password: "pw", Email: "alice@example.com", EmailVerified: true}}, Client{ID: "sam", Secret: "s"})
	raw := iss.IDToken(t, Client{ID: "sam", Secret: "s"}, "alice", "pw")
	ctx := oidc.ClientContext(context.Background(), iss.HTTP)
	p, err := oidc.NewProvider(ctx, iss.URL)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := p.Verifier(&oidc.Config{ClientID: "sam"}).Verify(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Email    string `json:"email"`
		Verified bool   `json:"email_verified"`
	}
	if err := tok.Claims(&c); err != nil || tok.Subject != "u1" || c.Email != "alice@example.com" || !c.Verified {
		t.Errorf("claims: sub %s, %+v, %v", tok.Subject, c, err)
	}
	if _, err := iss.idToken(Client{ID: "sam", Secret: "s"}, "alice", "wrong"); err == nil {
		t.Error("a wrong password got an ID token")
	}
}
