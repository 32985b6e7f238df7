package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/placement"
	"sandstorm/internal/store"
)

// A live move (issue 18): a sandbox whose node answers goes to another
// paired node with its memory and volume, keeping its ID, name and
// principal. The master is its only go-between — the nodes accept calls
// from it alone — and the protocol is a two-phase commit whose one
// decision is a write in the master's store (store.CommitMove):
//
//  1. BeginMove records the move (target T, a new generation g2) on the
//     placement, which is still on S.
//  2. S's MoveOut stream (checkpoint, image, volume) is piped into T's
//     MoveIn: T restores it without a boundary or gateway listeners —
//     nothing can reach it or be reached by it — and S keeps its copy
//     marked MoveOut, never woken or served.
//  3. CommitMove, the commit point: the placement is on T with g2.
//  4. T's MoveCommit gives the sandbox its boundary and endpoints; S's
//     copy is deleted; FinishMove.
//
// Before 3, any failure — of either node, of the link, of this master —
// gives the move up: AbortMove, T's copy dropped (MoveAbort, or T drops
// it itself: a fence, its restart, or its hold running out) and S's
// unmarked, served again. After 3, the move is finished, or, if T lost
// its copy before it was confirmed, undone (RevertMove: S's copy was
// kept for that). A master that dies leaves the placement moving or
// moved; whichever master leads next settles it the same way from the
// nodes' reports (settleMove). So a sandbox never runs as its principal
// on two nodes, and a move cut short leaves it whole on one of them.

// moveMargin bounds the calls that settle a move (MoveCommit, MoveAbort,
// a delete) made from a move or drain that has already given its caller
// up: they are best effort, and settleMove finishes what they do not.
const moveMargin = 30 * time.Second

// draining is the paired nodes being drained: they take no sandboxes.
type draining struct {
	mu    sync.Mutex
	nodes map[string]bool
}

func (d *draining) has(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nodes[name]
}

func (d *draining) set(name string, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nodes == nil {
		d.nodes = map[string]bool{}
	}
	d.nodes[name] = on
}

// LiveMove moves sandbox ref, placed on a node that answers, to another
// node with its memory (to: that node; "": the one with the most headroom
// that takes it). It answers the sandbox where it now runs. A sandbox
// whose node is lost is Move's (a cold start).
func (f *Fleet) LiveMove(ctx context.Context, ref, to string) (api.Sandbox, error) {
	p, err := f.cfg.Store.GetPlacement(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	if p.State != "" {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s is %s on node %s; move it once that is settled", p.Name, stateWords(p.State), p.Node))
	}
	src := f.member(p.Node)
	if src == nil {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("sandbox %s is on node %s, which this master no longer has", p.Name, p.Node))
	}
	if l, ok := f.linkOf(p.Node); !ok || !l.full || l.lost(time.Now()) {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("sandbox %s's node %s does not answer now: a live move needs it (a cold move, POST /v1/sandboxes/%s/move, starts it elsewhere once the node is lost)", p.Name, p.Node, p.ID))
	}
	cands, err := f.moveTargets(ctx, p.Node, to)
	if err != nil {
		return api.Sandbox{}, err
	}
	var refusals []string
	for _, t := range cands {
		sb, err := f.moveTo(ctx, p, src, t)
		if err == nil {
			return sb, nil
		}
		if !errors.Is(err, errTryNext) {
			return api.Sandbox{}, err
		}
		refusals = append(refusals, t.Name()+": "+err.Error())
	}
	return api.Sandbox{}, errdefs.Mark(errdefs.ErrNoRoom, fmt.Errorf("no node takes sandbox %s now (it stays on %s): %s", p.Name, p.Node, strings.Join(refusals, "; ")))
}

// errTryNext marks a move its target refused before it made anything (no
// room, or what it lacks): given up cleanly, the next target may take it.
var errTryNext = errors.New("try the next node")

func stateWords(s string) string {
	switch s {
	case store.PlacementCreating:
		return "being created"
	case store.PlacementDeleting:
		return "being deleted"
	case store.PlacementMoving, store.PlacementMoved:
		return "being moved"
	}
	return s
}

