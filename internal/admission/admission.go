// Package admission is what a node asks before it takes on a sandbox
// (issue 15: it was methods on node.Node): whether its memory, disk and
// file descriptors have room. It answers and keeps the ledger of memory
// promised to sandboxes still starting; it does not act. When memory is
// short the node pushes the least in demand to disk (tier.Victims chooses
// them, a pure decision) and asks again — so the arithmetic here is
// testable with fakes, and the I/O stays in the node.
//
// Memory (issue 7; the seed's "a node short on memory turns work away
// instead of running out, and still answers ssh"): a sandbox that is
// starting or waking is promised its expected size until it has taken it
// or SettleWindow has passed, and admission counts those promises, not
// only MemAvailable, which says nothing yet about a heap that is still
// being filled. A waking sandbox is promised what it held when it left
// memory; a new one (Start) a margin over what its template's sandboxes
// settled at (memguard.Expected), or its limit while none has yet — and
// the moment one has, every start of that template still outstanding is
// counted at the margin too (issue 19: a fill of the web demo, two creates
// at a time, was turned away with 23 GiB free because the ≈ 20 sandboxes
// of its first three seconds each counted at their 1,024 MiB limit though
// they settle at ≈ 25 MiB). What was learned outlives the process
// (Config.Settled, Config.Learned), so a restarted node does not count
// its first burst at the limit again.
package admission

import (
	"fmt"
	"sync"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/memguard"
)

// The refusals: each is errdefs.ErrNoRoom (503 with Retry-After).
var (
	// ErrNoMemory: the node is below its memory reserve.
	ErrNoMemory = errdefs.Refine(errdefs.ErrNoRoom, "node short on memory")
	// ErrNoDisk: the node's disk is below its reserve.
	ErrNoDisk = errdefs.Refine(errdefs.ErrNoRoom, "node short on disk")
	// ErrNoFDs: the daemon is near its file-descriptor limit.
	ErrNoFDs = errdefs.Refine(errdefs.ErrNoRoom, "node out of file descriptors")
)

const (
	// SettleWindow: how long a started or woken sandbox counts at its
	// expected size at least (a Python app fills a 256 MiB heap in about
	// a second here; runsc restore brings a heap back in under one).
	SettleWindow = 30 * time.Second
	// settleMin: before this, a sandbox that is not growing is not taken
	// as settled yet (an interpreter may pause between loading and
	// filling).
	settleMin = 3 * time.Second
	// FDsPerStart is what a create or wake may open before it is done:
	// every sandbox keeps one open per gateway port (its listener), and a
	// hot or frozen one about six more (its boundary's listeners and DNS
	// socket, the netlink and namespace handles while it starts).
	FDsPerStart = 16
	// FDHeadroom is kept free for the API, the store and runsc's pipes.
	FDHeadroom = 256
)

// Config is what admission reads. A zero reserve turns that check off.
type Config struct {
	MemReserveMiB int64
	MemAvailable  func() (int64, error)
	// Held is what sandbox id's memory cgroup holds now (ok false: the
	// backend cannot say).
	Held func(id string) (mib int64, ok bool)

	DiskReserveMiB int64
	DiskFree       func() (int64, error)
	// DataDir is where the disk is measured, for the refusal's words.
	DataDir string

	// FDs is how many descriptors the process has open and may (nil:
	// not checked).
	FDs func() (open int, limit uint64, err error)

	// Keep is memory kept free above the reserve (MiB; nil: none): room
	// for the checkpoint that will push a sandbox to disk to make room
	// next, which takes memory of its own while it runs. Admission that
	// went down to the reserve itself left that checkpoint only the
	// reserve to run in (issue 19's flood: MemAvailable fell 76 MiB as
	// a 293 MiB sandbox's checkpoint began and 96 MiB more as it ended,
	// and 146 MiB below the reserve in CI at b16b66e).
	Keep func() int64

	// Settled is what sandboxes started from each key (a template's name
	// and rootfs digest) were seen to settle at before (MiB), and Learned
	// is told whenever that grows, to keep it (both may be nil).
	Settled map[string]int64
	Learned func(key string, mib int64)
}

