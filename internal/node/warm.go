package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/node/tiering"
	"sandstorm/internal/node/warm"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// Warm templates (internal/node/warm): their images and pools are that
// package's; here is what the node does for them — the slot a build runs
// in, a sandbox's start from an image, and a pooled sandbox's making,
// taking and removal, which are the node's own sandboxes' operations.

// newWarm makes the node's warm images and pools.
func (n *Node) newWarm() {
	n.warm = warm.NewImages(warm.ImagesConfig{
		DataDir: n.cfg.DataDir, Backend: n.be, Mark: n.cfg.SAM.Firewall.IngressMark, Ready: n.cfg.Ready,
		Net:     func(id string) (netns.Net, error) { return n.h.Net(id, n.cfg.Pool.Size()-1) },
		Runtime: func() string { return imageRuntime(n.be, n.kept) }, Log: n.log,
	})
	n.pool = warm.NewPool(warmCore{n}, n.log)
}

// imageRuntime names the runtime images are made with ("" if the
// backend cannot say): with the build's key, as two builds can claim one
// version, and an image restores safely only on the build that wrote it.
func imageRuntime(be sandbox.Backend, kept *runtimes.Keeper) string {
	v := runtimeOf(be)
	if k := kept.Current(); v != "" && k != "" {
		return v + " " + string(k)
	}
	return v
}

// PrepareWarm makes template t's warm image (warm.Images.Build), after
// removing the pool of any older one (a template registered again). It
// fails when the backend cannot checkpoint.
func (n *Node) PrepareWarm(ctx context.Context, t store.Template) error {
	if t.Warm == nil {
		return nil
	}
	if !n.be.Capabilities().Checkpoint {
		return fmt.Errorf("%w: the %s backend cannot checkpoint, so it has no warm templates", errdefs.ErrBadInput, n.be.Name())
	}
	n.pool.Drain(t.Name)
	if err := n.warm.Build(ctx, t, n.LimitMiB(t, 0), n.envd.Current()); err != nil {
		return err
	}
	n.pool.Kick()
	return nil
}

// DropWarm removes template name's pool, warm image and build directory.
func (n *Node) DropWarm(name string) {
	n.pool.Drain(name)
	n.warm.Drop(name)
}

// removeOrphanWarm removes warm build directories no template owns (a
// template deleted while the node was down, or a build cut short by a
// crash before its template was refused).
func (n *Node) removeOrphanWarm(ctx context.Context) {
	for _, name := range n.warm.Names() {
		t, err := n.st.GetTemplate(ctx, name)
		if err == nil && t.Warm != nil {
			continue
		}
		if errors.Is(err, errdefs.ErrNotFound) || err == nil {
			n.log.Info("reconcile: removing a warm image no template owns", "template", name)
			n.DropWarm(name)
		}
	}
}

// warmStart is coldStart for a warm template: the sandbox's own overlay,
// network and bundle, then a restore of the template's warm image and the
// reseed. It reports false (and does nothing) when there is no image this
// runtime can restore; the caller then starts cold.
func (n *Node) warmStart(ctx context.Context, sb store.Sandbox, t store.Template) (bool, error) {
	if t.Warm == nil || !n.warm.Ready(t.Name) {
		return false, nil
	}
	if err := n.h.Prepare(sb, t, n.envd.For(n.warm.Dir(t.Name))); err != nil {
		return true, err
	}
	d := n.h.Dir(sb.ID)
	d.Mark("started from the warm image of template %s (its memory is the template's, reseeded; its volume new)", t.Name)
	spec := n.h.Spec(sb)
	if err := n.be.Restore(ctx, spec, n.warm.Dir(t.Name).WarmImage()); err != nil {
		return true, fmt.Errorf("restore the warm image of %s: %w", t.Name, err)
	}
	if err := warm.Reseed(ctx, n.be, spec, t); err != nil {
		return true, fmt.Errorf("reseed: %w", err)
	}
	return true, nil
}

// startPooled is a create's start for a pooled sandbox sb: its boundary
// (its principal is known now) and a resume; it was reseeded when it was
// restored (warmCore.Make).
func (n *Node) startPooled(sb store.Sandbox, t store.Template) error {
	steps := tiering.NewSteps()
	if err := n.h.BoundaryUp(sb); err != nil {
		return err
	}
	steps.Mark("boundary")
	n.h.Dir(sb.ID).Mark("taken from the warm pool of template %s (its memory is the template's, reseeded at its restore; its volume new)", t.Name)
	if err := n.be.Resume(context.Background(), n.h.Spec(sb)); err != nil {
		return fmt.Errorf("resume the pooled sandbox: %w", err)
	}
	steps.Mark("runsc_resume")
	n.log.Debug("pooled start steps", append([]any{"id", sb.ID}, steps.Attrs()...)...)
	return nil
}

