package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
)

// TestCrashRestart kills the daemon with SIGKILL and checks that the next
// start over the same data dir reconciles with what is really there.
func TestCrashRestart(t *testing.T) {
	// A hot, a frozen and a snapshot sandbox survive kill -9 in their tiers,
	// on the same gateway ports, with their memory.
	t.Run("tiers", func(t *testing.T) {
		d := startDaemon(t)
		d.registerWeb(t, "web")
		want := map[string]api.Tier{"hot": api.TierHot, "frozen": api.TierFrozen, "snap": api.TierSnapshot}
		before := map[string]api.Sandbox{}
		for _, name := range []string{"hot", "frozen", "snap"} {
			sb := d.create(t, "web", name)
			expectCount(t, endpoint(t, sb), 1, name+": first call")
			before[name] = sb
		}
		d.transition(t, before["frozen"].ID, "freeze", api.TierFrozen)
		d.transition(t, before["snap"].ID, "snapshot", api.TierSnapshot)

		d.Kill(t)
		d.Start(t)

		for name, sb := range before {
			got := d.get(t, sb.ID)
			if got.Tier != want[name] || got.Transition != "" {
				t.Errorf("%s after kill -9 and restart: tier %q transition %q note %q, want %q", name, got.Tier, got.Transition, got.Note, want[name])
			}
			if endpoint(t, got) != endpoint(t, sb) {
				t.Errorf("%s: endpoint changed across the restart: %s, was %s", name, endpoint(t, got), endpoint(t, sb))
			}
		}
		d.checkKernelObjects(t)
		if t.Failed() {
			t.FailNow()
		}
		for name, sb := range before {
			expectCount(t, endpoint(t, sb), 2, name+": call after kill -9 and restart (memory kept)")
			got := d.get(t, sb.ID)
			if name != "hot" && got.LastWakeFrom != want[name] {
				t.Errorf("%s: last_wake_from %q, want %q", name, got.LastWakeFrom, want[name])
			}
		}
	})

	// kill -9 at a random moment of a snapshot: the sandbox ends in a
	// consistent tier, answers, and nothing is orphaned.
	t.Run("mid_snapshot", func(t *testing.T) {
		d := startDaemon(t)
		d.registerWeb(t, "web")
		sb := d.create(t, "web", "victim")
		ep := endpoint(t, sb)
		n := getCount(t, ep)
		for round := 1; round <= 5; round++ {
			delay := time.Duration(rand.IntN(301)) * time.Millisecond
			done := make(chan error, 1)
			go func() {
				_, err := d.C.Transition(context.Background(), sb.ID, "snapshot")
				done <- err
			}()
			time.Sleep(delay)
			d.Kill(t)
			callErr := <-done
			var inflight []string
			for pid, cl := range processesMentioning(d.DataDir + "/") {
				if !strings.Contains(cl, "runsc-sandbox") && !strings.Contains(cl, "runsc-gofer") {
					inflight = append(inflight, fmt.Sprintf("%d: %.160s", pid, cl))
				}
			}
			d.Start(t)

			got := d.get(t, sb.ID)
			t.Logf("round %d: killed %v into the snapshot (call returned %v); commands the daemon had running: %q; after restart: tier %s, note %q",
				round, delay, callErr, inflight, got.Tier, got.Note)
			if got.Transition != "" {
				t.Errorf("round %d: transition %q still recorded after restart", round, got.Transition)
			}
			if exists(filepath.Join(d.sandboxDir(sb.ID), "snapshot.tmp")) {
				t.Errorf("round %d: an incomplete image (snapshot.tmp) is left", round)
			}
			switch got.Tier {
			case api.TierHot:
			case api.TierSnapshot:
				if ents, err := os.ReadDir(d.snapshotDir(sb.ID)); err != nil || len(ents) == 0 {
					t.Errorf("round %d: tier snapshot but no image in %s (%v)", round, d.snapshotDir(sb.ID), err)
				}
			case api.TierDetached:
				if got.Note == "" {
					t.Errorf("round %d: the sandbox was hot and is detached after the restart, with no note saying why", round)
				}
			default:
				t.Errorf("round %d: tier %q after kill -9 mid-snapshot, want hot, snapshot or detached", round, got.Tier)
			}
			d.checkKernelObjects(t)
			if t.Failed() {
				t.FailNow()
			}
			m := getCount(t, ep)
			switch {
			case got.Tier == api.TierDetached:
				if m != 1 {
					t.Fatalf("round %d: detached sandbox answered count=%d after a cold start, want 1", round, m)
				}
			case got.Note == "":
				// Hot or snapshot and nothing reported: memory must be kept.
				if m != n+1 {
					t.Fatalf("round %d: %s sandbox with no note answered count=%d, want %d (memory lost silently)", round, got.Tier, m, n+1)
				}
			default:
				// The note says what happened (e.g. re-created cold).
				if m != n+1 && m != 1 {
					t.Fatalf("round %d: answered count=%d, want %d (kept) or 1 (re-created, as the note says)", round, m, n+1)
				}
			}
			n = m
			d.checkKernelObjects(t)
		}
	})

	// kill -9 at a random moment of a wake from disk (the restore a call
	// through the gateway starts): the image is not lost, the sandbox ends
	// hot or still on disk, and the next call gets its memory.
	t.Run("mid_wake", func(t *testing.T) {
		d := startDaemon(t)
		d.registerWeb(t, "web")
		sb := d.create(t, "web", "sleeper")
		ep := endpoint(t, sb)
		n := getCount(t, ep)
		for round := 1; round <= 4; round++ {
			d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
			delay := time.Duration(rand.IntN(301)) * time.Millisecond
			type result struct {
				r   reply
				err error
			}
			done := make(chan result, 1)
			go func() {
				r, err := call("GET", ep+"/", nil, nil, gatewayTimeout)
				done <- result{r, err}
			}()
			time.Sleep(delay)
			d.Kill(t)
			res := <-done
			d.Start(t)

			got := d.get(t, sb.ID)
			t.Logf("round %d: killed %v into the wake (call: HTTP %d %q, err %v); after restart: tier %s, note %q",
				round, delay, res.r.Status, strings.TrimSpace(res.r.Body), res.err, got.Tier, got.Note)
			if got.Transition != "" {
				t.Errorf("round %d: transition %q still recorded after restart", round, got.Transition)
			}
			switch got.Tier {
			case api.TierHot:
			case api.TierSnapshot:
				if ents, err := os.ReadDir(d.snapshotDir(sb.ID)); err != nil || len(ents) == 0 {
					t.Errorf("round %d: tier snapshot but no image in %s (%v)", round, d.snapshotDir(sb.ID), err)
				}
			default:
				t.Errorf("round %d: tier %q (note %q) after kill -9 mid-wake, want hot or snapshot: the image was complete", round, got.Tier, got.Note)
			}
			d.checkKernelObjects(t)
			if t.Failed() {
				t.FailNow()
			}
			// The interrupted call may or may not have reached the sandbox.
			lo, hi := n+1, n+2
			if res.err == nil && res.r.Status == 200 {
				if c, err := parseCount(res.r.Body); err == nil {
					lo, hi = c+1, c+1
				}
			}
			m := getCount(t, ep)
			if m < lo || m > hi {
				t.Fatalf("round %d: answered count=%d after the restart, want %d..%d (memory kept)", round, m, lo, hi)
			}
			n = m
		}
	})

	// What belongs to no sandbox (a namespace, a host link, a sandbox
	// directory) is removed at start; the real sandbox is untouched.
	t.Run("orphans", func(t *testing.T) {
		d := startDaemon(t)
		d.registerWeb(t, "web")
		keep := d.create(t, "web", "keep")
		expectCount(t, endpoint(t, keep), 1, "first call")
		d.Stop(t)

		stray := "deadbe" + randHex(3)
		t.Cleanup(func() {
			if exists(netnsPath(stray)) {
				exec.Command("ip", "netns", "delete", "ss-"+stray).Run()
			}
			if linkExists(hostLink(stray)) {
				exec.Command("ip", "link", "delete", hostLink(stray)).Run()
			}
		})
		for _, args := range [][]string{
			{"netns", "add", "ss-" + stray},
			{"link", "add", hostLink(stray), "type", "veth", "peer", "name", "eth0", "netns", "ss-" + stray},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v: %s", args, err, out)
			}
		}
		dir := d.sandboxDir(stray)
		if err := os.MkdirAll(filepath.Join(dir, "upper", "srv"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "upper", "srv", "left.txt"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}

		d.Start(t)
		if exists(netnsPath(stray)) {
			t.Errorf("orphaned network namespace ss-%s survived the restart", stray)
		}
		if linkExists(hostLink(stray)) {
			t.Errorf("orphaned host link %s survived the restart", hostLink(stray))
		}
		if exists(dir) {
			t.Errorf("orphaned sandbox directory %s survived the restart", dir)
		}
		if got := d.get(t, keep.ID); got.Tier != api.TierHot {
			t.Fatalf("the real sandbox is %q after the restart, want hot", got.Tier)
		}
		expectCount(t, endpoint(t, keep), 2, "the real sandbox after the restart")
		d.checkKernelObjects(t)
	})
}
