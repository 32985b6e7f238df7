package discovery

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// TestLookupEndsWithTheWalk: on a loopback mesh of 20 DHT servers, four
// of which provide a model, a cold lookup from another member finds the
// four and returns because the walk ended — with a minute to spare on its
// deadline, it did not wait for a count that is not there — and 200
// callers at once share that one lookup.
func TestLookupEndsWithTheWalk(t *testing.T) {
	l, err := NewLoopback(context.Background(), 20)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hosts, dhts := l.Hosts, l.DHTs
	name := "model/llama-3-8b"
	want := map[peer.ID]bool{}
	for _, i := range []int{3, 8, 13, 17} {
		if err := dhts[i].Provide(context.Background(), Key(name), true); err != nil {
			t.Fatalf("provide from node %d: %v", i, err)
		}
		want[hosts[i].ID()] = true
	}
	c := New(Providers(dhts[19]), Config{Timeout: time.Minute})
	t0 := time.Now()
	got, err := c.Get(context.Background(), name)
	cold := time.Since(t0)
	if err != nil {
		t.Fatalf("cold lookup: %v (after %v)", err, cold)
	}
	ids := map[peer.ID]bool{}
	for _, p := range got {
		ids[p.ID] = true
	}
	if len(ids) != len(want) {
		t.Fatalf("found %d providers, want %d", len(ids), len(want))
	}
	for id := range want {
		if !ids[id] {
			t.Errorf("provider %s not found", id)
		}
	}
	t.Logf("cold lookup of 4 providers on 20 nodes: %v", cold)

	// 200 callers on another node's cold cache: one lookup.
	c2 := New(Providers(dhts[1]), Config{Timeout: time.Minute})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var took []time.Duration
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			v, err := c2.Get(context.Background(), name)
			mu.Lock()
			defer mu.Unlock()
			took = append(took, time.Since(t0))
			if err != nil || len(v) != 4 {
				t.Errorf("a caller got %d providers, %v", len(v), err)
			}
		}()
	}
	wg.Wait()
	if c2.Lookups() != 1 {
		t.Errorf("200 callers made %d lookups, want 1", c2.Lookups())
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("200 callers on a cold cache: one lookup, slowest caller %v", took[len(took)-1])
}