// Admission is one node's admission and its memory ledger.
type Admission struct {
	cfg      Config
	mu       sync.Mutex
	promises map[string]promise
	settled  map[string]int64 // template → largest settled size seen (MiB)
}

type promise struct {
	key         string
	expectedMiB int64
	// limitMiB is set for a start priced by its template (Start): it is
	// repriced as the template's settled size is learned, and teaches it.
	// A wake's promise (Memory) is what that sandbox held, and is kept.
	limitMiB int64
	since    time.Time
	lastHeld int64 // MiB at the last settle look
}

// New is an admission over cfg with nothing promised.
func New(cfg Config) *Admission {
	if cfg.Held == nil {
		cfg.Held = func(string) (int64, bool) { return 0, false }
	}
	settled := map[string]int64{}
	for k, v := range cfg.Settled {
		if v > 0 {
			settled[k] = v
		}
	}
	return &Admission{cfg: cfg, promises: map[string]promise{}, settled: settled}
}

// Expected is what a new sandbox of key (a template's name and digest)
// with limit limitMiB is admitted at: its limit, or a margin over what the
// template's sandboxes settled at.
func (a *Admission) Expected(key string, limitMiB int64) int64 {
	a.mu.Lock()
	s := a.settled[key]
	a.mu.Unlock()
	return memguard.Expected(limitMiB, s)
}

// outstanding lists the promises with what each holds now. Caller holds mu.
func (a *Admission) outstanding() []memguard.Promise {
	out := make([]memguard.Promise, 0, len(a.promises))
	for id, p := range a.promises {
		held, _ := a.cfg.Held(id)
		out = append(out, memguard.Promise{ExpectedMiB: p.expectedMiB, HeldMiB: held})
	}
	return out
}

// Memory admits sandbox id, about to wake (or arrive by a move) and take
// expectedMiB, if the headroom — available memory less the reserve less
// what admitted sandboxes have yet to take — covers it: the promise is
// recorded under one lock, so concurrent admissions see each other.
// Otherwise it answers ErrNoMemory, in words that say how short, and the
// caller makes room (or gives up) and asks again.
func (a *Admission) Memory(id string, expectedMiB int64) error {
	return a.admit(id, promise{expectedMiB: expectedMiB})
}

// Start is Memory for a new sandbox of key (its template's name and
// digest) with limit limitMiB: it is promised Expected(key, limitMiB),
// repriced when the template's settled size is learned, and its own
// settling teaches that size.
func (a *Admission) Start(id, key string, limitMiB int64) error {
	return a.admit(id, promise{key: key, limitMiB: limitMiB, expectedMiB: a.Expected(key, limitMiB)})
}

func (a *Admission) admit(id string, p promise) error {
	if a.cfg.MemReserveMiB <= 0 {
		return nil
	}
	avail, err := a.cfg.MemAvailable()
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	expectedMiB := p.expectedMiB
	if p.limitMiB > 0 {
		// Priced again under the lock: another start's settling may
		// have taught the size since Start read it.
		expectedMiB = memguard.Expected(p.limitMiB, a.settled[p.key])
		p.expectedMiB = expectedMiB
	}
	ps := a.outstanding()
	keep := a.Kept()
	if memguard.Headroom(avail, a.cfg.MemReserveMiB+keep, ps) >= expectedMiB {
		p.since = time.Now()
		a.promises[id] = p
		return nil
	}
	return fmt.Errorf("%w: not enough memory for sandbox %s: it needs %d MiB; %d MiB available, %d MiB of it promised to sandboxes still starting, reserve %d MiB and %d MiB above it kept for a checkpoint",
		ErrNoMemory, id, expectedMiB, avail, memguard.Outstanding(ps), a.cfg.MemReserveMiB, keep)
}

