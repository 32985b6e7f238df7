package node

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"sandstorm/internal/store"
)

// The warm pool: sandboxes of a warm template restored ahead of demand
// and paused, so that a create takes one and only resumes and reseeds it.
//
// Why: a restore of the warm image is most of a warm start, and for a
// small app it is as slow as the app's own start. Measured here
// (bench/results/2026-12-01-954c996-systrap, p50): the Python web demo
// starts cold in 194 ms to its first answer, raw `runsc restore` of its
// warm image answers in 105 ms and a warm start in 116 ms (0.60 of cold);
// issue 8 asks for 0.5. A resume is 6 ms (raw-resume/web/runsc), so a
// pooled start is bounded by the reseed and the network, not by runsc.
//
// What a pooled sandbox is before it is taken: its own ID, address slot,
// network namespace, veth, overlay and bundle, restored from the warm
// image, reseeded, and paused. It has no boundary (it has no principal yet):
// the firewall admits nothing from it but the boundary's ports, and
// nothing listens there, so it can reach nothing — and it is paused. It
// has no row in the store, so lists and the tier loop never see it; its
// slot and ID are reserved under the allocation lock, as a create's are,
// so neither an allocation nor the orphan sweep takes them.
//
// Its hostname is set by the restore (gVisor takes it from the spec), so
// it must be known before the name is: it is "sb-<id>", the name a
// sandbox created without one gets. Only such creates take from the pool;
// a create with a name restores the warm image itself (the 0.60 path), so
// every sandbox's hostname is its name. Pooled sandboxes are what the
// node drops first under memory pressure (they are speculation), and a
// pool is refilled only while the node has twice their memory to spare.

// pooled is one sandbox in a warm pool.
type pooled struct {
	id       string
	slot     int
	template string
	limitMiB int64
	made     time.Time
}

// poolName is the name (and hostname) of pooled sandbox id.
func poolName(id string) string { return "sb-" + id }

// poolFillEvery is how often the pools are checked for refilling when no
// take has asked for it (a pool that could not be filled for memory, a
// template newly made warm).
const poolFillEvery = 2 * time.Second

// kickPool asks the pool loop to look at the pools now.
func (n *Node) kickPool() {
	select {
	case n.poolKick <- struct{}{}:
	default:
	}
}

// poolLoop keeps the warm pools filled until Close.
func (n *Node) poolLoop() {
	defer n.done.Done()
	tick := time.NewTicker(poolFillEvery)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		case <-n.poolKick:
		}
		n.fillPools()
	}
}

// fillPools tops up the pool of every warm template with an image this
// runtime can restore, one sandbox at a time, while there is memory to
// spare for it.
func (n *Node) fillPools() {
	if !n.be.Capabilities().Checkpoint || n.Reconciling() > 0 {
		return
	}
	ts, err := n.st.ListTemplates(context.Background())
	if err != nil {
		return
	}
	for _, t := range ts {
		n.renewWarm(t)
		for t.Warm != nil && n.poolLen(t.Name) < t.Warm.Pool && n.warmReady(t.Name) {
			select {
			case <-n.stop:
				return
			default:
			}
			if why := n.poolRoom(t); why != "" {
				n.log.Debug("warm pool not refilled", "template", t.Name, "why", why)
				break
			}
			if err := n.addPooled(t); err != nil {
				n.log.Warn("warm pool: could not restore a sandbox ahead of demand", "template", t.Name, "err", err)
				break
			}
		}
	}
}

// renewWarm makes template t's warm image again, once per run of the
// node, when it was made by another runsc (which cannot restore here: the
// template would start cold from now on) or holds another envd build (it
// restores, with the old envd, and would keep it in every new sandbox).
// This is what an upgrade of either needs.
func (n *Node) renewWarm(t store.Template) {
	if t.Warm == nil {
		return
	}
	l := n.warmLayout(t.Name)
	if _, err := os.Stat(l.WarmImage()); err != nil {
		return
	}
	why := ""
	switch {
	case !n.warmReady(t.Name):
		why = "made by another runsc"
	case n.envd.For(l) != n.envd.Current():
		why = "holds another envd build"
	default:
		return
	}
	n.renewMu.Lock()
	done := n.renewed[t.Name]
	if n.renewed == nil {
		n.renewed = map[string]bool{}
	}
	n.renewed[t.Name] = true
	n.renewMu.Unlock()
	if done {
		return
	}
	n.log.Info("warm image made again", "template", t.Name, "why", why)
	// Not ready while it is made (creates start cold meanwhile): a
	// restore must not take the old image with the new build's spec.
	os.Remove(l.WarmVersion())
	if err := n.PrepareWarm(context.Background(), t); err != nil {
		n.log.Warn("warm image could not be made again; its sandboxes start cold", "template", t.Name, "err", err)
	}
}

