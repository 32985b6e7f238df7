package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
)

func TestMeshTokens(t *testing.T) { eachStore(t, testMeshTokens) }

// testMeshTokens: a bootstrap token is good for its uses and no more —
// also when twenty enrolments race for three uses — and not after it
// expires; an unknown one is refused the same way.
func testMeshTokens(t *testing.T, where string) {
	s := openAt(t, where)
	ctx := context.Background()
	now := time.Now()
	if err := s.Mesh().PutMeshToken(ctx, "h3", 3, now.Add(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	errs := atOnce(20, func(int) error { return s.Mesh().SpendMeshToken(ctx, "h3", now) })
	if won := wins(t, errs, errdefs.ErrNotFound); won != 3 {
		t.Errorf("20 racing enrolments spent %d uses of a 3-use token", won)
	}
	s.Mesh().PutMeshToken(ctx, "old", 5, now.Add(time.Minute), now)
	if err := s.Mesh().SpendMeshToken(ctx, "old", now.Add(2*time.Minute)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an expired token: %v", err)
	}
	if err := s.Mesh().SpendMeshToken(ctx, "nope", now); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an unknown token: %v", err)
	}
	if err := s.Mesh().PutMeshToken(ctx, "zero", 0, now.Add(time.Hour), now); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a token of no use: %v", err)
	}
}

func TestMeshMembers(t *testing.T) { eachStore(t, testMeshMembers) }

// testMeshMembers: a member's name and key are its own; a revoke keeps
// its first time.
func testMeshMembers(t *testing.T, where string) {
	s := openAt(t, where)
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond).UTC()
	if err := s.Mesh().PutMeshMember(ctx, MeshMember{Name: "a", PublicKey: "ka", EnrolledAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []MeshMember{{Name: "a", PublicKey: "kb"}, {Name: "b", PublicKey: "ka"}} {
		if err := s.Mesh().PutMeshMember(ctx, m); !errors.Is(err, errdefs.ErrExists) {
			t.Errorf("%+v: %v, want ErrExists", m, err)
		}
	}
	if err := s.Mesh().RevokeMeshMember(ctx, "a", now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	s.Mesh().RevokeMeshMember(ctx, "a", now.Add(time.Hour))
	m, err := s.Mesh().GetMeshMember(ctx, "a")
	if err != nil || !m.RevokedAt.Equal(now.Add(time.Minute)) || !m.EnrolledAt.Equal(now) {
		t.Errorf("after two revokes: %+v, %v", m, err)
	}
	if err := s.Mesh().RevokeMeshMember(ctx, "ghost", now); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("revoke of no member: %v", err)
	}
	ms, _ := s.Mesh().ListMeshMembers(ctx)
	if fmt.Sprint(len(ms)) != "1" {
		t.Errorf("members: %+v", ms)
	}
}

func TestMeshPolicy(t *testing.T) { eachStore(t, testMeshPolicy) }

// testMeshPolicy: none at first; each put is the next version, the newest
// is what is read, also after a reopen; ten racing puts get ten distinct
// versions.
func testMeshPolicy(t *testing.T, where string) {
	s := openAt(t, where)
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond).UTC()
	if _, err := s.Mesh().GetMeshPolicy(ctx); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("no policy yet: %v, want not found", err)
	}
	for i, doc := range []string{"roles: []", "bindings: []"} {
		v, err := s.Mesh().PutMeshPolicy(ctx, doc, now)
		if err != nil || v != int64(i+1) {
			t.Fatalf("put %d: version %d, %v", i, v, err)
		}
	}
	s.Close()
	s = openAt(t, where)
	p, err := s.Mesh().GetMeshPolicy(ctx)
	if err != nil || p.Version != 2 || p.Document != "bindings: []" || !p.SetAt.Equal(now) {
		t.Fatalf("after a reopen: %+v, %v", p, err)
	}
	versions := make([]int64, 10)
	errs := atOnce(10, func(i int) (err error) {
		versions[i], err = s.Mesh().PutMeshPolicy(ctx, fmt.Sprint("# ", i), now)
		return err
	})
	seen := map[int64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Error(err)
		} else {
			seen[versions[i]] = true
		}
	}
	if len(seen) != 10 {
		t.Errorf("ten racing puts got %d distinct versions: %v", len(seen), seen)
	}
	if p, _ := s.Mesh().GetMeshPolicy(ctx); p.Version != 12 {
		t.Errorf("newest version %d, want 12", p.Version)
	}
}

func TestMeshIDTokens(t *testing.T) { eachStore(t, testMeshIDTokens) }

// testMeshIDTokens: an ID token enrols once, also when five enrolments
// race with it.
func testMeshIDTokens(t *testing.T, where string) {
	s := openAt(t, where)
	ctx := context.Background()
	now := time.Now()
	errs := atOnce(5, func(int) error { return s.Mesh().SpendMeshIDToken(ctx, "h", now.Add(time.Hour), now) })
	if won := wins(t, errs, errdefs.ErrExists); won != 1 {
		t.Errorf("an ID token spent %d times", won)
	}
	// Once expired, its row is dropped (the verifier refuses it by then).
	if err := s.Mesh().SpendMeshIDToken(ctx, "h", now.Add(3*time.Hour), now.Add(2*time.Hour)); err != nil {
		t.Errorf("after the first expired: %v", err)
	}
}
