package policy

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DocumentPath is where sam-node's agent listener gives the boundaries of
// its machine the policy document it has from the control plane (to a
// request naming no principal; see meshnode.PolicyPath).
const DocumentPath = "/sam/v1/policy"

// Fetch asks a policy's source for its document unless it is still the
// one of etag: changed false means it is (and doc is nil).
type Fetch func(ctx context.Context, etag string) (doc []byte, newEtag string, changed bool, err error)

// Follower holds a policy given by another process (sandstormd following
// its node's sam-node, which has the mesh's policy from the control plane).
// Until a first document arrives it grants nothing (Empty: fail closed);
// a document that does not parse is rejected and the policy in force
// stays, as for a file (Watcher); a source that cannot be reached leaves
// the last good policy in force, and Status says since when.
type Follower struct {
	fetch Fetch
	log   *slog.Logger
	cur   atomic.Pointer[Policy]
	stop  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	etag    string
	lastErr error
	since   time.Time // of lastErr's run of failures
	// OnChange, if set before Start, is called after each accepted change.
	OnChange func(*Policy)
}

// NewFollower follows fetch; nothing is fetched before Start (or Check).
func NewFollower(fetch Fetch, log *slog.Logger) *Follower {
	if log == nil {
		log = slog.Default()
	}
	f := &Follower{fetch: fetch, log: log, stop: make(chan struct{})}
	f.cur.Store(Empty())
	return f
}

// Current is the policy in force.
func (f *Follower) Current() *Policy { return f.cur.Load() }

// Status is the error of the last fetch (nil when it worked) and since
// when fetches have failed.
func (f *Follower) Status() (error, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr, f.since
}

// Check fetches once, bounded by 5 s, and reports whether a new policy
// was taken.
func (f *Follower) Check(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	f.mu.Lock()
	etag := f.etag
	f.mu.Unlock()
	doc, newEtag, changed, err := f.fetch(ctx, etag)
	var p *Policy
	if err == nil && changed {
		p, err = Parse(doc)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if f.lastErr == nil {
			f.since = time.Now()
			f.log.Warn("policy: cannot take the policy from its source; the last good one stays in force", "err", err)
		}
		f.lastErr = err
		return false
	}
	if f.lastErr != nil {
		f.log.Info("policy: its source answers again", "after", time.Since(f.since).Round(time.Millisecond))
	}
	f.lastErr = nil
	if !changed {
		return false
	}
	f.etag = newEtag
	f.cur.Store(p)
	f.log.Info("policy: a new policy is in force", "version", newEtag)
	if f.OnChange != nil {
		f.OnChange(p)
	}
	return true
}

// Start checks now and every interval until Stop.
func (f *Follower) Start(interval time.Duration) {
	go func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { <-f.stop; cancel() }()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			f.Check(ctx)
			select {
			case <-f.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// Stop ends the checks.
func (f *Follower) Stop() { f.once.Do(func() { close(f.stop) }) }
