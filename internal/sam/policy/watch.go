package policy

import (
	"bytes"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Watcher holds the policy of a file and reloads it when the file changes.
// A file that fails to parse is rejected and the policy in force stays: a
// typo must never open (or close) the mesh. Flows in progress are not
// touched by a reload; every new flow is decided by the policy in force.
type Watcher struct {
	path    string
	mu      sync.Mutex // serialises Check
	cur     atomic.Pointer[Policy]
	last    []byte
	log     *slog.Logger
	stop    chan struct{}
	reloads atomic.Int64
	errors  atomic.Int64
	// OnChange, if set before Start, is called after each accepted reload.
	OnChange func(*Policy)
}

// NewWatcher loads path once; an unreadable or invalid file is an error
// here, so a daemon never starts with a policy it cannot read.
func NewWatcher(path string, log *slog.Logger) (*Watcher, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{path: path, last: data, log: log, stop: make(chan struct{})}
	w.cur.Store(p)
	return w, nil
}

// Current returns the policy in force.
func (w *Watcher) Current() *Policy { return w.cur.Load() }

// Start polls the file every interval (content compared, so editors that
// replace the file by rename are seen too) until Stop.
func (w *Watcher) Start(interval time.Duration) {
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				w.Check()
			}
		}
	}()
}

// Check reloads the file now if its content changed, and reports whether a
// new policy is in force.
func (w *Watcher) Check() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	data, err := os.ReadFile(w.path)
	if err != nil || bytes.Equal(data, w.last) {
		return false
	}
	w.last = data
	p, err := Parse(data)
	if err != nil {
		w.errors.Add(1)
		w.log.Error("policy: rejected the changed file; the previous policy stays in force", "path", w.path, "err", err)
		return false
	}
	w.cur.Store(p)
	w.reloads.Add(1)
	w.log.Info("policy: reloaded", "path", w.path, "principals", len(p.grants))
	if w.OnChange != nil {
		w.OnChange(p)
	}
	return true
}

// Counts returns how many reloads were accepted and rejected.
func (w *Watcher) Counts() (accepted, rejected int64) { return w.reloads.Load(), w.errors.Load() }

// Stop ends polling.
func (w *Watcher) Stop() { close(w.stop) }
