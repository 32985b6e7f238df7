package store

import (
	"context"
	"fmt"

	"sandstorm/internal/errdefs"
)

// A live move of a sandbox between two paired nodes (issue 18; the master's
// protocol is internal/fleet/move.go) is two states of its placement, each
// reached by one conditional write, so that two masters, a retry or a
// master that died half-way can never both act on it:
//
//	""      → moving  BeginMove: node S, generation g1; MoveNode T, MoveGen g2
//	moving  → moved   CommitMove: the commit point; node T, generation g2,
//	                  and MoveNode S, MoveGen g1 (the copy left to delete)
//	moving  → ""      AbortMove: back on S, as it was
//	moved   → ""      FinishMove: S's copy is gone, T's is live
//	moved   → ""      RevertMove: T never took it; back on S with g1
const (
	PlacementMoving = "moving"
	PlacementMoved  = "moved"
)

// BeginMove records that sandbox id is about to move to node to, where it
// will have generation gen; errdefs.ErrConflict unless it is placed and
// settled (not being created, deleted or moved).
func (s *Store) BeginMove(ctx context.Context, id, to string, gen int64) error {
	return s.casPlacement(ctx, id, "it is being created, deleted or moved",
		`UPDATE placements SET state=?, move_node=?, move_gen=? WHERE id=? AND state=''`, PlacementMoving, to, gen, id)
}

// CommitMove is a move's commit point: the placement of id becomes node
// MoveNode with generation gen, and remembers where it came from until
// FinishMove. errdefs.ErrConflict if the move of generation gen is no
// longer under way (it was aborted).
func (s *Store) CommitMove(ctx context.Context, id string, gen int64) error {
	// Both databases read the right-hand sides from the row as it was, so
	// the pairs swap.
	return s.casPlacement(ctx, id, "the move was given up",
		`UPDATE placements SET state=?, node=move_node, generation=move_gen, move_node=node, move_gen=generation WHERE id=? AND state=? AND move_gen=?`,
		PlacementMoved, id, PlacementMoving, gen)
}

// AbortMove gives up the move of id of generation gen before its commit
// point: the placement is as it was. errdefs.ErrConflict if that move is
// not under way (it was committed, or given up already): then its nodes
// must not be told to give it up.
func (s *Store) AbortMove(ctx context.Context, id string, gen int64) error {
	return s.casPlacement(ctx, id, "no such move under way",
		`UPDATE placements SET state='', move_node='', move_gen=0 WHERE id=? AND state=? AND move_gen=?`, id, PlacementMoving, gen)
}

// FinishMove ends the committed move of id whose new generation is gen:
// the copy it left is gone. Not an error if it is already finished.
func (s *Store) FinishMove(ctx context.Context, id string, gen int64) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`UPDATE placements SET state='', move_node='', move_gen=0 WHERE id=? AND state=? AND generation=?`), id, PlacementMoved, gen)
	return err
}

// RevertMove undoes the committed move of id whose new generation is gen
// (its new node never took it): back on the node it left, with the
// generation it had there. errdefs.ErrConflict if that move is not in
// that state.
func (s *Store) RevertMove(ctx context.Context, id string, gen int64) error {
	return s.casPlacement(ctx, id, "it is not a move waiting for its new node",
		`UPDATE placements SET state='', node=move_node, generation=move_gen, move_node='', move_gen=0 WHERE id=? AND state=? AND generation=?`,
		id, PlacementMoved, gen)
}

// casPlacement runs a conditional update of one placement; no row
// changed is errdefs.ErrConflict, saying why not.
func (s *Store) casPlacement(ctx context.Context, id, why string, q string, args ...any) error {
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(q), args...)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("%w: sandbox %s: %s", errdefs.ErrConflict, id, why)
	}
	return nil
}

// ListMovesTo returns the moves in progress whose other end is node (the
// placements on node are ListPlacements').
func (s *Store) ListMovesTo(ctx context.Context, node string) ([]Placement, error) {
	return s.placements(ctx, `SELECT `+placementCols+` FROM placements WHERE move_node=? AND state<>'' ORDER BY name`, node)
}

// SetDraining marks node name as draining (it takes no new sandboxes) or
// not; errdefs.ErrNotFound if there is no such node.
func (s *Store) SetDraining(ctx context.Context, name string, draining bool) error {
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`UPDATE nodes SET draining=? WHERE name=?`), boolInt(draining), name)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("node %q: %w", name, errdefs.ErrNotFound)
	}
	return nil
}
