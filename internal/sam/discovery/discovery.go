// Package discovery answers "who provides K?" for the mesh without making
// a caller wait for nothing (issue 17, item 4). The seed's mesh paid a
// provider lookup's full 5.04 s timeout on every cold call, because it
// asked the DHT for up to twenty providers when four existed and waited
// for the twentieth (../shared/seeds/000_53e7b298c049e825.txt). Three
// rules here:
//
//   - A lookup ends when its source says it is done — for the DHT, when
//     go-libp2p-kad-dht closes FindProvidersAsync's channel at the end of
//     its query — never by waiting out a count that may not exist. The
//     timeout is only a bound for a source that never ends.
//   - Concurrent callers of one key share one lookup, which runs on a
//     context of its own: the first caller leaving (its request
//     cancelled) must not cancel it for the others, who wait with their
//     own contexts.
//   - Answers are kept for TTL (30 s) and refreshed in the background
//     once they are RefreshAfter old (20 s), so a caller on a warm path
//     never pays a cold lookup: until TTL it gets the answer it has,
//     while the new one is fetched.
//   - An answer of no provider at all is kept only EmptyTTL (0.5 s): it is
//     what a lookup finds in the moments after a router restarted and
//     before the members published there again (issue 29). Kept for 30 s
//     it turned a restart of a second into half a minute of "no member
//     serves it"; kept 2 s it was still most of a heal's time (sam-bench
//     heal's router-down). Half a second bounds the lookups a name nobody
//     serves costs to two a second.
//
// Cache is free of the DHT: Lookup is any function, so the rules are
// tested exhaustively with fakes (discovery_test.go) and the DHT adapter
// (dht.go) is a few lines.
package discovery

import (
	"context"
	"sync"
	"time"
)

// Lookup finds the providers of key. It returns when its source is
// exhausted or ctx ends (then with ctx's error and what it found so far).
type Lookup[T any] func(ctx context.Context, key string) ([]T, error)

// Defaults, from the issue: answers cached 30 s and refreshed before they
// expire; a lookup bounded by a timeout well above a walk's length; an
// empty answer kept briefly (see the package doc).
const (
	DefaultTTL          = 30 * time.Second
	DefaultRefreshAfter = 20 * time.Second
	DefaultTimeout      = 10 * time.Second
	DefaultEmptyTTL     = 500 * time.Millisecond
)

// Config sets a Cache's times; zero fields take the defaults.
type Config struct {
	TTL          time.Duration
	RefreshAfter time.Duration
	Timeout      time.Duration
	// EmptyTTL is how long an answer with no provider is kept (at most
	// TTL).
	EmptyTTL time.Duration
	// RetryAfter is how long after a failed refresh the next is tried
	// (the last good answer is served meanwhile); default 2 s.
	RetryAfter time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Cache is a provider cache in front of a Lookup. Its zero value is not
// usable; make one with New.
type Cache[T any] struct {
	lookup Lookup[T]
	cfg    Config

	mu      sync.Mutex
	entries map[string]*entry[T]
	// lookups counts the lookups started (tests, sam-bench).
	lookups int
}

// entry is one key's answer and the lookup that is fetching a new one.
type entry[T any] struct {
	vals   []T
	at     time.Time // when vals were found; zero: none yet
	failed time.Time // when a refresh last failed
	run    *flight[T]
}

// flight is one lookup in progress; done is closed when vals and err are
// set.
type flight[T any] struct {
	done chan struct{}
	vals []T
	err  error
}

// New returns a Cache in front of lookup.
func New[T any](lookup Lookup[T], cfg Config) *Cache[T] {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.RefreshAfter <= 0 || cfg.RefreshAfter > cfg.TTL {
		cfg.RefreshAfter = cfg.TTL * 2 / 3
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.EmptyTTL <= 0 || cfg.EmptyTTL > cfg.TTL {
		cfg.EmptyTTL = min(DefaultEmptyTTL, cfg.TTL)
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cache[T]{lookup: lookup, cfg: cfg, entries: map[string]*entry[T]{}}
}

// Get returns the providers of key: the cached answer while it is younger
// than TTL (starting a refresh in the background once it is RefreshAfter
// old), else the answer of a lookup, shared with every other caller of
// the key meanwhile. ctx bounds only this caller's wait.
func (c *Cache[T]) Get(ctx context.Context, key string) ([]T, error) {
	c.mu.Lock()
	e := c.entries[key]
	if e == nil {
		e = &entry[T]{}
		c.entries[key] = e
	}
	age := c.cfg.Now().Sub(e.at)
	ttl := c.cfg.TTL
	if len(e.vals) == 0 {
		ttl = c.cfg.EmptyTTL
	}
	if !e.at.IsZero() && age < ttl {
		// A refresh that failed is not tried again at once by every
		// caller that comes: at most once per RetryAfter.
		if age >= c.cfg.RefreshAfter && e.run == nil && c.cfg.Now().Sub(e.failed) >= c.cfg.RetryAfter {
			c.start(key, e)
		}
		vals := e.vals
		c.mu.Unlock()
		return vals, nil
	}
	f := e.run
	if f == nil {
		f = c.start(key, e)
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.vals, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// start begins a lookup of key for e (c.mu held). It runs on a context of
// its own, bounded by Timeout, whoever waits on it. An answer replaces
// e's; an error keeps the answer e has (a refresh that fails leaves the
// last good one until TTL) and is not cached: the next caller tries again.
func (c *Cache[T]) start(key string, e *entry[T]) *flight[T] {
	f := &flight[T]{done: make(chan struct{})}
	e.run = f
	c.lookups++
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		vals, err := c.lookup(ctx, key)
		cancel()
		c.mu.Lock()
		if err == nil {
			e.vals, e.at = vals, c.cfg.Now()
		} else {
			e.failed = c.cfg.Now()
		}
		e.run = nil
		c.mu.Unlock()
		f.vals, f.err = vals, err
		close(f.done)
	}()
	return f
}

// Lookups is how many lookups the cache has started.
func (c *Cache[T]) Lookups() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookups
}

// Forget drops key's answer (a provider that failed a call), so the next
// Get looks it up again.
func (c *Cache[T]) Forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil && e.run == nil {
		delete(c.entries, key)
	}
}
