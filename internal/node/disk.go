package node

import (
	"context"
	"fmt"
	"sort"

	"golang.org/x/sys/unix"

	"sandstorm/api"
)

// Disk (issue 7, item 5): snapshots and volumes live on the node's disk
// under its data dir, and 10,000 snapshots do not fit on any disk we have.
// The node keeps DiskReserveMiB free: a create is refused (503) below it, a
// snapshot that would eat into it is not taken — an explicit one is
// refused, one the node wanted (idle timers, memory pressure) detaches the
// sandbox instead and says so — and the disk loop detaches snapshot
// sandboxes, least in demand first, while the disk is below it. An image
// is written to snapshot.tmp and renamed only when runsc checkpoint
// succeeded, so a half-written one is never taken for a good one.

// diskFreeMiB is what unprivileged writers may still use on the data
// dir's filesystem.
func (n *Node) diskFreeMiB() (int64, error) {
	if n.cfg.DiskFree != nil {
		return n.cfg.DiskFree()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(n.cfg.DataDir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, nil
}

// imageMiB estimates the checkpoint image of a sandbox: at most what its
// memory cgroup holds (the image is its memory, compressed by this runsc).
func (n *Node) imageMiB(id string) int64 {
	held, _, ok := n.usageMiB(id)
	if !ok || held <= 0 {
		return 64
	}
	return held
}

// diskStep detaches sandboxes that hold a snapshot, least in demand first,
// while the disk is below its reserve: their images are what fills it.
func (n *Node) diskStep() {
	if n.cfg.DiskReserveMiB <= 0 {
		return
	}
	free, err := n.diskFreeMiB()
	if err != nil || free >= n.cfg.DiskReserveMiB {
		return
	}
	var snaps []string
	vs := n.views()
	// Least recently active first.
	sort.Slice(vs, func(i, j int) bool { return vs[i].LastActive.Before(vs[j].LastActive) })
	for _, v := range vs {
		if v.Tier == api.TierSnapshot && !v.Busy {
			snaps = append(snaps, v.ID)
		}
	}
	for _, id := range snaps {
		if free >= n.cfg.DiskReserveMiB {
			return
		}
		n.log.Warn("disk reserve: detaching a snapshot sandbox", "id", id, "free_mib", free, "reserve_mib", n.cfg.DiskReserveMiB)
		note := fmt.Sprintf("detached: the node's disk was below its reserve (%d MiB free, reserve %d MiB); its snapshot, and so its memory state, was dropped, its volume kept", free, n.cfg.DiskReserveMiB)
		if _, err := n.detach(context.Background(), id, note); err != nil {
			n.log.Error("disk reserve: detach failed", "id", id, "err", err)
			continue
		}
		free, _ = n.diskFreeMiB()
	}
}
