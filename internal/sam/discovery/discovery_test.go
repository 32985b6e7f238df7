package discovery

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// fakeSource is a Lookup whose answers the test releases one at a time,
// recording the contexts it was called with.
type fakeSource struct {
	mu      sync.Mutex
	calls   []context.Context
	release chan []string
	err     error
}

func newFake() *fakeSource { return &fakeSource{release: make(chan []string)} }

func (f *fakeSource) lookup(ctx context.Context, key string) ([]string, error) {
	f.mu.Lock()
	f.calls = append(f.calls, ctx)
	err := f.err
	f.mu.Unlock()
	select {
	case v := <-f.release:
		return v, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *fakeSource) started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// clock is a settable Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// waitStarted waits until src has been called n times.
func waitStarted(t *testing.T, src *fakeSource, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for src.started() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d lookups started, want %d", src.started(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOneLookupForManyCallers: 200 callers of a cold key share one
// lookup, and each gets its answer.
func TestOneLookupForManyCallers(t *testing.T) {
	src := newFake()
	c := New(src.lookup, Config{})
	var wg sync.WaitGroup
	got := make(chan []string, 200)
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.Get(context.Background(), "model/gpt")
			if err != nil {
				t.Error(err)
			}
			got <- v
		}()
	}
	waitStarted(t, src, 1)
	src.release <- []string{"a", "b", "c", "d"}
	wg.Wait()
	close(got)
	n := 0
	for v := range got {
		n++
		if len(v) != 4 {
			t.Fatalf("a caller got %v", v)
		}
	}
	if n != 200 || c.Lookups() != 1 || src.started() != 1 {
		t.Errorf("%d callers answered by %d lookups (source called %d times); want 200 by 1", n, c.Lookups(), src.started())
	}
}

// TestFirstCallerLeaving: the caller that started a lookup leaves; the
// lookup goes on (its context is not the caller's) and answers the
// caller who stayed.
func TestFirstCallerLeaving(t *testing.T) {
	src := newFake()
	c := New(src.lookup, Config{})
	first, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := c.Get(first, "k")
		left <- err
	}()
	waitStarted(t, src, 1)
	stayed := make(chan []string, 1)
	go func() {
		v, _ := c.Get(context.Background(), "k")
		stayed <- v
	}()
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v, want its own context's error", err)
	}
	if err := src.calls[0].Err(); err != nil {
		t.Fatalf("the lookup's context ended with the first caller: %v", err)
	}
	src.release <- []string{"p"}
	if v := <-stayed; len(v) != 1 || v[0] != "p" {
		t.Errorf("the caller who stayed got %v", v)
	}
	if c.Lookups() != 1 {
		t.Errorf("%d lookups, want 1", c.Lookups())
	}
}

