// Package reserve keeps a Sandstorm node's memory and disk reserves
// (issue 7; the seed's "a node short on memory turns work away instead of
// running out, and still answers ssh"). Its Guard waits for room when a
// sandbox is admitted, pushes the sandboxes least in demand off memory as
// the memory reserve is approached, detaches snapshot sandboxes while the
// disk is under its reserve, and finds sandboxes the kernel killed. It
// decides; the node's core (Core) checkpoints, detaches and settles.
package reserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/memguard"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/tier"
)

// Every sandbox has a memory limit that is enforced (the OCI spec's limit:
// runsc applies it to the sandbox's cgroup and reports it to the sandbox as
// its total memory): its own, else its template's, else the node's finite
// default. A sandbox that is starting or waking is promised its expected
// size (its limit, or a margin over what its template's sandboxes settled
// at) until it has taken it or admission.SettleWindow has passed, and
// admission counts those promises, not only MemAvailable — which says
// nothing yet about a heap that is still being filled. Below the line, the
// least in demand are pushed to disk first; what cannot be made room for
// in time is refused with 503.
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
)

// Core is what a Guard needs of its node.
type Core interface {
	// Views is every sandbox's state now.
	Views() []tier.View
	// Connections is how many connections sandbox id has open through
	// the gateway (a checkpoint's drain would reset one in flight).
	Connections(id string) int
	// Usage reads sandbox id's memory cgroup (MiB); ok false when the
	// backend cannot say.
	Usage(id string) (mib int64, ms sandbox.MemStat, ok bool)
	// CanCheckpoint reports whether the backend can checkpoint.
	CanCheckpoint() bool
	// Push moves sandbox id to disk: a snapshot, or detached when the
	// snapshot cannot be taken.
	Push(ctx context.Context, id string) error
	// Detach detaches sandbox id with note (its memory lost, its
	// volume kept).
	Detach(ctx context.Context, id, note string) error
	// DropPooled drops a pooled sandbox, if there is one: what memory
	// pressure gives up first (they are speculation).
	DropPooled(why string) bool
	// Gone settles hot sandbox id whose process is gone, if it still is
	// (oom: the kernel's OOM killer ended it).
	Gone(id string, oom bool)
}

// Config configures a Guard.
type Config struct {
	// MemReserveMiB is the MemAvailable the node keeps free (0: none).
	MemReserveMiB int64
	MemAvailable  func() (int64, error)
	// Admission is how long an admission may wait for room.
	Admission time.Duration
	// DiskReserveMiB is the disk the node keeps free under DataDir (0:
	// none); DiskFree reads what is free.
	DiskReserveMiB int64
	DiskFree       func() (int64, error)
	// Starting is the sandboxes still starting (admission's promises):
	// never pushed. Settle settles the promises that are due.
	Starting func() map[string]bool
	Settle   func(time.Time)
	Log      *slog.Logger
}

// Guard keeps the node's reserves.
type Guard struct {
	cfg  Config
	core Core
	// pushSlot: one push to disk for memory at a time (takePush).
	pushSlot chan struct{}
	// largestMiB is the largest hot or frozen sandbox's memory cgroup at
	// the last look (findKilled, once a second): admission keeps room
	// for its checkpoint (KeepMiB).
	largestMiB atomic.Int64
}

// New is a guard of cfg's reserves over core.
func New(cfg Config, core Core) *Guard {
	return &Guard{cfg: cfg, core: core, pushSlot: make(chan struct{}, 1)}
}

