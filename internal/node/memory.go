package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/memguard"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// Memory (issue 7; the seed's "a node short on memory turns work away
// instead of running out, and still answers ssh").
//
// Every sandbox has a memory limit that is enforced (the OCI spec's limit:
// runsc applies it to the sandbox's cgroup and reports it to the sandbox as
// its total memory): its own, else its template's, else the node's finite
// default. A sandbox that is starting or waking is promised its expected
// size (its limit, or a margin over what its template's sandboxes settled
// at) until it has taken it or admission.SettleWindow has passed, and admission
// counts those promises, not only MemAvailable — which says nothing yet
// about a heap that is still being filled. Below the line, the least in
// demand are pushed to disk first; what cannot be made room for in time is
// refused with 503.
//
// A loop that reads MemAvailable and PSI every pressureTick acts before the
// kernel has to, and every sandbox process gets a high OOM score while
// sandstormd (and sam-node) take a low one: if the kernel must kill, it
// kills a sandbox, which the node then reports as "killed: out of memory".

const (
	// pressureTick: how often memory is looked at outside the tier tick.
	// Reading /proc/meminfo and /proc/pressure/memory costs ~30 µs.
	pressureTick = 100 * time.Millisecond
	// earlyMarginMiB: act when MemAvailable is within this much of the
	// reserve (or a quarter of the reserve, if that is less), before it is
	// crossed. A fixed amount, not a share: a node with a large reserve
	// would otherwise push sandboxes to disk all the time.
	earlyMarginMiB = 512
	// inUse: a sandbox active this recently is not pushed off memory to
	// make room: a request is likely in flight, and a checkpoint resets it.
	inUse = 2 * time.Second
	// pressurePSI: or when tasks spent this share (%) of the last 10 s
	// waiting for memory (PSI some avg10).
	pressurePSI = 10
	// DaemonOOMScoreAdj is sandstormd's and sam-node's oom_score_adj:
	// the kernel's OOM killer takes the highest score first, and every
	// sandbox's is layout.SandboxOOMScoreAdj.
	DaemonOOMScoreAdj = -900
)

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

// settledFile keeps what each template's sandboxes settled at, for the
// next run of the node (admission.Config.Settled): without it a restarted
// node counts its first burst of creates at their limits again.
func (n *Node) settledFile() string { return filepath.Join(n.cfg.DataDir, "settled-sizes.json") }

func loadSettled(path string, log *slog.Logger) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("read the templates' settled sizes; the first creates count at their limits", "path", path, "err", err)
		}
		return out
	}
	if err := json.Unmarshal(b, &out); err != nil {
		log.Warn("the templates' settled sizes are unreadable; the first creates count at their limits", "path", path, "err", err)
		return map[string]int64{}
	}
	return out
}

// learned records what a template's sandboxes settled at
// (admission.Config.Learned): written whole to a temporary file and
// renamed, so a crash leaves the old file or the new one.
func (n *Node) learned(key string, mib int64) {
	n.settledMu.Lock()
	defer n.settledMu.Unlock()
	n.settledSizes[key] = mib
	b, _ := json.Marshal(n.settledSizes)
	tmp := n.settledFile() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
		err = os.Rename(tmp, n.settledFile())
		if err != nil {
			n.log.Warn("keep the templates' settled sizes", "err", err)
		}
	}
	n.log.Info("template's sandboxes settle", "template", key, "settled_mib", mib, "admitted_at_mib", memguard.Expected(1<<30, mib))
}

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

// usageMiB reads sb's memory cgroup; 0 when the backend cannot say.
func (n *Node) usageMiB(id string) (int64, sandbox.MemStat, bool) {
	r, ok := n.be.(sandbox.MemoryReporter)
	if !ok {
		return 0, sandbox.MemStat{}, false
	}
	ms, err := r.Memory(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		return 0, ms, false
	}
	return ms.UsageBytes >> 20, ms, true
}