// moveTargets is the nodes a sandbox leaving from may go to, in the
// order to try them (placement.ForMove): those that answer and are not
// draining; to, if set, alone.
func (f *Fleet) moveTargets(ctx context.Context, from, to string) ([]nodeapi.Node, error) {
	if to != "" {
		n := f.member(to)
		switch {
		case to == from:
			return nil, errdefs.New(errdefs.ErrBadInput, "sandbox is on node %s already", to)
		case n == nil:
			return nil, errdefs.New(errdefs.ErrNotFound, "node %q: not a node of this master", to)
		case f.draining.has(to):
			return nil, errdefs.New(errdefs.ErrConflict, "node %s is draining: it takes no sandboxes", to)
		}
		return []nodeapi.Node{n}, nil
	}
	var cands []placement.Candidate
	for _, st := range f.placementStatuses(ctx) {
		cands = append(cands, placement.Candidate{Name: st.Name, AvailableMiB: st.MemAvailableMiB, ReserveMiB: st.MemReserveMiB,
			PromisedMiB: st.PromisedMiB, Lost: st.State == "lost", Draining: f.draining.has(st.Name)})
	}
	var out []nodeapi.Node
	for _, c := range placement.ForMove(cands, from) {
		if n := f.member(c.Name); n != nil {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errdefs.Mark(errdefs.ErrNoRoom, fmt.Errorf("no other node answers and takes sandboxes now, so nothing can leave node %s", from))
	}
	return out, nil
}

// moveTo is one attempt of the protocol above, to node t.
func (f *Fleet) moveTo(ctx context.Context, p store.Placement, src, t nodeapi.Node) (api.Sandbox, error) {
	st := f.cfg.Store
	bg := context.WithoutCancel(ctx)
	gen, err := f.fly.begin(ctx, f.cfg.Store)
	if err != nil {
		return api.Sandbox{}, err
	}
	// The move is in flight (settleMove leaves it alone) until it has
	// landed: answered, or — once confirmed — its old copy deleted too,
	// which happens after the answer (cleanup, below).
	landed := true
	defer func() {
		if landed {
			f.fly.landed(gen)
		}
	}()
	if err := st.BeginMove(ctx, p.ID, t.Name(), gen); err != nil {
		return api.Sandbox{}, err
	}
	began := time.Now()
	f.cfg.Log.Info("move: begun", "name", p.Name, "id", p.ID, "from", p.Node, "to", t.Name(), "generation", gen)
	pr, pw := io.Pipe()
	var outErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		outErr = src.MoveOut(ctx, p.ID, gen, pw)
		pw.CloseWithError(outErr)
	}()
	sb, inErr := t.MoveIn(ctx, gen, pr)
	// MoveIn has returned: whatever S still writes goes nowhere.
	pr.CloseWithError(errors.New("the node it went to answered"))
	wg.Wait()
	if inErr != nil {
		// Phase 1 failed: given up on both. T's copy, if it made one and
		// its answer was lost, has no way in or out and is dropped (here,
		// or by T itself); S's is served again.
		if err := st.AbortMove(bg, p.ID, gen); err == nil {
			f.abortOn(bg, t, p.ID, gen)
			f.abortOn(bg, src, p.ID, gen)
		}
		why := inErr
		if outErr != nil && !errors.Is(inErr, errdefs.ErrBadInput) {
			why = fmt.Errorf("%w (its node %s: %v)", inErr, p.Node, outErr)
		}
		f.cfg.Log.Warn("move: given up; the sandbox stays where it was", "name", p.Name, "id", p.ID, "from", p.Node, "to", t.Name(), "generation", gen, "err", why)
		err := fmt.Errorf("move of %s to %s: %w; it stays on %s", p.Name, t.Name(), why, p.Node)
		if outErr == nil && (errors.Is(inErr, errdefs.ErrNoRoom) || errors.Is(inErr, errdefs.ErrPrecondition)) && !errors.Is(inErr, errdefs.ErrUnavailable) {
			return api.Sandbox{}, errdefs.Mark(errTryNext, err)
		}
		return api.Sandbox{}, err
	}
	moved := time.Since(began)
	if err := st.CommitMove(bg, p.ID, gen); err != nil {
		if q, gerr := st.GetPlacement(bg, p.ID); gerr != nil || q.State != store.PlacementMoved || q.Generation != gen {
			// Not committed (or not known: then the move stays
			// "moving", which settleMove gives up once this one has
			// landed).
			if st.AbortMove(bg, p.ID, gen) == nil {
				f.abortOn(bg, t, p.ID, gen)
				f.abortOn(bg, src, p.ID, gen)
			}
			return api.Sandbox{}, fmt.Errorf("move of %s to %s: recording it: %w; it stays on %s", p.Name, t.Name(), err, p.Node)
		}
	}
	// Committed: the sandbox is T's from here on.
	live, err := f.confirmMove(bg, p.ID, p.Name, t, src, gen)
	if err != nil {
		return api.Sandbox{}, err
	}
	f.cfg.Log.Info("move: done", "name", p.Name, "id", p.ID, "from", p.Node, "to", t.Name(), "tier", sb.Tier,
		"generation", gen, "ms", time.Since(began).Milliseconds(), "stream_ms", moved.Milliseconds())
	// The old copy is deleted after the answer: it has been marked
	// leaving since its MoveOut (never woken, served or tiered) and is
	// fenced, and deleting it — runsc delete, its image and volume gone —
	// was on every move's path for nothing the caller waits on. A master
	// that dies first leaves the move "moved", which settleMove finishes.
	landed = false
	go func() {
		defer f.fly.landed(gen)
		f.cleanupMove(bg, p.ID, src, gen)
	}()
	return live, nil
}