// Admit admits sandbox id that is about to start or wake (ask is the
// admission's question: Start or Memory): if the headroom — available
// memory less the reserve less what admitted sandboxes have yet to take —
// covers it, the promise is recorded (under admission's lock, so
// concurrent admissions see each other) and it may go. Otherwise the
// sandboxes least in demand are pushed to disk, one at a time, until it
// fits or the admission window ends: then admission.ErrNoMemory (503
// with Retry-After), in words that say it is memory.
func (g *Guard) Admit(ctx context.Context, id string, ask func() error) error {
	deadline := time.Now().Add(g.cfg.Admission)
	for {
		short := ask()
		if short == nil || !errors.Is(short, admission.ErrNoMemory) {
			return short
		}
		if time.Now().After(deadline) || ctx.Err() != nil || !g.takePush(ctx, deadline) {
			return fmt.Errorf("%w; nothing could be pushed to disk in time, retry later", short)
		}
		// Another push may have made the room while this one waited.
		if short = ask(); short == nil || !errors.Is(short, admission.ErrNoMemory) {
			g.releasePush()
			return short
		}
		pushed := g.pushDown(ctx, id, "to make room for "+id)
		g.releasePush()
		if !pushed {
			return fmt.Errorf("%w; nothing left to push to disk", short)
		}
	}
}

// takePush takes the node's one push slot, waiting no later than
// deadline: pushes run one at a time, so that admission's room for one
// checkpoint (KeepMiB) is enough, and two checkpoints do not share the
// two cores (each took 2 s instead of 0.4 in issue 19's flood, where the
// pressure loop and a wake's admission pushed at once). It reports
// whether it took it; releasePush gives it back.
func (g *Guard) takePush(ctx context.Context, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case g.pushSlot <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (g *Guard) releasePush() { <-g.pushSlot }

// pushDown moves the sandbox least in demand (never exclude, never one
// still starting) off memory: to disk when there is room for a
// checkpoint, which needs memory too (CheckpointRoomMiB); detached —
// knowingly, and saying so in its note — when the node is so short that a
// checkpoint could fail half-way and take the sandbox with it. Before any
// of that it drops a pooled sandbox, if there is one. It reports whether
// it moved one. The caller holds the push slot (takePush).
func (g *Guard) pushDown(ctx context.Context, exclude, why string) bool {
	if g.core.DropPooled(why) {
		return true
	}
	starting := g.cfg.Starting()
	var views []tier.View
	now := time.Now()
	for _, v := range g.core.Views() {
		// Never one with a connection open through the gateway: the
		// checkpoint's drain would reset a request in flight.
		if !starting[v.ID] && now.Sub(v.LastActive) >= inUse && g.core.Connections(v.ID) == 0 {
			views = append(views, v)
		}
	}
	reserve := g.cfg.MemReserveMiB
	for _, v := range tier.Victims(views, exclude) {
		avail, _ := g.cfg.MemAvailable()
		held, _, _ := g.core.Usage(v.ID)
		if !g.core.CanCheckpoint() || avail < CheckpointRoomMiB(held) {
			g.cfg.Log.Warn("memory: detaching sandbox (too little memory to checkpoint it safely)", "id", v.ID, "available_mib", avail, "reserve_mib", reserve, "why", why)
			note := fmt.Sprintf("detached under memory pressure (%d MiB available, reserve %d MiB): its memory state was lost, its volume kept; the next request cold-starts it", avail, reserve)
			if err := g.core.Detach(ctx, v.ID, note); err != nil {
				g.cfg.Log.Error("memory: detach failed", "id", v.ID, "err", err)
				continue
			}
			return true
		}
		g.cfg.Log.Warn("memory: pushing sandbox to disk", "id", v.ID, "available_mib", avail, "reserve_mib", reserve, "why", why)
		if err := g.core.Push(ctx, v.ID); err != nil {
			g.cfg.Log.Error("memory: snapshot failed", "id", v.ID, "err", err)
			continue
		}
		return true
	}
	return false
}

// KeepMiB is what admission keeps free above the reserve
// (admission.Config.Keep): room for a checkpoint of the largest sandbox
// that could be pushed to disk to make room next. Pushes run one at a
// time (takePush), so room for one is enough.
func (g *Guard) KeepMiB() int64 { return CheckpointRoomMiB(g.largestMiB.Load()) }

// CheckpointRoomMiB is the MemAvailable a checkpoint of a sandbox holding
// heldMiB needs in order not to fail half-way: the sentry serialises its
// state and compresses the image through buffers of its own (a checkpoint
// that ran out of memory took the sandbox with it: issue 7).
func CheckpointRoomMiB(heldMiB int64) int64 { return max(64, heldMiB/2) }

// Loop watches memory faster than the tier tick until stop is closed:
// when MemAvailable comes within a quarter of the reserve of it, or PSI
// says tasks are waiting for memory, it pushes the least in demand off
// memory before the kernel has to kill anything. Once a second it also
// settles promises and looks for sandboxes the kernel killed.
func (g *Guard) Loop(stop <-chan struct{}) {
	tick := time.NewTicker(pressureTick)
	defer tick.Stop()
	lastBook := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if r := g.cfg.MemReserveMiB; r > 0 {
			avail, err := g.cfg.MemAvailable()
			psi := memguard.PressureSome10()
			// Not while a push is under way (an admission's): its
			// memory comes back when it ends, and the next tick looks
			// again.
			if err == nil && (avail < r+min(r/4, earlyMarginMiB) || psi >= pressurePSI) {
				select {
				case g.pushSlot <- struct{}{}:
					g.pushDown(context.Background(), "", fmt.Sprintf("%d MiB available (reserve %d MiB), memory pressure %.1f%%", avail, r, psi))
					g.releasePush()
				default:
				}
			}
		}
		if time.Since(lastBook) >= time.Second {
			lastBook = time.Now()
			g.cfg.Settle(lastBook)
			g.findKilled()
		}
	}
}

