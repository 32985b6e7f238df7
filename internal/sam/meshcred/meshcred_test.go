package meshcred

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func member(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// TestIssueVerify: a credential verifies offline with the issuer's key
// set — after a round trip through JSON, as a member keeps it — says who
// it is for and which key it is bound to, and is refused once expired,
// revoked, tampered with, or checked against another issuer's keys.
func TestIssueVerify(t *testing.T) {
	iss, err := NewIssuer("cp-1")
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := member(t)
	tok, issued, err := iss.Issue("node-a", pub, 10*time.Minute, t0)
	if err != nil {
		t.Fatal(err)
	}
	var ks KeySet
	b, _ := json.Marshal(iss.KeySet(t0))
	if err := json.Unmarshal(b, &ks); err != nil {
		t.Fatalf("a key set through JSON: %v", err)
	}
	c, err := ks.Verify(tok, t0.Add(time.Minute), nil)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if c.Member != "node-a" || !c.Key.Equal(pub) || c.ID != issued.ID || !c.Expires.Equal(issued.Expires) {
		t.Errorf("claims %+v, want %+v", c, issued)
	}
	if _, err := ks.Verify(tok, t0.Add(11*time.Minute), nil); !errors.Is(err, ErrExpired) {
		t.Errorf("after its expiry: %v, want ErrExpired", err)
	}
	if _, err := ks.Verify(tok, t0.Add(time.Minute), func(c Claims) bool { return c.ID == issued.ID }); !errors.Is(err, ErrRevoked) {
		t.Errorf("revoked: %v, want ErrRevoked", err)
	}
	parts := strings.Split(tok, ".")
	claims, _ := json.Marshal(map[string]any{"iss": "cp-1", "sub": "node-evil", "jti": "x", "exp": t0.Add(time.Hour).Unix()})
	forged := parts[0] + "." + b64(claims) + "." + parts[2]
	if _, err := ks.Verify(forged, t0.Add(time.Minute), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("claims swapped under the signature: %v, want refused", err)
	}
	other, _ := NewIssuer("cp-1")
	if _, err := other.KeySet(t0).Verify(tok, t0.Add(time.Minute), nil); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("against another control plane's keys: %v, want ErrUnknownKey", err)
	}
	if _, err := (KeySet{Issuer: "cp-2", Keys: ks.Keys}).Verify(tok, t0.Add(time.Minute), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("for another issuer name: %v, want refused", err)
	}
	if _, _, err := iss.Issue("node-b", pub[:10], time.Minute, t0); err == nil {
		t.Error("a credential bound to a truncated key was issued")
	}
	// A restarted control plane, with its keys from the file: the same
	// key set, and what it signs now verifies with the one kept before.
	saved, err := iss.MarshalKeys()
	if err != nil {
		t.Fatal(err)
	}
	back, err := LoadIssuer("cp-1", saved)
	if err != nil {
		t.Fatal(err)
	}
	again, _, _ := back.Issue("node-a", pub, time.Minute, t0)
	if _, err := ks.Verify(again, t0, nil); err != nil {
		t.Errorf("a credential of the reloaded issuer, against the key set from before: %v", err)
	}
	if _, err := LoadIssuer("cp-1", []byte(`[{"id":"x","seed":"AAEC"}]`)); err == nil {
		t.Error("a short seed was loaded")
	}
}

// TestRotation: after a rotation the new key signs; a credential of the
// old key verifies until the grace ends and is refused after it.
func TestRotation(t *testing.T) {
	iss, _ := NewIssuer("cp")
	pub, _ := member(t)
	old, _, _ := iss.Issue("n", pub, time.Hour, t0)
	if err := iss.Rotate(30*time.Minute, t0); err != nil {
		t.Fatal(err)
	}
	fresh, _, _ := iss.Issue("n", pub, time.Hour, t0)
	during := iss.KeySet(t0.Add(10 * time.Minute))
	for name, tok := range map[string]string{"old key's": old, "new key's": fresh} {
		if _, err := during.Verify(tok, t0.Add(10*time.Minute), nil); err != nil {
			t.Errorf("during the grace, the %s credential: %v", name, err)
		}
	}
	if len(during.Keys.Keys) != 2 {
		t.Errorf("during the grace: %d keys, want 2", len(during.Keys.Keys))
	}
	after := iss.KeySet(t0.Add(31 * time.Minute))
	if _, err := after.Verify(old, t0.Add(31*time.Minute), nil); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("after the grace, the old key's credential: %v, want ErrUnknownKey", err)
	}
	if _, err := after.Verify(fresh, t0.Add(31*time.Minute), nil); err != nil {
		t.Errorf("after the grace, the new key's credential: %v", err)
	}
}

// TestChallenges: a challenge is spent once; a replayed, stale or unknown
// one is refused; a signature proves the key only for its challenge and
// audience.
func TestChallenges(t *testing.T) {
	ch := NewChallenges(time.Minute)
	c := ch.New(t0)
	if !ch.Spend(c, t0.Add(time.Second)) {
		t.Fatal("a fresh challenge was refused")
	}
	if ch.Spend(c, t0.Add(2*time.Second)) {
		t.Error("a challenge was spent twice (replay)")
	}
	stale := ch.New(t0)
	if ch.Spend(stale, t0.Add(61*time.Second)) {
		t.Error("a stale challenge was accepted")
	}
	if ch.Spend("made-up", t0) {
		t.Error("a challenge never handed out was accepted")
	}
	pub, priv := member(t)
	sig := SignChallenge(priv, c, "cp-1")
	if !VerifyChallenge(pub, c, "cp-1", sig) {
		t.Error("a good signature refused")
	}
	other, _ := member(t)
	for name, ok := range map[string]bool{
		"another challenge": VerifyChallenge(pub, c+"x", "cp-1", sig),
		"another audience":  VerifyChallenge(pub, c, "cp-2", sig),
		"another key":       VerifyChallenge(other, c, "cp-1", sig),
		"a short key":       VerifyChallenge(pub[:5], c, "cp-1", sig),
	} {
		if ok {
			t.Errorf("a signature verified for %s", name)
		}
	}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// TestRotatedLeavesTheOriginal: Rotated is a copy — the issuer it came
// from still signs with its key — and the copy's old key is in its grace.
func TestRotatedLeavesTheOriginal(t *testing.T) {
	iss, err := NewIssuer("cp")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	was := iss.CurrentKeyID()
	next, err := iss.Rotated(time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if iss.CurrentKeyID() != was || next.CurrentKeyID() == was {
		t.Fatalf("original %s (was %s), rotated %s", iss.CurrentKeyID(), was, next.CurrentKeyID())
	}
	if n := len(iss.KeySet(now).Keys.Keys); n != 1 {
		t.Errorf("the original has %d keys, want 1", n)
	}
	if n := len(next.KeySet(now).Keys.Keys); n != 2 {
		t.Errorf("the rotated copy has %d keys in the grace, want 2", n)
	}
	if n := len(next.KeySet(now.Add(2 * time.Minute)).Keys.Keys); n != 1 {
		t.Errorf("after the grace, %d keys, want 1", n)
	}
}
