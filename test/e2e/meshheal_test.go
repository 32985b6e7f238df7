package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/internal/sam/meshlab"
	"sandstorm/internal/sam/meshpeer"
)

// The mesh heals itself (issue 29). Each lab is a mesh of machines on
// this one (internal/sam/meshlab): a control plane, a router and two
// members, each machine a network namespace, the members able to reach
// only the control plane and the router — so they reach each other
// through the router's relay only, as fleet up's nodes do — each serving
// a model the other calls, probed each way throughout: a chat completion
// through one member's agent socket, and a lookup of the other's model
// past the cache.
//
// TestMeshHeals kills -9 the router of each of healPoints labs at its
// own point of the members' check interval and starts it again at once,
// as a supervisor would. After each, every cross-node call must succeed
// within healGoal of the router being back and go on succeeding for
// healWatch. Beside them, labs with two routers lose one for good: no
// cross-node call may fail twice in a row (an agent's one retry
// succeeds). Then a member serving a model goes away: the model, still
// granted, is "no member serves it now" (503, Retry-After), not "not
// granted".
const (
	healPoints = 20
	healGoal   = 5 * time.Second
	healWatch  = time.Minute
	twoRouters = 2
	// The probes run every healDense from a second before a lab's fault
	// for healDenseFor, else every second.
	healDense    = 100 * time.Millisecond
	healDenseFor = 15 * time.Second
)

func TestMeshHeals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bins := meshlab.Bins{ControlPlane: samControlPlaneBin, Router: samRouterBin, Node: samNodeBin}
	one, two := startLabs(ctx, t, bins, healPoints, 1, 201), startLabs(ctx, t, bins, twoRouters, 2, 200)
	probe := func(l *meshlab.Lab) *meshlab.Prober {
		p := l.Probe(ctx, time.Second, healDense)
		t.Cleanup(p.Stop)
		return p
	}

	// Lab k's router dies k/healPoints of the members' check interval
	// (meshpeer.CheckInterval) later in it than lab 0's — where a restart
	// fell against the members' timers decided, before, whether they
	// healed — and k whole intervals later, so that the labs' probes are
	// not all dense at once.
	start := time.Now().Add(2 * time.Second)
	phase := func(k int) time.Duration { return meshpeer.CheckInterval * time.Duration(k) / healPoints }
	back := make([]time.Time, len(one))
	errs := make([]error, len(one))
	probers := make([]*meshlab.Prober, len(one))
	var wg sync.WaitGroup
	for k, l := range one {
		probers[k] = probe(l)
		wg.Go(func() {
			at := start.Add(time.Duration(k)*meshpeer.CheckInterval + phase(k))
			sleepTill(at.Add(-time.Second))
			probers[k].Densely(time.Second + healDenseFor)
			sleepTill(at)
			l.Routers[0].Proc.Kill()
			_, back[k], errs[k] = l.RestartRouter(ctx, l.Routers[0])
		})
	}
	twoProbers := make([]*meshlab.Prober, len(two))
	for k, l := range two {
		twoProbers[k] = probe(l)
		twoProbers[k].Densely(time.Second + healDenseFor)
	}
	sleepTill(start)
	gone := time.Now()
	for _, l := range two {
		l.Routers[0].Proc.Kill()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	last := gone
	for _, b := range back {
		last = later(last, b)
	}
	sleepTill(last.Add(healWatch))

	var worst time.Duration
	for k, l := range one {
		probers[k].Stop()
		rec := probers[k].Record()
		h := meshlab.Measure(rec, back[k], back[k].Add(healWatch))
		if err := h.Err(); err != nil || h.After > healGoal {
			t.Errorf("lab %d (router killed at +%v of the check interval): healed %v after the router was back (goal %v), %v; each kind %v",
				k, phase(k), h.After, healGoal, err, h.Keys)
			logLab(t, l, rec, back[k])
		}
		if h.Relapses > 0 {
			t.Logf("lab %d: %d relapses after the router was back (failures %d)", k, h.Relapses, h.Failed)
		}
		worst = max(worst, h.After)
	}
	t.Logf("%d router restarts: the slowest healed %v after its router was back", len(one), worst.Round(time.Millisecond))
	for k, l := range two {
		twoProbers[k].Stop()
		rec := twoProbers[k].Record()
		h := meshlab.Measure(rec, gone, gone.Add(healWatch))
		if err := h.Err(); err != nil || h.LongestOutage > 1 {
			t.Errorf("two routers, one gone (lab %d): %d probes failed, %d in a row at most (want at most 1: one retry), %v", k, h.Failed, h.LongestOutage, err)
			logLab(t, l, rec, gone)
		}
		t.Logf("two routers, one gone (lab %d): %d of the probes failed, at most %d in a row", k, h.Failed, h.LongestOutage)
	}

	grantedButGone(ctx, t, one[0])
}

// grantedButGone: node-b, the only member serving m-node-b, stops; node-a's
// agent, granted the model, is told no member serves it now.
func grantedButGone(ctx context.Context, t *testing.T, l *meshlab.Lab) {
	a, b := l.Members[0], l.Members[1]
	b.Proc.Stop()
	body, _ := json.Marshal(map[string]any{"model": b.Model, "messages": []any{map[string]string{"role": "user", "content": "x"}}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://mesh.sam.alt/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("X-Sam-Principal", meshlab.Principal)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", a.Socket)
		}}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(data), fmt.Sprintf(`model \"%s\" is granted to principal \"%s\"`, b.Model, meshlab.Principal)) {
		t.Errorf("a granted model whose only member is gone: %s (Retry-After %q) %s", resp.Status, resp.Header.Get("Retry-After"), data)
	}
}

// startLabs starts n labs with routers routers each, four at a time,
// each on its own LAN 10.<net>.k.0/24.
func startLabs(ctx context.Context, t *testing.T, bins meshlab.Bins, n, routers, net int) []*meshlab.Lab {
	t.Helper()
	labs := make([]*meshlab.Lab, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			labs[k], errs[k] = meshlab.New(ctx, meshlab.Config{Bins: bins, Net: fmt.Sprintf("10.%d.%d", net, k),
				Tag: fmt.Sprintf("h%d%d-%d", os.Getpid()%1000, routers, k), Routers: routers,
				Dir: filepath.Join(workDir, fmt.Sprintf("meshheal-%d-%02d", routers, k))})
		})
	}
	wg.Wait()
	for _, l := range labs {
		if l != nil {
			t.Cleanup(l.Close)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return labs
}

// logLab logs a failed lab's probes from a second before since, and the
// tails of its logs (the work dir goes with the run).
func logLab(t *testing.T, l *meshlab.Lab, rec map[string][]meshlab.Probe, since time.Time) {
	t.Helper()
	for k, ps := range rec {
		for _, p := range ps {
			if !p.OK && p.At.After(since.Add(-time.Second)) {
				t.Logf("  %s at %+v (took %v): %s", k, p.At.Sub(since).Round(time.Millisecond), p.For.Round(time.Millisecond), p.Err)
			}
		}
	}
	logs, _ := filepath.Glob(filepath.Join(l.Dir(), "*.log"))
	for _, f := range logs {
		b, _ := os.ReadFile(f)
		t.Logf("%s:\n%s", filepath.Base(f), tail(string(b), 15))
	}
}

func sleepTill(at time.Time) { time.Sleep(time.Until(at)) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