// findKilled settles a hot sandbox whose process is gone (Core.Gone): as
// detached (its next request cold-starts it), with a note that says
// "killed: out of memory" when the kernel's OOM killer ended it — never
// left half-alive, never silently.
//
// On the way it notes the largest sandbox that could be pushed to disk
// (hot or frozen): admission keeps room above the reserve for its
// checkpoint (KeepMiB).
func (g *Guard) findKilled() {
	var hot []string
	var largest int64
	for _, v := range g.core.Views() {
		switch {
		case v.Busy:
		case v.Tier == api.TierHot:
			hot = append(hot, v.ID)
		case v.Tier == api.TierFrozen:
			if held, _, ok := g.core.Usage(v.ID); ok {
				largest = max(largest, held)
			}
		}
	}
	sort.Strings(hot)
	defer func() { g.largestMiB.Store(largest) }()
	for _, id := range hot {
		held, ms, ok := g.core.Usage(id)
		largest = max(largest, held)
		if ok && ms.Gone {
			g.core.Gone(id, ms.OOMKilled)
		}
	}
}

// DiskFree is what unprivileged writers may still use on dir's
// filesystem (MiB).
func DiskFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, nil
}

// DiskStep detaches sandboxes that hold a snapshot, least in demand
// first, while the disk is below its reserve: their images are what
// fills it (issue 7, item 5: 10,000 snapshots do not fit on any disk we
// have). A snapshot that would eat into the reserve is never taken (the
// node's admission); what is on disk already goes here.
func (g *Guard) DiskStep() {
	reserve := g.cfg.DiskReserveMiB
	if reserve <= 0 {
		return
	}
	free, err := g.cfg.DiskFree()
	if err != nil || free >= reserve {
		return
	}
	vs := g.core.Views()
	// Least recently active first.
	sort.Slice(vs, func(i, j int) bool { return vs[i].LastActive.Before(vs[j].LastActive) })
	for _, v := range vs {
		if v.Tier != api.TierSnapshot || v.Busy {
			continue
		}
		if free >= reserve {
			return
		}
		g.cfg.Log.Warn("disk reserve: detaching a snapshot sandbox", "id", v.ID, "free_mib", free, "reserve_mib", reserve)
		note := fmt.Sprintf("detached: the node's disk was below its reserve (%d MiB free, reserve %d MiB); its snapshot, and so its memory state, was dropped, its volume kept", free, reserve)
		if err := g.core.Detach(context.Background(), v.ID, note); err != nil {
			g.cfg.Log.Error("disk reserve: detach failed", "id", v.ID, "err", err)
			continue
		}
		free, _ = g.cfg.DiskFree()
	}
}
