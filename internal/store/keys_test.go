package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
)

// TestAPIKeys: a key is found by its hash only, listed, and gone once
// revoked; a second key with the same hash is refused.
func TestAPIKeys(t *testing.T) { eachStore(t, testAPIKeys) }

func testAPIKeys(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	now := time.UnixMilli(time.Now().UnixMilli()).UTC()
	k := APIKey{ID: "k1", Team: "red", Hash: "h1", Last4: "abcd", CreatedAt: now}
	if err := s.Teams().PutAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.Teams().PutAPIKey(ctx, APIKey{ID: "k2", Team: "blue", Hash: "h1", CreatedAt: now}); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a second key with the same hash: %v, want exists", err)
	}
	if got, err := s.Teams().APIKeyByHash(ctx, "h1"); err != nil || got != k {
		t.Errorf("by hash: %+v %v, want %+v", got, err, k)
	}
	if _, err := s.Teams().APIKeyByHash(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown hash: %v", err)
	}
	if all, _ := s.Teams().APIKeys(ctx); len(all) != 1 {
		t.Errorf("list: %v", all)
	}
	if err := s.Teams().DeleteAPIKey(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Teams().APIKeyByHash(ctx, "h1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a revoked key still found: %v", err)
	}
	if err := s.Teams().DeleteAPIKey(ctx, "k1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("revoking twice: %v", err)
	}
}

// TestSandboxMeta: what the master keeps of a sandbox round-trips,
// replaces, lists and goes.
func TestSandboxMeta(t *testing.T) { eachStore(t, testSandboxMeta) }

func testSandboxMeta(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	now := time.UnixMilli(time.Now().UnixMilli()).UTC()
	m := SandboxMeta{ID: "s1", Team: "red", Metadata: map[string]string{"app": "x"}, Env: map[string]string{"K": "V"}, StartedAt: now, EndAt: now.Add(time.Minute), AutoPause: true, Paused: true, Private: true, MaskHost: "h:${PORT}", AutoResume: true, SnapshotOf: "s0", SnapshotName: "n", PauseDropsMemory: true}
	if err := s.Teams().PutSandboxMeta(ctx, m); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Teams().GetSandboxMeta(ctx, "s1"); err != nil || !reflect.DeepEqual(got, m) {
		t.Errorf("got %+v %v, want %+v", got, err, m)
	}
	m.EndAt, m.AutoPause, m.Metadata = time.Time{}, false, nil
	s.Teams().PutSandboxMeta(ctx, m)
	got, _ := s.Teams().GetSandboxMeta(ctx, "s1")
	if !got.EndAt.IsZero() || got.AutoPause || len(got.Metadata) != 0 {
		t.Errorf("after a replace: %+v", got)
	}
	s.Teams().PutSandboxMeta(ctx, SandboxMeta{ID: "s2", StartedAt: now})
	if all, _ := s.Teams().SandboxMetas(ctx); len(all) != 2 {
		t.Errorf("list: %v", all)
	}
	s.Teams().PutSandboxMeta(ctx, SandboxMeta{ID: "due", StartedAt: now, EndAt: now.Add(-time.Second)})
	s.Teams().PutSandboxMeta(ctx, SandboxMeta{ID: "paused", StartedAt: now, EndAt: now.Add(-time.Second), Paused: true})
	s.Teams().PutSandboxMeta(ctx, SandboxMeta{ID: "later", StartedAt: now, EndAt: now.Add(time.Hour)})
	if due, err := s.Teams().DueSandboxMetas(ctx, now); err != nil || len(due) != 1 || due[0].ID != "due" {
		t.Errorf("due: %v %v, want only the one past its end and not paused", due, err)
	}
	// Puts at once on one sandbox (a pause and a connect) each replace
	// the row: none fails on its key.
	errs := atOnce(20, func(i int) error {
		return s.Teams().PutSandboxMeta(ctx, SandboxMeta{ID: "race", StartedAt: now, Paused: i%2 == 0})
	})
	for _, err := range errs {
		if err != nil {
			t.Errorf("a put at the same time as others: %v", err)
		}
	}
	s.Teams().DeleteSandboxMeta(ctx, "s1")
	if _, err := s.Teams().GetSandboxMeta(ctx, "s1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
}
