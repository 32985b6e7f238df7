package membership

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/controlplane"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// fixture is a control plane on loopback (SQLite), a settable clock both
// sides read, and an operator's client.
type fixture struct {
	srv   *httptest.Server
	admin *controlplane.Client
	clock atomic.Pointer[time.Time]
}

func (f *fixture) now() time.Time      { return *f.clock.Load() }
func (f *fixture) add(d time.Duration) { t := f.now().Add(d); f.clock.Store(&t) }
func (f *fixture) client() *controlplane.Client {
	return &controlplane.Client{Base: f.srv.URL, Name: "cp"}
}

func newFixture(t *testing.T, ttl time.Duration) *fixture {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	iss, _ := meshcred.NewIssuer("cp")
	f := &fixture{}
	now := time.Now()
	f.clock.Store(&now)
	cp := controlplane.New(controlplane.Config{Name: "cp", Store: st, Issuer: iss, AdminToken: "adm", CredentialTTL: ttl, Now: f.now, Log: slog.New(slog.DiscardHandler)})
	f.srv = httptest.NewServer(cp.Handler())
	t.Cleanup(f.srv.Close)
	f.admin = &controlplane.Client{Base: f.srv.URL, Name: "cp", AdminToken: "adm"}
	return f
}

func (f *fixture) token(t *testing.T, uses int) string {
	t.Helper()
	tok, err := f.admin.CreateToken(context.Background(), api.MeshTokenRequest{MaxUses: uses, TTLSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Token
}

// joinTwo joins node-a and node-b, each into a directory of its own, with
// one token; both poll every poll.
func (f *fixture) joinTwo(t *testing.T, poll time.Duration) (cfg Config, a, b *Member) {
	t.Helper()
	tok := f.token(t, 2)
	cfg = Config{ControlPlane: f.client(), PollEvery: poll, Now: f.now, Log: slog.New(slog.DiscardHandler)}
	a, err := Join(context.Background(), filepath.Join(t.TempDir(), "a"), "node-a", tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err = Join(context.Background(), filepath.Join(t.TempDir(), "b"), "node-b", tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, a, b
}

// TestJoinOnceAndReopen: a join writes the member's key, name and
// credential, each mode 0600; a second join into the same directory is
// refused; the directory reopens as the same member with the same
// credential.
func TestJoinOnceAndReopen(t *testing.T) {
	f := newFixture(t, 10*time.Minute)
	dir := filepath.Join(t.TempDir(), "mesh")
	cfg := Config{ControlPlane: f.client(), Now: f.now, Log: slog.New(slog.DiscardHandler)}
	m, err := Join(context.Background(), dir, "node-a", f.token(t, 2), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{KeyFile, MemberFile, CredentialFile} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", name, err, st.Mode().Perm())
		}
	}
	if _, err := Join(context.Background(), dir, "node-a", f.token(t, 1), cfg); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a second join into the directory: %v, want refused", err)
	}
	again, err := Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again.Name() != "node-a" || again.Credential() != m.Credential() {
		t.Error("the reopened member is not the one that joined")
	}
	if c, err := again.Verify(m.Credential()); err != nil || c.Member != "node-a" {
		t.Errorf("its own credential, checked with the kept keys: %+v, %v", c, err)
	}
}

// TestRevocationReachesAMember: a member running refuses another's
// credential within a few polls of its revocation; with the control plane
// gone it keeps the last good keys and says so.
func TestRevocationReachesAMember(t *testing.T) {
	f := newFixture(t, 10*time.Minute)
	cfg, a, b := f.joinTwo(t, 20*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	if _, err := a.Verify(b.Credential()); err != nil {
		t.Fatalf("b's credential before the revocation: %v", err)
	}
	if err := f.admin.Revoke(context.Background(), "node-b"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	testenv.WaitFor(t, 5*time.Second, "node-a refuses node-b's credential", func() bool {
		_, err := a.Verify(b.Credential())
		return errors.Is(err, meshcred.ErrRevoked)
	})
	t.Logf("the revocation reached the member in %v (polling every %v)", time.Since(revoked), cfg.PollEvery)

	f.srv.Close()
	testenv.WaitFor(t, 5*time.Second, "node-a says the control plane is unreachable", func() bool {
		_, err := a.Status()
		return err != nil
	})
	if _, err := a.Verify(a.Credential()); err != nil {
		t.Errorf("with the control plane gone, the last good keys: %v", err)
	}
}

// TestRenewal: a member renews its credential once a third of its life
// has passed, proving its key again.
func TestRenewal(t *testing.T) {
	f := newFixture(t, 90*time.Second)
	cfg := Config{ControlPlane: f.client(), PollEvery: time.Second, Now: f.now, Log: slog.New(slog.DiscardHandler)}
	m, err := Join(context.Background(), filepath.Join(t.TempDir(), "m"), "node-a", f.token(t, 1), cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := m.Credential()
	f.add(25 * time.Second)
	m.step(context.Background())
	if m.Credential() != first {
		t.Fatal("renewed before a third of its life")
	}
	f.add(6 * time.Second)
	m.step(context.Background())
	if m.Credential() == first {
		t.Fatal("not renewed past a third of its life")
	}
	if c, err := m.Verify(m.Credential()); err != nil || !c.Expires.After(f.now().Add(80*time.Second)) {
		t.Errorf("the renewed credential: %+v, %v", c, err)
	}
}

// TestKeyRotationReachesAMember: after the operator rotates the control
// plane's key, a running member verifies credentials signed by the new
// key from its next poll, and one signed before the rotation until the
// grace ends — then it refuses it, though it has not expired.
func TestKeyRotationReachesAMember(t *testing.T) {
	f := newFixture(t, 10*time.Minute)
	cfg, a, b := f.joinTwo(t, 20*time.Millisecond)
	old := b.Credential()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	grace := time.Minute
	if _, err := f.admin.RotateKeys(context.Background(), &grace); err != nil {
		t.Fatal(err)
	}
	renewed, err := f.client().Refresh(context.Background(), "node-b", b.PrivateKey())
	if err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	testenv.WaitFor(t, 5*time.Second, "node-a verifies a credential signed by the new key", func() bool {
		_, err := a.Verify(renewed.Credential)
		return err == nil
	})
	t.Logf("the new key reached the member in %v (polling every %v)", time.Since(rotated), cfg.PollEvery)
	if _, err := a.Verify(old); err != nil {
		t.Errorf("a credential from before the rotation, in the grace: %v", err)
	}
	f.add(2 * time.Minute)
	testenv.WaitFor(t, 5*time.Second, "node-a refuses the old key's credential after the grace", func() bool {
		_, err := a.Verify(old)
		return errors.Is(err, meshcred.ErrUnknownKey)
	})
	if _, err := a.Verify(renewed.Credential); err != nil {
		t.Errorf("the new key's credential after the grace: %v", err)
	}
}

// TestUnknownKeyFetchesNow: a member that polls every 8 s, shown a
// credential signed by a key rotated in since its last fetch, refuses it
// and fetches the keys at once: the next try verifies, long before its
// next poll.
func TestUnknownKeyFetchesNow(t *testing.T) {
	f := newFixture(t, 10*time.Minute)
	cfg, a, b := f.joinTwo(t, 8*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polled := time.Now()
	go a.Run(ctx)
	testenv.WaitFor(t, 5*time.Second, "node-a's first poll", func() bool { return !a.Policy().State().FetchedAt.IsZero() })
	if _, err := f.admin.RotateKeys(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	renewed, err := f.client().Refresh(context.Background(), "node-b", b.PrivateKey())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Verify(renewed.Credential); !errors.Is(err, meshcred.ErrUnknownKey) {
		t.Fatalf("a credential of a key not fetched yet: %v, want ErrUnknownKey", err)
	}
	shown := time.Now()
	// Its next poll is 8 s after the first; the fetch the refusal asked
	// for comes a quarter poll (2 s) after it.
	testenv.WaitFor(t, time.Until(polled.Add(6*time.Second)), "node-a fetches the new key before its next poll", func() bool {
		_, err := a.Verify(renewed.Credential)
		return err == nil
	})
	t.Logf("the new key was fetched %v after the first refusal (polling every %v; at most one extra fetch per quarter poll)", time.Since(shown), cfg.PollEvery)
}