// TestCachedThenRefreshedAhead: an answer is served from the cache, then
// — once RefreshAfter old — still served at once while a refresh runs,
// then replaced by the refresh; past TTL with no refresh a caller waits
// for a new lookup.
func TestCachedThenRefreshedAhead(t *testing.T) {
	src := newFake()
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(src.lookup, Config{TTL: 30 * time.Second, RefreshAfter: 20 * time.Second, Now: clk.now})
	get := func() []string {
		t.Helper()
		v, err := c.Get(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	go func() { waitStarted(t, src, 1); src.release <- []string{"old"} }()
	if v := get(); v[0] != "old" {
		t.Fatalf("cold get: %v", v)
	}
	clk.add(10 * time.Second)
	if v := get(); v[0] != "old" || src.started() != 1 {
		t.Fatalf("at 10 s: %v, %d lookups; want the cached answer, no lookup", v, src.started())
	}
	clk.add(15 * time.Second) // 25 s: past RefreshAfter, within TTL
	if v := get(); v[0] != "old" {
		t.Fatalf("at 25 s: %v, want the cached answer at once", v)
	}
	waitStarted(t, src, 2) // the refresh, in the background
	if v := get(); v[0] != "old" || src.started() != 2 {
		t.Fatalf("during the refresh: %v, %d lookups; want the cached answer and one refresh", v, src.started())
	}
	src.release <- []string{"new"}
	deadline := time.Now().Add(5 * time.Second)
	for get()[0] != "new" {
		if time.Now().After(deadline) {
			t.Fatal("the refresh's answer never replaced the old one")
		}
		time.Sleep(time.Millisecond)
	}
	clk.add(31 * time.Second) // past TTL of the refreshed answer
	done := make(chan []string, 1)
	go func() { done <- get() }()
	waitStarted(t, src, 3)
	select {
	case v := <-done:
		t.Fatalf("past TTL a caller got %v without waiting for the lookup", v)
	case <-time.After(20 * time.Millisecond):
	}
	src.release <- []string{"newer"}
	if v := <-done; v[0] != "newer" {
		t.Errorf("past TTL: %v", v)
	}
}

// TestFailedRefreshKeepsLastGood: a refresh that fails leaves the last
// good answer in place until TTL and is not tried again by the very next
// caller, and a failed cold lookup is not cached: the next caller looks
// up again.
func TestFailedRefreshKeepsLastGood(t *testing.T) {
	src := newFake()
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(src.lookup, Config{TTL: 30 * time.Second, RefreshAfter: 20 * time.Second, Now: clk.now})
	go func() { waitStarted(t, src, 1); src.release <- []string{"good"} }()
	c.Get(context.Background(), "k")
	clk.add(21 * time.Second)
	src.mu.Lock()
	src.err = errors.New("dht unreachable")
	src.mu.Unlock()
	c.Get(context.Background(), "k")
	waitStarted(t, src, 2)
	src.release <- nil
	deadline := time.Now().Add(5 * time.Second)
	for c.Lookups() != 2 || func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.entries["k"].run != nil }() {
		if time.Now().After(deadline) {
			t.Fatal("the refresh did not end")
		}
		time.Sleep(time.Millisecond)
	}
	if v, err := c.Get(context.Background(), "k"); err != nil || v[0] != "good" || c.Lookups() != 2 {
		t.Errorf("after a failed refresh: %v, %v, %d lookups; want the last good answer and no new lookup yet", v, err, c.Lookups())
	}

	// A cold key whose lookup fails: the error reaches the caller and is
	// not kept.
	go func() { waitStarted(t, src, 3); src.release <- nil }()
	if _, err := c.Get(context.Background(), "cold"); err == nil {
		t.Fatal("a failed lookup answered no error")
	}
	src.mu.Lock()
	src.err = nil
	src.mu.Unlock()
	go func() { waitStarted(t, src, 4); src.release <- []string{"found"} }()
	if v, err := c.Get(context.Background(), "cold"); err != nil || v[0] != "found" {
		t.Errorf("after a failed lookup, the next: %v, %v; want a new lookup's answer", v, err)
	}
}

// TestTimeoutBoundsANeverEndingSource: a source that never ends is cut at
// Timeout, and the caller is told so.
func TestTimeoutBoundsANeverEndingSource(t *testing.T) {
	src := newFake()
	c := New(src.lookup, Config{Timeout: 30 * time.Millisecond})
	_, err := c.Get(context.Background(), "k")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a source that never ends: %v, want the lookup's deadline", err)
	}
}

// TestForget: a forgotten key is looked up again.
func TestForget(t *testing.T) {
	src := newFake()
	c := New(src.lookup, Config{})
	go func() { waitStarted(t, src, 1); src.release <- []string{"a"} }()
	c.Get(context.Background(), "k")
	c.Forget("k")
	go func() { waitStarted(t, src, 2); src.release <- []string{"b"} }()
	if v, _ := c.Get(context.Background(), "k"); v[0] != "b" {
		t.Errorf("after Forget: %v", v)
	}
}

// TestEmptyAnswerKeptBriefly: an answer with no provider is kept for
// EmptyTTL only, so that a name published again after a router's restart
// is found at the next lookup after it, not half a minute on; a
// non-empty answer is kept its full TTL.
func TestEmptyAnswerKeptBriefly(t *testing.T) {
	src := newFake()
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(src.lookup, Config{TTL: 30 * time.Second, EmptyTTL: 2 * time.Second, Now: clk.now})
	go func() { waitStarted(t, src, 1); src.release <- nil }()
	if v, err := c.Get(context.Background(), "k"); err != nil || len(v) != 0 {
		t.Fatalf("first: %v, %v", v, err)
	}
	clk.add(time.Second)
	if v, _ := c.Get(context.Background(), "k"); len(v) != 0 || src.started() != 1 {
		t.Fatalf("within EmptyTTL: %v, %d lookups; want the empty answer kept", v, src.started())
	}
	clk.add(1500 * time.Millisecond)
	go func() { waitStarted(t, src, 2); src.release <- []string{"back"} }()
	if v, _ := c.Get(context.Background(), "k"); len(v) != 1 || v[0] != "back" {
		t.Fatalf("past EmptyTTL: %v, want a new lookup's answer", v)
	}
	clk.add(10 * time.Second)
	if v, _ := c.Get(context.Background(), "k"); len(v) != 1 || src.started() != 2 {
		t.Errorf("a provider found is kept past EmptyTTL: %v, %d lookups", v, src.started())
	}
}
