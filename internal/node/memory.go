package node

import (
	"context"
	"fmt"
	"path/filepath"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// Memory and disk (issue 7): internal/node/reserve keeps the node's
// reserves; here are the sandboxes' sizes the node admits them at, and
// the node as the reserve guard's core.

// DaemonOOMScoreAdj is sandstormd's and sam-node's oom_score_adj: the
// kernel's OOM killer takes the highest score first, and every sandbox's
// is layout.SandboxOOMScoreAdj.
const DaemonOOMScoreAdj = -900

// newReserves makes the node's admission and the guard of its reserves.
func (n *Node) newReserves() {
	cfg := n.cfg
	diskFree := cfg.DiskFree
	if diskFree == nil {
		diskFree = func() (int64, error) { return reserve.DiskFree(cfg.DataDir) }
	}
	n.settled = reserve.LoadSettled(filepath.Join(cfg.DataDir, "settled-sizes.json"), n.log)
	var guard *reserve.Guard
	n.adm = admission.New(admission.Config{
		MemReserveMiB: cfg.MemReserveMiB, MemAvailable: cfg.MemAvailable, Held: n.heldMiB,
		DiskReserveMiB: cfg.DiskReserveMiB, DiskFree: diskFree, DataDir: cfg.DataDir, FDs: processFDs,
		Settled: n.settled.Sizes(), Learned: n.settled.Learned, Keep: func() int64 { return guard.KeepMiB() },
	})
	guard = reserve.New(reserve.Config{
		MemReserveMiB: cfg.MemReserveMiB, MemAvailable: cfg.MemAvailable, Admission: cfg.Admission,
		DiskReserveMiB: cfg.DiskReserveMiB, DiskFree: diskFree,
		Starting: n.adm.Starting, Settle: n.adm.Settle, Log: n.log,
	}, reserveCore{n})
	n.guard = guard
	n.diskFree = diskFree
}

// LimitMiB is the memory limit a new sandbox of t gets: override, else the
// template's, else the node's default.
func (n *Node) LimitMiB(t store.Template, override int) int64 {
	switch {
	case override > 0:
		return int64(override)
	case t.MemoryMiB > 0:
		return int64(t.MemoryMiB)
	}
	return n.cfg.DefaultMemoryMiB
}

// limitOf is sb's memory limit (stored at create; older rows: the
// template's or the default).
func (n *Node) limitOf(sb store.Sandbox, t store.Template) int64 {
	if sb.MemoryMiB > 0 {
		return int64(sb.MemoryMiB)
	}
	return n.LimitMiB(t, 0)
}

// expectedMiB is what a new sandbox of template t with limit limit is
// admitted at.
func (n *Node) expectedMiB(t store.Template, limit int64) int64 {
	return n.adm.Expected(sizeKey(t), limit)
}

// sizeKey names what a template's sandboxes settle at: its name and its
// rootfs's digest, so a template made again with another program learns
// its size again instead of inheriting the old one's.
func sizeKey(t store.Template) string { return t.Name + "@" + t.Digest }

// heldMiB is what sandbox id takes from MemAvailable
// (admission.Config.Held): its memory cgroup's usage less its page cache
// (sandbox.MemoryReporter.Taken says why).
func (n *Node) heldMiB(id string) (int64, bool) {
	r, ok := n.be.(sandbox.MemoryReporter)
	if !ok {
		return 0, false
	}
	b, err := r.Taken(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		return 0, false
	}
	return b >> 20, true
}

// imageMiB estimates the checkpoint image of a sandbox: at most what its
// memory cgroup holds (the image is its memory, compressed by this runsc).
func (n *Node) imageMiB(id string) int64 {
	held, _, ok := reserveCore{n}.Usage(id)
	if !ok || held <= 0 {
		return 64
	}
	return held
}

// protect sets the OOM score of a sandbox that just started or woke.
func (n *Node) protect(sb store.Sandbox) {
	if s, ok := n.be.(sandbox.OOMScorer); ok {
		if err := s.SetOOMScore(context.Background(), n.spec(sb), layout.SandboxOOMScoreAdj); err != nil {
			n.log.Warn("cannot set the OOM score of a sandbox", "id", sb.ID, "err", err)
		}
	}
}

// reserveCore is the node as the reserve guard's core (reserve.Core).
type reserveCore struct{ n *Node }

func (c reserveCore) Views() []tier.View        { return c.n.views() }
func (c reserveCore) Connections(id string) int { return c.n.gw.Active(id) }
func (c reserveCore) CanCheckpoint() bool       { return c.n.be.Capabilities().Checkpoint }
func (c reserveCore) DropPooled(why string) bool {
	return c.n.pool.DropOldest(why)
}

// Usage reads sandbox id's memory cgroup; 0 when the backend cannot say.
func (c reserveCore) Usage(id string) (int64, sandbox.MemStat, bool) {
	r, ok := c.n.be.(sandbox.MemoryReporter)
	if !ok {
		return 0, sandbox.MemStat{}, false
	}
	ms, err := r.Memory(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		return 0, ms, false
	}
	return ms.UsageBytes >> 20, ms, true
}

func (c reserveCore) Push(ctx context.Context, id string) error {
	_, err := c.n.snapshotOrDetach(ctx, id)
	return err
}

func (c reserveCore) Detach(ctx context.Context, id, note string) error {
	_, err := c.n.detach(ctx, id, note)
	return err
}

// Gone settles hot sandbox id whose process is gone as detached, with a
// note that says why, unless a transition holds it or it is running
// after all.
func (c reserveCore) Gone(id string, oom bool) {
	n := c.n
	e, ok := n.lookup(id)
	if !ok {
		return
	}
	select {
	case e.lock <- struct{}{}:
	default:
		return
	}
	defer e.release()
	sb, err := n.st.GetSandbox(context.Background(), id)
	if err != nil || e.getTier() != api.TierHot {
		return
	}
	st, err := n.be.State(context.Background(), n.spec(sb))
	if err != nil || st == sandbox.StateRunning || st == sandbox.StatePaused {
		return
	}
	if !oom {
		n.log.Warn("sandbox process is gone; detaching it so the next request cold-starts it", "id", id)
		n.settleAfterFailure(sb, api.TierHot, "its process exited (see its logs); the next request cold-starts it")
		return
	}
	n.log.Warn("sandbox killed by the kernel: out of memory", "id", id, "limit_mib", sb.MemoryMiB)
	n.settleAfterFailure(sb, api.TierHot, fmt.Sprintf("killed: out of memory (the kernel's OOM killer ended it; its limit is %d MiB); the next request cold-starts it", sb.MemoryMiB))
}