// poolRoom says why the node has no room for another pooled sandbox of t
// ("" if it has): one must leave twice its expected memory above the
// reserve and what starting sandboxes were promised, and fit the disk and
// file-descriptor admissions a create passes.
func (n *Node) poolRoom(t store.Template) string {
	if n.cfg.MemReserveMiB > 0 {
		head, err := n.adm.Headroom()
		if err != nil {
			return err.Error()
		}
		want := 2 * n.expectedMiB(t, n.LimitMiB(t, 0))
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

func (n *Node) poolLen(template string) int {
	n.poolMu.Lock()
	defer n.poolMu.Unlock()
	return len(n.pool[template])
}

// PoolSize is how many sandboxes the node's warm pools hold.
func (n *Node) PoolSize() int {
	k := 0
	for _, c := range n.PoolSizes() {
		k += c
	}
	return k
}

// PoolSizes is how many sandboxes each warm template's pool holds.
func (n *Node) PoolSizes() map[string]int {
	n.poolMu.Lock()
	defer n.poolMu.Unlock()
	out := make(map[string]int, len(n.pool))
	for t, p := range n.pool {
		if len(p) > 0 {
			out[t] = len(p)
		}
	}
	return out
}

// addPooled restores one sandbox of warm template t into its pool.
func (n *Node) addPooled(t store.Template) error {
	p := pooled{id: newID(), template: t.Name, limitMiB: n.LimitMiB(t, 0)}
	n.allocMu.Lock()
	slot, err := n.freeSlot(context.Background())
	if err == nil {
		p.slot = slot
		n.reserved[slot] = p.id
	}
	n.allocMu.Unlock()
	if err != nil {
		return err
	}
	sb := store.Sandbox{ID: p.id, Name: poolName(p.id), Template: t.Name, Slot: p.slot, MemoryMiB: int(p.limitMiB)}
	bg := context.Background()
	err = n.layOut(sb, t, n.envd.For(n.warmLayout(t.Name)))
	if err == nil {
		n.dir(sb.ID).Mark("restored from the warm image of template %s ahead of demand (warm pool), paused until a create takes it", t.Name)
		spec := n.spec(sb)
		// Reseeded here, right after its restore, not when a create takes
		// it: what a reseed is for is the state every restore of the image
		// shares, and this sandbox has its own from now on, before anyone
		// uses it. At the take it was on the create's path: 28–60 ms of a
		// pooled create of base (a runsc exec, and the first run of
		// anything after a restore), where the resume alone is ~26.
		if err = n.be.Restore(bg, spec, n.warmLayout(t.Name).WarmImage()); err == nil {
			if err = n.reseed(bg, spec, t); err != nil {
				err = fmt.Errorf("reseed: %w", err)
			}
		}
		if err == nil {
			err = n.be.Pause(bg, spec)
		}
	}
	if err != nil {
		n.discardPooled(p)
		return err
	}
	p.made = time.Now()
	n.poolMu.Lock()
	n.pool[t.Name] = append(n.pool[t.Name], p)
	n.poolMu.Unlock()
	n.log.Debug("warm pool: sandbox ready", "template", t.Name, "id", p.id)
	return nil
}

// refillAfter is how long after a take the pool is refilled. A refill is
// a runsc restore, about 150 ms of both of this node's cores; started at
// the take, it ran beside the very create that took the sandbox (its
// runsc resume took 28–48 ms instead of 10, its reseed 28–60) and beside
// the client's first command, which comes right after. A burst of
// creates is no slower for the wait: the pool refills one at a time.
const refillAfter = 250 * time.Millisecond

// takePooled hands out a pooled sandbox of t with memory limit limitMiB,
// if the pool has one, and asks for the pool to be refilled once the
// create that took it is done (refillAfter).
func (n *Node) takePooled(t store.Template, limitMiB int64) (pooled, bool) {
	n.poolMu.Lock()
	defer n.poolMu.Unlock()
	ps := n.pool[t.Name]
	i := slices.IndexFunc(ps, func(p pooled) bool { return p.limitMiB == limitMiB })
	if i < 0 {
		return pooled{}, false
	}
	p := ps[i]
	n.pool[t.Name] = slices.Delete(ps, i, i+1)
	time.AfterFunc(refillAfter, n.kickPool)
	return p, true
}

// startPooled is a create's start for a pooled sandbox sb: its boundary
// (its principal is known now) and a resume; it was reseeded when it was
// restored (addPooled).
func (n *Node) startPooled(sb store.Sandbox, t store.Template) error {
	bg := context.Background()
	steps := newStepTimer()
	if err := n.boundaryUp(sb); err != nil {
		return err
	}
	steps.mark("boundary")
	n.dir(sb.ID).Mark("taken from the warm pool of template %s (its memory is the template's, reseeded at its restore; its volume new)", t.Name)
	spec := n.spec(sb)
	if err := n.be.Resume(bg, spec); err != nil {
		return fmt.Errorf("resume the pooled sandbox: %w", err)
	}
	steps.mark("runsc_resume")
	n.log.Debug("pooled start steps", append([]any{"id", sb.ID}, steps.attrs()...)...)
	return nil
}

// discardPooled removes a pooled sandbox that was taken from its pool (or
// never made it there) and frees its slot.
func (n *Node) discardPooled(p pooled) {
	err := n.teardown(context.Background(), store.Sandbox{ID: p.id, Slot: p.slot}, true)
	n.allocMu.Lock()
	if n.reserved[p.slot] == p.id {
		delete(n.reserved, p.slot)
	}
	n.allocMu.Unlock()
	if err != nil {
		n.log.Warn("warm pool: removing a pooled sandbox left something behind (the next start's orphan sweep retries)", "id", p.id, "err", err)
	}
}

// drainPool removes every pooled sandbox of template name ("" for all).
func (n *Node) drainPool(name string) int {
	n.poolMu.Lock()
	var out []pooled
	for t, ps := range n.pool {
		if name == "" || t == name {
			out = append(out, ps...)
			delete(n.pool, t)
		}
	}
	n.poolMu.Unlock()
	for _, p := range out {
		n.discardPooled(p)
	}
	return len(out)
}

// dropOnePooled removes the oldest pooled sandbox, if there is one: what
// memory pressure gives up first.
func (n *Node) dropOnePooled(why string) bool {
	n.poolMu.Lock()
	var (
		best pooled
		ok   bool
	)
	for _, ps := range n.pool {
		for _, p := range ps {
			if !ok || p.made.Before(best.made) {
				best, ok = p, true
			}
		}
	}
	if ok {
		ps := n.pool[best.template]
		n.pool[best.template] = slices.DeleteFunc(ps, func(p pooled) bool { return p.id == best.id })
	}
	n.poolMu.Unlock()
	if !ok {
		return false
	}
	n.log.Info("memory: dropping a pooled sandbox", "template", best.template, "id", best.id, "why", why)
	n.discardPooled(best)
	return true
}

// unreserve ends pooled sandbox id's reservation of slot once its row is
// in the store (the slot is the row's from then on). Caller holds allocMu.
func (n *Node) unreserve(slot int, id string) {
	if n.reserved[slot] == id {
		delete(n.reserved, slot)
	}
}

// freeSlot is the lowest address slot no sandbox, pooled sandbox or warm
// build has. Caller holds allocMu.
func (n *Node) freeSlot(ctx context.Context) (int, error) {
	slots, _, err := n.st.UsedSlots(ctx, n.cfg.Name)
	if err != nil {
		return 0, err
	}
	for i := 0; i < n.warmSlot(); i++ { // the last slot is warm builds'
		if _, pooled := n.reserved[i]; !slots[i] && !pooled {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: all %d address slots of %s are taken", ErrFull, n.warmSlot(), n.cfg.Pool.Prefix)
}