// Kept is what admission keeps free above the reserve now (MiB):
// Config.Keep's answer, or 0 when there is no reserve (admission is off)
// or no Keep.
func (a *Admission) Kept() int64 {
	if a.cfg.MemReserveMiB <= 0 || a.cfg.Keep == nil {
		return 0
	}
	return max(0, a.cfg.Keep())
}

// Headroom is what memory is left now for a sandbox not yet admitted.
func (a *Admission) Headroom() (int64, error) {
	avail, err := a.cfg.MemAvailable()
	if err != nil {
		return 0, err
	}
	keep := a.Kept()
	a.mu.Lock()
	defer a.mu.Unlock()
	return memguard.Headroom(avail, a.cfg.MemReserveMiB+keep, a.outstanding()), nil
}

// Release drops sandbox id's promise (it failed to start, or is gone).
func (a *Admission) Release(id string) {
	a.mu.Lock()
	delete(a.promises, id)
	a.mu.Unlock()
}

// Promised is what admitted sandboxes have yet to take.
func (a *Admission) Promised() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return memguard.Outstanding(a.outstanding())
}

// Starting is the sandboxes with a promise outstanding: never pushed to
// disk to make room (they are what the room is for).
func (a *Admission) Starting() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]bool, len(a.promises))
	for id := range a.promises {
		out[id] = true
	}
	return out
}

// Settle ends the promises of sandboxes that have taken what they were
// admitted at, or stopped growing after their first seconds, or whose
// window has passed, and remembers what their template's sandboxes settle
// at — repricing the starts of that template still outstanding.
func (a *Admission) Settle(now time.Time) {
	learned := a.settle(now)
	if a.cfg.Learned == nil {
		return
	}
	for k, v := range learned {
		a.cfg.Learned(k, v)
	}
}

func (a *Admission) settle(now time.Time) map[string]int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	learned := map[string]int64{}
	for id, p := range a.promises {
		held, ok := a.cfg.Held(id)
		age := now.Sub(p.since)
		done := age >= SettleWindow ||
			(ok && held >= p.expectedMiB) ||
			(ok && age >= settleMin && held > 0 && held-p.lastHeld < 1)
		if !done {
			p.lastHeld = held
			a.promises[id] = p
			continue
		}
		delete(a.promises, id)
		if p.limitMiB > 0 && ok && held > 0 && held > a.settled[p.key] {
			a.settled[p.key] = held
			learned[p.key] = held
		}
	}
	for id, p := range a.promises {
		if s, ok := learned[p.key]; ok && p.limitMiB > 0 {
			p.expectedMiB = memguard.Expected(p.limitMiB, s)
			a.promises[id] = p
		}
	}
	return learned
}

// Disk refuses new work (what, taking needMiB more) when the disk is, or
// would be, below its reserve.
func (a *Admission) Disk(what string, needMiB int64) error {
	if a.cfg.DiskReserveMiB <= 0 {
		return nil
	}
	free, err := a.cfg.DiskFree()
	if err != nil {
		return err
	}
	if free-needMiB < a.cfg.DiskReserveMiB {
		return fmt.Errorf("%w: %s needs about %d MiB; %d MiB free on %s, reserve %d MiB", ErrNoDisk, what, needMiB, free, a.cfg.DataDir, a.cfg.DiskReserveMiB)
	}
	return nil
}

// FDs refuses a start that would leave fewer than FDHeadroom descriptors
// free: a node near its limit would otherwise fail some accept, dial or
// runsc start at random with EMFILE.
func (a *Admission) FDs() error {
	if a.cfg.FDs == nil {
		return nil
	}
	open, limit, err := a.cfg.FDs()
	if err != nil {
		return nil // cannot say: not a reason to refuse
	}
	if uint64(open+FDsPerStart+FDHeadroom) > limit {
		return fmt.Errorf("%w: sandstormd has %d of its %d file descriptors open; raise its limit (e.g. LimitNOFILE= in its systemd unit, or ulimit -n before it starts) or put the sandbox on another node", ErrNoFDs, open, limit)
	}
	return nil
}