// finishMove is phase 2 of a committed move of generation gen: the copy
// on t is confirmed, the one on src deleted, the move finished. If t no
// longer has its copy (it dropped it before the confirmation came), the
// move is undone and the sandbox stays on src.
func (f *Fleet) finishMove(ctx context.Context, id, name string, t, src nodeapi.Node, gen int64) (api.Sandbox, error) {
	live, err := f.confirmMove(ctx, id, name, t, src, gen)
	if err != nil {
		return api.Sandbox{}, err
	}
	// Its new copy serves from now: the ingresses' routes follow.
	f.cfg.changed()
	f.cleanupMove(ctx, id, src, gen)
	return live, nil
}

// confirmMove makes the copy on t live (MoveCommit), or undoes the move
// if t no longer has it.
func (f *Fleet) confirmMove(ctx context.Context, id, name string, t, src nodeapi.Node, gen int64) (api.Sandbox, error) {
	st := f.cfg.Store
	cctx, cancel := context.WithTimeout(ctx, moveMargin)
	live, err := t.MoveCommit(cctx, id, gen)
	cancel()
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if rerr := st.RevertMove(ctx, id, gen); rerr != nil {
			return api.Sandbox{}, rerr
		}
		f.abortOn(ctx, src, id, gen)
		f.cfg.Log.Warn("move: its new node had dropped the sandbox before the confirmation; it stays where it was", "name", name, "id", id, "to", t.Name(), "generation", gen)
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("move of %s: node %s dropped it before it was confirmed; it stays on %s", name, t.Name(), src.Name()))
	case err != nil:
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("sandbox %s moved to %s, which did not answer its confirmation (%v): it is confirmed once %s answers, and its copy on %s kept until then", name, t.Name(), err, t.Name(), src.Name()))
	}
	// The master's view is the new node's from the answer on. The
	// reports are kept one per ID, and t's own report of it was not
	// taken while the copy it left was still reported by src: without
	// this a GET right after the move showed src (TestDrain at b16b66e).
	if err := st.MoveReported(ctx, t.Name(), live); err != nil {
		f.cfg.Log.Warn("move: done, but the master's view of it still shows its old node until its new node reports it", "id", id, "err", err)
	}
	return live, nil
}

// cleanupMove deletes the copy a confirmed move left on src and records
// the move finished; a copy not deleted now (src does not answer) is
// deleted when settleMove finds the move still unfinished.
func (f *Fleet) cleanupMove(ctx context.Context, id string, src nodeapi.Node, gen int64) {
	st := f.cfg.Store
	dctx, cancel := context.WithTimeout(ctx, moveMargin)
	err := src.Delete(dctx, id)
	cancel()
	if err == nil || errors.Is(err, errdefs.ErrNotFound) {
		if err := st.FinishMove(ctx, id, gen); err != nil {
			f.cfg.Log.Warn("move: done, but not recorded as finished; settled later", "id", id, "err", err)
		}
	} else {
		f.cfg.Log.Warn("move: the copy left behind was not deleted yet (it never runs); deleted once its node answers", "id", id, "node", src.Name(), "err", err)
	}
}

// abortOn gives move gen of id up on node n, best effort (settleMove and
// the node's own rules finish it otherwise).
func (f *Fleet) abortOn(ctx context.Context, n nodeapi.Node, id string, gen int64) {
	actx, cancel := context.WithTimeout(ctx, moveMargin)
	defer cancel()
	if err := n.MoveAbort(actx, id, gen); err != nil {
		f.cfg.Log.Warn("move: could not give it up on a node now; it is settled when the node answers", "node", n.Name(), "id", id, "generation", gen, "err", err)
	}
}

// settleMove settles a move this master has not under way (it died, or
// a call's answer was lost), from the store and the nodes that answer: a
// move before its commit point is given up, one after it is finished or,
// if its new node has lost its copy, undone.
func (f *Fleet) settleMove(ctx context.Context, p store.Placement) {
	if f.fly.all()[p.Generation] || f.fly.all()[p.MoveGen] {
		return
	}
	switch p.State {
	case store.PlacementMoving:
		// Node p.Node, move of generation p.MoveGen to p.MoveNode. Only
		// if this write gives it up (p may be stale: the move may have
		// been committed since it was read) are its nodes told so.
		if err := f.cfg.Store.AbortMove(ctx, p.ID, p.MoveGen); err != nil {
			return
		}
		f.cfg.Log.Info("move: one left unfinished is given up; the sandbox stays where it was", "name", p.Name, "id", p.ID, "node", p.Node, "to", p.MoveNode, "generation", p.MoveGen)
		if t := f.member(p.MoveNode); t != nil {
			f.abortOn(ctx, t, p.ID, p.MoveGen)
		}
		if s := f.member(p.Node); s != nil {
			f.abortOn(ctx, s, p.ID, p.MoveGen)
		}
	case store.PlacementMoved:
		t, s := f.member(p.Node), f.member(p.MoveNode)
		if t == nil || s == nil {
			return
		}
		if _, err := f.finishMove(ctx, p.ID, p.Name, t, s, p.Generation); err == nil {
			f.cfg.Log.Info("move: one left unfinished is finished", "name", p.Name, "id", p.ID, "node", p.Node, "from", p.MoveNode, "generation", p.Generation)
		}
	}
}

