package sambench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"sandstorm/internal/bench"
	"sandstorm/internal/sam/discovery"
)

// DiscoveryConfig is the discovery benchmark's shape (issue 17's: a cold
// lookup with 4 providers on a loopback mesh of 20 nodes; 200 concurrent
// callers on a cold cache).
type DiscoveryConfig struct {
	Nodes, Providers, Callers, Rounds int
}

// Discovery measures provider discovery on a discovery.Loopback mesh, in
// Rounds rounds, each with a name of its own provided by Providers nodes:
//   - cold-lookup: one caller's Get on a member's empty cache (the seed
//     paid its 5.04 s timeout here);
//   - warm-get: the same caller's next Get, from the cache;
//   - callers/lookup and callers/slowest: Callers callers at once on
//     another member's empty cache — the one lookup they share (its own
//     time) and the slowest caller's wait; a round with more than one
//     lookup, or a caller answered later than twice the lookup, is noted
//     as failed (the goal).
func Discovery(ctx context.Context, cfg DiscoveryConfig, res *bench.Results, logf func(string, ...any)) error {
	if cfg.Nodes < cfg.Providers+2 || cfg.Providers < 1 || cfg.Callers < 1 || cfg.Rounds < 1 {
		return fmt.Errorf("discovery: want nodes ≥ providers + 2, and at least one provider, caller and round")
	}
	res.Params["discovery"] = cfg
	t0 := time.Now()
	l, err := discovery.NewLoopback(ctx, cfg.Nodes)
	if err != nil {
		return err
	}
	defer l.Close()
	logf("a loopback mesh of %d DHT servers (prefix %s) in %v", cfg.Nodes, discovery.ProtocolPrefix, time.Since(t0).Round(time.Millisecond))
	cold := res.AddSeries("discovery/cold-lookup", fmt.Sprintf("Get of a name %d of %d nodes provide, on a member's empty cache: the DHT walk to its end", cfg.Providers, cfg.Nodes), "5.04 s (a timeout waited out)")
	warm := res.AddSeries("discovery/warm-get", "the same caller's next Get: from the cache", "")
	shared := res.AddSeries("discovery/callers/lookup", fmt.Sprintf("%d callers at once on another member's empty cache: the one lookup they share, its own time", cfg.Callers), "")
	slowest := res.AddSeries("discovery/callers/slowest", fmt.Sprintf("the slowest of the %d callers' waits (goal: within 2 × the lookup)", cfg.Callers), "")
	for round := range cfg.Rounds {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := fmt.Sprintf("bench/model-%d-%d", time.Now().UnixNano(), round)
		order := rand.Perm(cfg.Nodes)
		for _, i := range order[:cfg.Providers] {
			if err := l.DHTs[i].Provide(ctx, discovery.Key(name), true); err != nil {
				return fmt.Errorf("round %d: provide from node %d: %w", round, i, err)
			}
		}
		asker, other := l.DHTs[order[cfg.Providers]], l.DHTs[order[cfg.Providers+1]]

		c := discovery.New(discovery.Providers(asker), discovery.Config{Timeout: time.Minute})
		t := time.Now()
		got, err := c.Get(ctx, name)
		d := time.Since(t)
		switch {
		case err != nil:
			cold.Fail("round %d: %v", round, err)
		case distinct(got) != cfg.Providers:
			cold.Fail("round %d: found %d providers of %d", round, distinct(got), cfg.Providers)
		default:
			cold.AddDuration(d)
		}
		t = time.Now()
		c.Get(ctx, name)
		warm.AddDuration(time.Since(t))

		var own time.Duration
		timed := func(ctx context.Context, key string) ([]peer.AddrInfo, error) {
			t := time.Now()
			defer func() { own = time.Since(t) }()
			return discovery.Providers(other)(ctx, key)
		}
		c2 := discovery.New(timed, discovery.Config{Timeout: time.Minute})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var worst time.Duration
		failed := 0
		for range cfg.Callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.Now()
				v, err := c2.Get(ctx, name)
				w := time.Since(t)
				mu.Lock()
				defer mu.Unlock()
				worst = max(worst, w)
				if err != nil || distinct(v) != cfg.Providers {
					failed++
				}
			}()
		}
		wg.Wait()
		switch {
		case failed > 0:
			slowest.Fail("round %d: %d of %d callers had no full answer", round, failed, cfg.Callers)
		case c2.Lookups() != 1:
			slowest.Fail("round %d: %d callers made %d lookups", round, cfg.Callers, c2.Lookups())
		default:
			shared.AddDuration(own)
			slowest.AddDuration(worst)
			if worst > 2*own {
				slowest.Note("round %d: the slowest caller waited %v, %.1f × the lookup (%v)", round, worst, float64(worst)/float64(own), own)
			}
		}
	}
	return nil
}

func distinct(ps []peer.AddrInfo) int {
	ids := map[peer.ID]bool{}
	for _, p := range ps {
		ids[p.ID] = true
	}
	return len(ids)
}
