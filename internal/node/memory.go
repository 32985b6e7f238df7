package node

import (
	"context"
	"path/filepath"

	"sandstorm/internal/admission"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/sandbox"
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
		MemReserveMiB: cfg.MemReserveMiB, MemAvailable: cfg.MemAvailable, Held: n.h.HeldMiB,
		DiskReserveMiB: cfg.DiskReserveMiB, DiskFree: diskFree, DataDir: cfg.DataDir, FDs: reserve.ProcessFDs,
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

// reserveCore is the node as the reserve guard's core (reserve.Core).
type reserveCore struct{ n *Node }

func (c reserveCore) Views() []tier.View        { return c.n.tiers.Views() }
func (c reserveCore) Connections(id string) int { return c.n.gw.Active(id) }
func (c reserveCore) CanCheckpoint() bool       { return c.n.be.Capabilities().Checkpoint }
func (c reserveCore) DropPooled(why string) bool {
	return c.n.pool.DropOldest(why)
}

func (c reserveCore) Usage(id string) (int64, sandbox.MemStat, bool) { return c.n.h.Usage(id) }
func (c reserveCore) Gone(id string, oom bool)                       { c.n.tiers.Gone(id, oom) }

func (c reserveCore) Push(ctx context.Context, id string) error {
	_, err := c.n.tiers.SnapshotOrDetach(ctx, id)
	return err
}

func (c reserveCore) Detach(ctx context.Context, id, note string) error {
	_, err := c.n.tiers.DetachNoted(ctx, id, note)
	return err
}
