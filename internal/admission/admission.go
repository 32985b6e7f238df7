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
// starting or waking is promised its expected size (its limit, or a margin
// over what its template's sandboxes settled at: memguard.Expected) until
// it has taken it or SettleWindow has passed, and admission counts those
// promises, not only MemAvailable, which says nothing yet about a heap that
// is still being filled.
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
}

// Admission is one node's admission and its memory ledger.
type Admission struct {
	cfg      Config
	mu       sync.Mutex
	promises map[string]promise
	settled  map[string]int64 // template → largest settled size seen (MiB)
}

type promise struct {
	template    string
	expectedMiB int64
	since       time.Time
	lastHeld    int64 // MiB at the last settle look
}

// New is an admission over cfg with nothing promised.
func New(cfg Config) *Admission {
	if cfg.Held == nil {
		cfg.Held = func(string) (int64, bool) { return 0, false }
	}
	return &Admission{cfg: cfg, promises: map[string]promise{}, settled: map[string]int64{}}
}

// Expected is what a sandbox of template with limit limitMiB is admitted
// at: its limit, or a margin over what the template's sandboxes settled at.
func (a *Admission) Expected(template string, limitMiB int64) int64 {
	a.mu.Lock()
	s := a.settled[template]
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

// Memory admits sandbox id (of template), about to start or wake and take
// expectedMiB, if the headroom — available memory less the reserve less
// what admitted sandboxes have yet to take — covers it: the promise is
// recorded under one lock, so concurrent admissions see each other.
// Otherwise it answers ErrNoMemory, in words that say how short, and the
// caller makes room (or gives up) and asks again.
func (a *Admission) Memory(id, template string, expectedMiB int64) error {
	if a.cfg.MemReserveMiB <= 0 {
		return nil
	}
	avail, err := a.cfg.MemAvailable()
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ps := a.outstanding()
	if memguard.Headroom(avail, a.cfg.MemReserveMiB, ps) >= expectedMiB {
		a.promises[id] = promise{template: template, expectedMiB: expectedMiB, since: time.Now()}
		return nil
	}
	return fmt.Errorf("%w: not enough memory for sandbox %s: it needs %d MiB; %d MiB available, %d MiB of it promised to sandboxes still starting, reserve %d MiB",
		ErrNoMemory, id, expectedMiB, avail, memguard.Outstanding(ps), a.cfg.MemReserveMiB)
}

// Headroom is what memory is left now for a sandbox not yet admitted.
func (a *Admission) Headroom() (int64, error) {
	avail, err := a.cfg.MemAvailable()
	if err != nil {
		return 0, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return memguard.Headroom(avail, a.cfg.MemReserveMiB, a.outstanding()), nil
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
// at.
func (a *Admission) Settle(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
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
		if ok && held > a.settled[p.template] {
			a.settled[p.template] = held
		}
	}
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