// freeSlot is the lowest address slot no sandbox, pooled sandbox or warm
// build has. Caller holds allocMu.
func (n *Node) freeSlot(ctx context.Context) (int, error) {
	slots, _, err := n.st.UsedSlots(ctx, n.cfg.Name)
	if err != nil {
		return 0, err
	}
	warmSlot := n.cfg.Pool.Size() - 1 // the last slot is warm builds'
	for i := 0; i < warmSlot; i++ {
		if _, pooled := n.reserved[i]; !slots[i] && !pooled {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: all %d address slots of %s are taken", ErrFull, warmSlot, n.cfg.Pool.Prefix)
}

// warmCore is the node as its warm pool's core (warm.Core).
type warmCore struct{ n *Node }

// Templates lists the templates whose pools may be filled now: none
// while the backend cannot checkpoint or the node is reconciling; warm
// images this run cannot restore (or that hold an old envd) are made
// again first, once per run.
func (c warmCore) Templates() []store.Template {
	n := c.n
	if !n.be.Capabilities().Checkpoint || int(n.reconciling.Load()) > 0 {
		return nil
	}
	ts, err := n.st.ListTemplates(context.Background())
	if err != nil {
		return nil
	}
	for _, t := range ts {
		if why := n.warm.Stale(t, n.envd.For, n.envd.Current()); why != "" {
			n.log.Info("warm image made again", "template", t.Name, "why", why)
			if err := n.PrepareWarm(context.Background(), t); err != nil {
				n.log.Warn("warm image could not be made again; its sandboxes start cold", "template", t.Name, "err", err)
			}
		}
	}
	return ts
}

func (c warmCore) Ready(name string) bool { return c.n.warm.Ready(name) }

// Room: one must leave twice its expected memory above the reserve and
// what starting sandboxes were promised, and fit the disk and
// file-descriptor admissions a create passes.
func (c warmCore) Room(t store.Template) string {
	n := c.n
	if n.cfg.MemReserveMiB > 0 {
		head, err := n.adm.Headroom()
		if err != nil {
			return err.Error()
		}
		want := 2 * n.adm.Expected(reserve.SizeKey(t), n.LimitMiB(t, 0))
		if head < want {
			return fmt.Sprintf("%d MiB of headroom, want %d", head, want)
		}
	}
	if err := n.adm.Disk("a pooled sandbox", 0); err != nil {
		return err.Error()
	}
	if err := n.adm.FDs(); err != nil {
		return err.Error()
	}
	return ""
}

// Make restores one sandbox of warm template t, reseeds and pauses it,
// its slot and ID reserved under the allocation lock.
func (c warmCore) Make(t store.Template) (warm.Pooled, error) {
	n := c.n
	p := warm.Pooled{ID: newID(), Template: t.Name, LimitMiB: n.LimitMiB(t, 0)}
	n.allocMu.Lock()
	slot, err := n.freeSlot(context.Background())
	if err == nil {
		p.Slot = slot
		n.reserved[slot] = p.ID
	}
	n.allocMu.Unlock()
	if err != nil {
		return p, err
	}
	sb := store.Sandbox{ID: p.ID, Name: warm.PooledName(p.ID), Template: t.Name, Slot: p.Slot, MemoryMiB: int(p.LimitMiB)}
	bg := context.Background()
	err = n.h.LayOut(sb, t, n.envd.For(n.warm.Dir(t.Name)))
	if err == nil {
		n.h.Dir(sb.ID).Mark("restored from the warm image of template %s ahead of demand (warm pool), paused until a create takes it", t.Name)
		spec := n.h.Spec(sb)
		// Reseeded here, right after its restore, not when a create takes
		// it: what a reseed is for is the state every restore of the image
		// shares, and this sandbox has its own from now on, before anyone
		// uses it. At the take it was on the create's path: 28–60 ms of a
		// pooled create of base (a runsc exec, and the first run of
		// anything after a restore), where the resume alone is ~26.
		if err = n.be.Restore(bg, spec, n.warm.Dir(t.Name).WarmImage()); err == nil {
			if err = warm.Reseed(bg, n.be, spec, t); err != nil {
				err = fmt.Errorf("reseed: %w", err)
			}
		}
		if err == nil {
			err = n.be.Pause(bg, spec)
		}
	}
	if err != nil {
		c.Discard(p)
		return p, err
	}
	p.Made = time.Now()
	return p, nil
}

// Discard removes a pooled sandbox that was taken from its pool (or never
// made it there) and frees its slot.
func (c warmCore) Discard(p warm.Pooled) {
	n := c.n
	err := n.h.Teardown(context.Background(), store.Sandbox{ID: p.ID, Slot: p.Slot}, true)
	n.allocMu.Lock()
	if n.reserved[p.Slot] == p.ID {
		delete(n.reserved, p.Slot)
	}
	n.allocMu.Unlock()
	if err != nil {
		n.log.Warn("warm pool: removing a pooled sandbox left something behind (the next start's orphan sweep retries)", "id", p.ID, "err", err)
	}
}
