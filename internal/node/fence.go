package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/store"
)

// Fencing (issue 14: "a sandbox runs in one place"; the rule is written
// down in docs/ARCHITECTURE.md, "One place"). A master numbers every
// placement it makes — a create, a clone — with a generation from one
// counter in its store (store.NextGeneration, shared by every master on
// one database), and the node stores the number with the sandbox. Each
// time the master hears the node's full report it answers with a fence:
// the highest generation it had handed out when it looked (G), the IDs it
// placed on this node, and the generations of the creates it still has in
// flight. Then, on the node:
//
//   - a sandbox whose generation is at most G, that the master did not
//     name and that is not one of its in-flight creates, is not the
//     master's: it never runs again (Retire);
//   - a create whose generation is at most G and not in flight is one the
//     master has given up on (its caller was told it failed, or its master
//     died): it is refused, so a request that arrives late cannot make a
//     twin of a sandbox already made elsewhere.
//
// A generation above G was handed out after the master looked, so nothing
// is known of it and it is left alone. This is a fencing token in the
// sense of a lock service's (Chubby's sequencers): the node checks the
// number before it runs anything the master might have moved since. Like
// any such scheme it works only once the node hears the master: a node cut
// off from its master goes on running what it has (the agents on it keep
// working), which is why a move while a node is lost is a risk the API
// states.

// fenceCounter is the store counter that keeps a node's G across restarts
// (the master's is "generation", in the master's store).
const fenceCounter = "fence"

// fenceMark is the last fence the master set. Under allocMu.
type fenceMark struct {
	gen      int64
	inFlight map[int64]bool
}

// fenced refuses a create of generation gen that the last fence gave up
// on. Caller holds allocMu.
func (n *Node) fenced(gen int64) error {
	if gen > 0 && gen <= n.fence.gen && !n.fence.inFlight[gen] {
		return fmt.Errorf("%w: this create (generation %d) was given up by the master before it arrived (fenced at %d); the master decides again where it goes", errdefs.ErrConflict, gen, n.fence.gen)
	}
	return nil
}

// Fence applies a master's fence (above): gen is G, keep the IDs it
// placed here, inFlight the generations of its creates still running. It
// returns the sandboxes it retired. The marking is durable before it
// returns — from then on they take no traffic in or out (their gateway
// listeners and boundary are closed) and never wake — and their processes
// are stopped behind it (Retire), so a master hearing a node with many of
// them is not held up.
func (n *Node) Fence(ctx context.Context, gen int64, keep []string, inFlight []int64) ([]string, error) {
	kept := make(map[string]bool, len(keep))
	for _, id := range keep {
		kept[id] = true
	}
	flying := make(map[int64]bool, len(inFlight))
	for _, g := range inFlight {
		flying[g] = true
	}
	n.allocMu.Lock()
	if err := n.st.RaiseCounter(ctx, fenceCounter, gen); err != nil {
		n.allocMu.Unlock()
		return nil, err
	}
	if gen > n.fence.gen {
		n.fence.gen = gen
	}
	n.fence.inFlight = flying
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	var retired, moved []store.Sandbox
	for _, sb := range all {
		if err != nil || sb.LeftBehind || sb.Generation > gen || kept[sb.ID] || flying[sb.Generation] {
			continue
		}
		if sb.MoveIn || sb.MoveOut != 0 {
			// One end of a live move its master no longer has under way
			// (move.go): an arrived copy never confirmed, or the copy a
			// finished move left. Either is a copy of a sandbox that is
			// whole elsewhere: removed, volume and all, never kept.
			moved = append(moved, sb)
			continue
		}
		var m store.Sandbox
		m, err = n.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error {
			s.LeftBehind = true
			// A principal that no policy binds: whoever it was is the live
			// copy's now.
			s.Principal = "left-behind." + s.ID
			s.Note = "left behind: its master had not placed it on this node (a create cut short, or a move while the node was lost); it was stopped and does not run again"
			return nil
		})
		if err == nil {
			retired = append(retired, m)
		}
	}
	n.allocMu.Unlock()
	ids := make([]string, 0, len(retired)+len(moved))
	for _, sb := range moved {
		ids = append(ids, sb.ID)
		n.gw.Close(sb.ID)
		n.bounds.Down(sb.ID)
		n.log.Warn("fenced: one end of a move its master no longer has is removed", "id", sb.ID, "name", sb.Name, "generation", sb.Generation, "move_out", sb.MoveOut, "fence", gen)
		go func() {
			if err := n.dropMoveIn(context.Background(), sb, "fenced", false); err != nil {
				n.log.Error("fenced move copy not removed; the next fence retries", "id", sb.ID, "err", err)
			}
		}()
	}
	for _, sb := range retired {
		n.gw.Close(sb.ID)
		n.bounds.Down(sb.ID)
		ids = append(ids, sb.ID)
		n.log.Warn("fenced: a sandbox its master did not place here is stopped", "id", sb.ID, "name", sb.Name, "generation", sb.Generation, "fence", gen)
		n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
		go func() {
			if err := n.Retire(context.Background(), sb.ID); err != nil {
				n.log.Error("fenced sandbox not stopped; the next start retries", "id", sb.ID, "err", err)
			}
		}()
	}
	return ids, err
}

// Retire stops a left-behind sandbox for good: deleted if its volume holds
// nothing the sandbox wrote, else detached (processes, network and memory
// gone, the volume kept until someone deletes it).
func (n *Node) Retire(ctx context.Context, id string) error {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if !sb.LeftBehind {
		return fmt.Errorf("%w: sandbox %s is not left behind", errdefs.ErrConflict, id)
	}
	if !holdsData(n.h.Dir(sb.ID).Upper()) {
		err := n.Delete(ctx, sb.ID)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	}
	note := sb.Note
	if _, err := n.Detach(ctx, sb.ID); err != nil {
		return err
	}
	_, err = n.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error {
		s.Note = note + "; its volume holds files, so it is kept detached: delete it by its ID (" + s.ID + ") when they are no longer wanted"
		return nil
	})
	n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	return err
}

// holdsData reports whether a sandbox's volume (its overlay's upper dir)
// has anything in it but what the node itself writes there (the resolver
// file pointing at its boundary, and the directories leading to it).
func holdsData(upper string) bool {
	ours := filepath.Join(upper, "etc", "resolv.conf")
	found := false
	filepath.WalkDir(upper, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found {
			return fs.SkipAll
		}
		if d.IsDir() || path == ours {
			return nil
		}
		found = true
		return fs.SkipAll
	})
	return found
}

// ensureRetired is what a restart does with a left-behind sandbox: it
// never comes back up, whatever its processes were doing when the node
// stopped (a fence whose Retire had not finished).
func (n *Node) ensureRetired(ctx context.Context, sb store.Sandbox) error {
	n.h.Teardown(ctx, sb, false)
	os.RemoveAll(n.h.Dir(sb.ID).Snapshot())
	os.RemoveAll(n.h.Dir(sb.ID).SnapTmp())
	if !holdsData(n.h.Dir(sb.ID).Upper()) {
		n.h.Teardown(ctx, sb, true)
		n.tiers.Forget(sb.ID)
		return n.st.DeleteSandbox(ctx, sb.ID)
	}
	_, err := n.tiers.Commit(sb.ID, api.TierDetached, nil)
	return err
}