// admitMemory admits sandbox id that is about to start or wake (ask is
// the admission's question: Start or Memory): if the headroom — available memory less the
// reserve less what admitted sandboxes have yet to take — covers it, the
// promise is recorded (under one lock, so concurrent admissions see each
// other) and it may go. Otherwise the sandboxes least in demand are pushed
// to disk, one at a time, until it fits or the admission window ends:
// then admission.ErrNoMemory (503 with Retry-After), in words that say it is memory.
func (n *Node) admitMemory(ctx context.Context, id string, ask func() error) error {
	deadline := time.Now().Add(n.cfg.Admission)
	for {
		short := ask()
		if short == nil || !errors.Is(short, admission.ErrNoMemory) {
			return short
		}
		if time.Now().After(deadline) || ctx.Err() != nil || !n.takePush(ctx, deadline) {
			return fmt.Errorf("%w; nothing could be pushed to disk in time, retry later", short)
		}
		// Another push may have made the room while this one waited.
		if short = ask(); short == nil || !errors.Is(short, admission.ErrNoMemory) {
			n.releasePush()
			return short
		}
		pushed := n.pushDown(ctx, id, "to make room for "+id)
		n.releasePush()
		if !pushed {
			return fmt.Errorf("%w; nothing left to push to disk", short)
		}
	}
}

// takePush takes the node's one push slot (pushSlot), waiting no later
// than deadline: pushes run one at a time, so that admission's room for
// one checkpoint (keepMiB) is enough, and two checkpoints do not share the
// two cores (each took 2 s instead of 0.4 in issue 19's flood, where the
// pressure loop and a wake's admission pushed at once). It reports
// whether it took it; releasePush gives it back.
func (n *Node) takePush(ctx context.Context, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case n.pushSlot <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (n *Node) releasePush() { <-n.pushSlot }

// promisedMiB is what admitted sandboxes have yet to take.
func (n *Node) promisedMiB() int64 { return n.adm.Promised() }

// releasePromise drops sandbox id's promise (it failed to start, or is gone).
func (n *Node) releasePromise(id string) { n.adm.Release(id) }

// pushDown moves the sandbox least in demand (never exclude, never one
// still starting) off memory: to disk when there is room for a checkpoint,
// which needs memory too (checkpointRoomMiB); detached — knowingly, and
// saying so in its note — when the node is so short that a checkpoint
// could fail half-way and take the sandbox with it. Before any of that it
// drops a pooled sandbox, if there is one (internal/node/warm). It reports whether
// it moved one. The caller holds the push slot (takePush).
func (n *Node) pushDown(ctx context.Context, exclude, why string) bool {
	if n.pool.DropOldest(why) {
		return true
	}
	starting := n.adm.Starting()
	var views []tier.View
	now := time.Now()
	for _, v := range n.views() {
		// Never one with a connection open through the gateway: the
		// checkpoint's drain would reset a request in flight.
		if !starting[v.ID] && now.Sub(v.LastActive) >= inUse && n.gw.Active(v.ID) == 0 {
			views = append(views, v)
		}
	}
	for _, v := range tier.Victims(views, exclude) {
		avail, _ := n.cfg.MemAvailable()
		held, _, _ := n.usageMiB(v.ID)
		if !n.be.Capabilities().Checkpoint || avail < checkpointRoomMiB(held) {
			n.log.Warn("memory: detaching sandbox (too little memory to checkpoint it safely)", "id", v.ID, "available_mib", avail, "reserve_mib", n.cfg.MemReserveMiB, "why", why)
			note := fmt.Sprintf("detached under memory pressure (%d MiB available, reserve %d MiB): its memory state was lost, its volume kept; the next request cold-starts it", avail, n.cfg.MemReserveMiB)
			if _, err := n.detach(ctx, v.ID, note); err != nil {
				n.log.Error("memory: detach failed", "id", v.ID, "err", err)
				continue
			}
			return true
		}
		n.log.Warn("memory: pushing sandbox to disk", "id", v.ID, "available_mib", avail, "reserve_mib", n.cfg.MemReserveMiB, "why", why)
		if _, err := n.snapshotOrDetach(ctx, v.ID); err != nil {
			n.log.Error("memory: snapshot failed", "id", v.ID, "err", err)
			continue
		}
		return true
	}
	return false
}

// keepMiB is what admission keeps free above the reserve
// (admission.Config.Keep): room for a checkpoint of the largest sandbox
// that could be pushed to disk to make room next. Pushes run one at a
// time (takePush), so room for one is enough.
func (n *Node) keepMiB() int64 { return checkpointRoomMiB(n.largestMiB.Load()) }

// checkpointRoomMiB is the MemAvailable a checkpoint of a sandbox holding
// heldMiB needs in order not to fail half-way: the sentry serialises its
// state and compresses the image through buffers of its own (a checkpoint
// that ran out of memory took the sandbox with it: issue 7).
func checkpointRoomMiB(heldMiB int64) int64 { return max(64, heldMiB/2) }

// pressureLoop watches memory faster than the tier tick: when MemAvailable
// comes within a quarter of the reserve of it, or PSI says tasks are
// waiting for memory, it pushes the least in demand off memory before the
// kernel has to kill anything. Once a second it also settles promises and
// looks for sandboxes the kernel killed.
func (n *Node) pressureLoop() {
	defer n.done.Done()
	tick := time.NewTicker(pressureTick)
	defer tick.Stop()
	lastBook := time.Now()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		if r := n.cfg.MemReserveMiB; r > 0 {
			avail, err := n.cfg.MemAvailable()
			psi := memguard.PressureSome10()
			// Not while a push is under way (an admission's): its
			// memory comes back when it ends, and the next tick looks
			// again.
			if err == nil && (avail < r+min(r/4, earlyMarginMiB) || psi >= pressurePSI) {
				select {
				case n.pushSlot <- struct{}{}:
					n.pushDown(context.Background(), "", fmt.Sprintf("%d MiB available (reserve %d MiB), memory pressure %.1f%%", avail, r, psi))
					n.releasePush()
				default:
				}
			}
		}
		if time.Since(lastBook) >= time.Second {
			lastBook = time.Now()
			n.adm.Settle(lastBook)
			n.findKilled()
		}
	}
}

