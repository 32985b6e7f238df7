package store

import (
	"context"
	"errors"
	"testing"

	"sandstorm/internal/errdefs"
)

// TestMoveStates: a move's placement goes moving → moved → settled by
// conditional writes only: one begin wins, a commit after an abort does
// nothing, a revert puts the sandbox back where it was with its old
// generation, and a drained node's mark survives.
func TestMoveStates(t *testing.T) { eachStore(t, testMoveStates) }

func testMoveStates(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	if err := s.PutNode(ctx, Node{Name: "s", Address: "a:1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetDraining(ctx, "s", true); err != nil {
		t.Fatal(err)
	}
	if ns, _ := s.ListNodes(ctx); len(ns) != 1 || !ns[0].Draining {
		t.Fatalf("draining not kept: %+v", ns)
	}
	if err := s.SetDraining(ctx, "nope", true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("drain of no node: %v", err)
	}
	get := func() Placement {
		t.Helper()
		p, err := s.GetPlacement(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := s.PutPlacement(ctx, Placement{ID: "x", Name: "web", Node: "s", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginMove(ctx, "x", "t", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginMove(ctx, "x", "u", 3); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a second begin: %v", err)
	}
	if p := get(); p.State != PlacementMoving || p.Node != "s" || p.Generation != 1 || p.MoveNode != "t" || p.MoveGen != 2 {
		t.Fatalf("moving: %+v", p)
	}
	if ps, _ := s.ListMovesTo(ctx, "t"); len(ps) != 1 {
		t.Fatalf("moves to t: %+v", ps)
	}
	if err := s.CommitMove(ctx, "x", 3); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("commit of another generation: %v", err)
	}
	if err := s.CommitMove(ctx, "x", 2); err != nil {
		t.Fatal(err)
	}
	if p := get(); p.State != PlacementMoved || p.Node != "t" || p.Generation != 2 || p.MoveNode != "s" || p.MoveGen != 1 {
		t.Fatalf("moved: %+v", p)
	}
	if err := s.AbortMove(ctx, "x", 2); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("an abort after the commit point: %v", err)
	}
	if p := get(); p.State != PlacementMoved {
		t.Fatalf("an abort after the commit point changed it: %+v", p)
	}
	if err := s.RevertMove(ctx, "x", 2); err != nil {
		t.Fatal(err)
	}
	if p := get(); p.State != "" || p.Node != "s" || p.Generation != 1 || p.MoveNode != "" {
		t.Fatalf("reverted: %+v", p)
	}
	// Again, to the end.
	if err := s.BeginMove(ctx, "x", "t", 4); err != nil {
		t.Fatal(err)
	}
	if err := s.AbortMove(ctx, "x", 4); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitMove(ctx, "x", 4); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a commit after an abort: %v", err)
	}
	if err := s.BeginMove(ctx, "x", "t", 5); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitMove(ctx, "x", 5); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishMove(ctx, "x", 5); err != nil {
		t.Fatal(err)
	}
	if p := get(); p.State != "" || p.Node != "t" || p.Generation != 5 || p.MoveNode != "" {
		t.Fatalf("finished: %+v", p)
	}
}