// Drain stops placing sandboxes on node name and moves each of
// its sandboxes to another node with its memory, drainParallel at a
// time, telling each (and then the sum) to each as it goes. A node
// already draining is drained again: what a drain cut short left is
// moved now.
func (f *Fleet) Drain(ctx context.Context, name string, each func(api.DrainEvent)) (api.DrainEvent, error) {
	if f.member(name) == nil {
		return api.DrainEvent{}, errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("node %q: not found", name))
	}
	if err := f.setDraining(ctx, name, true); err != nil {
		return api.DrainEvent{}, err
	}
	f.cfg.Log.Info("node draining: it takes no new sandboxes, and its own are moved off", "node", name)
	ps, err := f.cfg.Store.ListPlacements(ctx, name)
	if err != nil {
		return api.DrainEvent{}, err
	}
	var mu sync.Mutex
	sum := api.DrainEvent{Done: true}
	sem := make(chan struct{}, drainParallel)
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ev := api.DrainEvent{Sandbox: p.Name, ID: p.ID, From: name}
			began := time.Now()
			sb, err := f.LiveMove(ctx, p.ID, "")
			ev.Ms = float64(time.Since(began).Microseconds()) / 1000
			if err != nil {
				ev.Error = err.Error()
			} else {
				ev.To, ev.Tier = sb.Node, sb.Tier
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				sum.Failed++
			} else {
				sum.Moved++
			}
			each(ev)
		}()
	}
	wg.Wait()
	left, err := f.cfg.Store.CountPlacements(context.WithoutCancel(ctx), name)
	sum.Left = left
	return sum, err
}

// setDraining marks node name draining or not: in the store for a
// paired node (its row there keeps the mark across restarts), in memory
// only for the node in this process, which has no row (a restart of the
// process starts it taking work again).
func (f *Fleet) setDraining(ctx context.Context, name string, on bool) error {
	f.mu.RLock()
	_, paired := f.nodes[name].(*remote.Client)
	f.mu.RUnlock()
	if paired {
		if err := f.cfg.Store.SetDraining(ctx, name, on); err != nil {
			return err
		}
	}
	f.draining.set(name, on)
	return nil
}

// drainParallel is how many moves a drain runs at once: each is a
// checkpoint on the node drained and a restore on another, CPU and disk
// bound; two keep both ends busy without crowding a small node.
const drainParallel = 2

// Undrain makes node name take new sandboxes again.
func (f *Fleet) Undrain(ctx context.Context, name string) error {
	if f.member(name) == nil {
		return errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("node %q: not found", name))
	}
	if err := f.setDraining(ctx, name, false); err != nil {
		return err
	}
	f.cfg.Log.Info("node undrained: it takes new sandboxes again", "node", name)
	return nil
}

// unstick lets sandbox id stay on node when the node reports it leaving
// by move gen but no move of it is under way: its mark was set after its
// move had been given up (the node's MoveOut started after the master's
// call had already ended). The placement is on node and settled, so no
// other node can be confirmed with it: the copy here is the sandbox. The
// abort names gen, so it cannot clear the mark of a later move.
func (f *Fleet) unstick(ctx context.Context, node, id string, gen int64) {
	p, err := f.cfg.Store.GetPlacement(ctx, id)
	if err != nil || p.Node != node || p.State != "" || gen <= 0 || f.fly.all()[gen] {
		return
	}
	n := f.member(node)
	if n == nil {
		return
	}
	f.cfg.Log.Warn("move: a sandbox its node holds as leaving has no move under way; it stays", "node", node, "id", id, "generation", gen)
	f.abortOn(context.WithoutCancel(ctx), n, id, gen)
}

// Answers reports whether sandboxes on node can be moved live: its
// reports are in and current. A node not heard from yet is asked.
func (f *Fleet) Answers(node string) bool {
	if l, ok := f.linkOf(node); ok && !l.heard.IsZero() {
		return !l.lost(time.Now())
	}
	if n := f.member(node); n != nil {
		return f.liveStatus(context.Background(), n).State != "lost"
	}
	return false
}