// findKilled settles a hot sandbox whose process is gone: as detached
// (its next request cold-starts it), with a note that says
// "killed: out of memory" when the kernel's OOM killer ended it — never
// left half-alive, never silently.
//
// On the way it notes the largest sandbox that could be pushed to disk
// (hot or frozen): admission keeps room above the reserve for its
// checkpoint (keepMiB).
func (n *Node) findKilled() {
	var hot []string
	var largest int64
	for _, v := range n.views() {
		switch {
		case v.Busy:
		case v.Tier == api.TierHot:
			hot = append(hot, v.ID)
		case v.Tier == api.TierFrozen:
			if held, _, ok := n.usageMiB(v.ID); ok {
				largest = max(largest, held)
			}
		}
	}
	sort.Strings(hot)
	defer func() { n.largestMiB.Store(largest) }()
	for _, id := range hot {
		held, ms, ok := n.usageMiB(id)
		largest = max(largest, held)
		if !ok || !ms.Gone {
			continue
		}
		e, ok := n.lookup(id)
		if !ok {
			continue
		}
		select {
		case e.lock <- struct{}{}:
		default:
			continue
		}
		func() {
			defer e.release()
			sb, err := n.st.GetSandbox(context.Background(), id)
			if err != nil || e.getTier() != api.TierHot {
				return
			}
			st, err := n.be.State(context.Background(), n.spec(sb))
			if err != nil || st == sandbox.StateRunning || st == sandbox.StatePaused {
				return
			}
			if !ms.OOMKilled {
				n.log.Warn("sandbox process is gone; detaching it so the next request cold-starts it", "id", id)
				n.settleAfterFailure(sb, api.TierHot, "its process exited (see its logs); the next request cold-starts it")
				return
			}
			n.log.Warn("sandbox killed by the kernel: out of memory", "id", id, "limit_mib", sb.MemoryMiB)
			n.settleAfterFailure(sb, api.TierHot, fmt.Sprintf("killed: out of memory (the kernel's OOM killer ended it; its limit is %d MiB); the next request cold-starts it", sb.MemoryMiB))
		}()
	}
}

// protect sets the OOM score of a sandbox that just started or woke.
func (n *Node) protect(sb store.Sandbox) {
	if s, ok := n.be.(sandbox.OOMScorer); ok {
		if err := s.SetOOMScore(context.Background(), n.spec(sb), layout.SandboxOOMScoreAdj); err != nil {
			n.log.Warn("cannot set the OOM score of a sandbox", "id", sb.ID, "err", err)
		}
	}
}
