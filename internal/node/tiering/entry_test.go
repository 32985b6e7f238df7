package tiering

import (
	"context"
	"errors"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/store"
)

// TestEntryLock: a transition's lock is one holder at a time; a wait for
// it gives up when its context ends, and a try never waits.
func TestEntryLock(t *testing.T) {
	m := New(Config{MaxWakes: 1})
	e := m.Entry("s1")
	if e != m.Entry("s1") {
		t.Fatal("two entries for one sandbox")
	}
	if e.Tier() != api.TierDetached || e.Busy() {
		t.Fatalf("a new entry is %s (busy %v), want detached and idle", e.Tier(), e.Busy())
	}
	if !e.TryAcquire() || !e.Busy() {
		t.Fatal("an idle entry's lock was not taken")
	}
	if e.TryAcquire() {
		t.Fatal("a held lock was taken again")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := e.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait for a held lock: %v", err)
	}
	e.Release()
	if err := e.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.Release()
	m.Forget("s1")
	if _, ok := m.Lookup("s1"); ok {
		t.Error("a forgotten sandbox is still looked up")
	}
}

// TestRefusals: a sandbox leaving or arriving by a move is refused as no
// room (try again), one left behind as a conflict, and the node's own
// refusals are no-room errors the gateway answers with 503.
func TestRefusals(t *testing.T) {
	if err := RefuseMoving(store.Sandbox{Name: "a", MoveOut: 3}); !errors.Is(err, ErrMoving) || !errors.Is(err, errdefs.ErrNoRoom) {
		t.Errorf("leaving: %v", err)
	}
	if err := RefuseMoving(store.Sandbox{Name: "a", MoveIn: true}); !errors.Is(err, ErrMoving) {
		t.Errorf("arriving: %v", err)
	}
	if err := RefuseMoving(store.Sandbox{Name: "a"}); err != nil {
		t.Errorf("not moving: %v", err)
	}
	if err := RefuseLeftBehind(store.Sandbox{Name: "a"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("left behind: %v", err)
	}
	if !errors.Is(ErrRefused, errdefs.ErrNoRoom) {
		t.Error("ErrRefused is not a no-room refusal")
	}
}

// TestSteps: each mark records the step's name and its time.
func TestSteps(t *testing.T) {
	s := NewSteps()
	s.Mark("a")
	s.Mark("b")
	attrs := s.Attrs()
	if len(attrs) != 4 || attrs[0] != "a_ms" || attrs[2] != "b_ms" {
		t.Errorf("attrs %v", attrs)
	}
}
