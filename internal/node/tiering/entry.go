package tiering

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/node/envdlink"
	"sandstorm/internal/tier"
)

// Entry is the node's in-memory view of one sandbox. The store has the
// durable copy; the entry adds what changes too often to write (activity)
// and the lock that serialises its transitions.
type Entry struct {
	id   string
	lock chan struct{} // held by a transition; a chan so waits can time out

	tier       atomic.Value // api.Tier
	tierSince  atomic.Int64 // unix ms
	lastActive atomic.Int64 // unix ms
	flushed    atomic.Int64 // lastActive last written to the store

	// lastUsageMiB is what it took from MemAvailable just before its
	// last checkpoint: what its restore is admitted at.
	lastUsageMiB atomic.Int64

	mu     sync.Mutex
	waking *wakeCall

	// Envd is its link to the envd inside it: the calls in flight (they
	// keep the sandbox busy), cut before it loses its processes.
	Envd envdlink.Link
	// egressCalls are its mesh requests in flight through its boundary:
	// an agent waiting on a model's answer is busy (egress.go).
	egressCalls atomic.Int32

	// timers are its own idle timers (nil: the node's).
	timers atomic.Pointer[tier.Timers]

	// moving: it is leaving by a move, or arrived by one not yet
	// confirmed (the node's move.go): busy to the idle timers, the
	// memory guard and the disk reserve, whatever its tier.
	moving atomic.Bool
}

type wakeCall struct {
	done chan struct{}
	err  error
	// shared counts the callers waiting on it besides the one running
	// it (under the entry's mu): what the node's tests wait for.
	shared int
}

// ID is the sandbox's ID.
func (e *Entry) ID() string { return e.id }

// Tier is the sandbox's tier as the node holds it.
func (e *Entry) Tier() api.Tier { t, _ := e.tier.Load().(api.Tier); return t }

// SetTier records the sandbox's tier.
func (e *Entry) SetTier(t api.Tier) {
	e.tier.Store(t)
	e.tierSince.Store(time.Now().UnixMilli())
	if t == api.TierSnapshot || t == api.TierDetached {
		// Its envd's connections died with its processes, however it
		// got here (a transition cuts them first; a sandbox whose
		// process exited is settled detached without one).
		e.Envd.Drop()
	}
}

// Acquire takes the transition lock, giving up when ctx ends.
func (e *Entry) Acquire(ctx context.Context) error {
	select {
	case e.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryAcquire takes the transition lock if nobody holds it.
func (e *Entry) TryAcquire() bool {
	select {
	case e.lock <- struct{}{}:
		return true
	default:
		return false
	}
}

// Hold takes the transition lock of a sandbox nothing else can know of
// yet (just created, arrived or being repaired at start): it never waits.
func (e *Entry) Hold() { e.lock <- struct{}{} }

// Release gives the transition lock back.
func (e *Entry) Release() { <-e.lock }

// Busy reports whether a transition (or a start-up repair) holds the
// sandbox's lock.
func (e *Entry) Busy() bool { return len(e.lock) > 0 }

// LastActive is when the sandbox was last active (unix ms).
func (e *Entry) LastActive() int64 { return e.lastActive.Load() }

// SetLastActive records the sandbox's last activity (unix ms).
func (e *Entry) SetLastActive(ms int64) { e.lastActive.Store(ms) }

// Flushed records that the store holds its last activity at ms.
func (e *Entry) Flushed(ms int64) { e.flushed.Store(ms) }

// LastUsageMiB is what it held at its last checkpoint.
func (e *Entry) LastUsageMiB() int64 { return e.lastUsageMiB.Load() }

// SetLastUsageMiB records what it held at its last checkpoint.
func (e *Entry) SetLastUsageMiB(mib int64) { e.lastUsageMiB.Store(mib) }

// SetMoving marks it leaving or arriving by a move (or not).
func (e *Entry) SetMoving(on bool) { e.moving.Store(on) }

// UseTimers gives it idle timers of its own (nil: the node's).
func (e *Entry) UseTimers(t *tier.Timers) { e.timers.Store(t) }

// Waking reports whether a wake of it is under way and how many callers
// share it besides the one running it (the node's tests wait on it).
func (e *Entry) Waking() (bool, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.waking == nil {
		return false, 0
	}
	return true, e.waking.shared
}
