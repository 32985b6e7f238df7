package controlplane

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/store"
)

// TestIssueOwn: a member of the control plane's own process (sam-one's
// router) is enrolled at its first issue and renewed with the same key;
// another key under its name, or the name revoked, is refused; the
// credential verifies with VerifyCredential until the member is revoked;
// the Issued hook hears of each.
func TestIssueOwn(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	iss, _ := meshcred.NewIssuer("cp-test")
	issued := map[string]time.Time{}
	s := New(Config{Name: "cp-test", Store: st, Issuer: iss, Log: slog.New(slog.DiscardHandler),
		Issued: func(m string, exp time.Time) { issued[m] = exp }})
	ctx := context.Background()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	tok, c, err := s.IssueOwn(ctx, "router", pub)
	if err != nil || c.Member != "router" {
		t.Fatalf("first issue: %v %+v", err, c)
	}
	if _, _, err := s.IssueOwn(ctx, "router", pub); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if got, err := s.VerifyCredential(ctx, tok); err != nil || got.Member != "router" {
		t.Fatalf("verify: %v %+v", err, got)
	}
	if issued["router"].IsZero() {
		t.Error("the Issued hook was not called")
	}
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	if _, _, err := s.IssueOwn(ctx, "router", other); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("another key under the name: %v, want a conflict", err)
	}
	if err := st.Mesh().RevokeMeshMember(ctx, "router", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.IssueOwn(ctx, "router", pub); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("revoked: %v, want forbidden", err)
	}
	if _, err := s.VerifyCredential(ctx, tok); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("a revoked member's credential: %v, want forbidden", err)
	}
}
