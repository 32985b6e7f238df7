package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
)

// TestLifecycle walks one gVisor sandbox through every tier, calling it
// through the gateway each time: frozen and snapshot keep its memory (the
// demo's in-memory counter), detached is a cold start, and delete leaves
// nothing behind.
func TestLifecycle(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	sb := d.create(t, "web", "life")
	ep := endpoint(t, sb)
	id := sb.ID

	expectCount(t, ep, 1, "first call")
	if st := d.runscStatus(t, id); st != "running" {
		t.Fatalf("hot sandbox: runsc says %q, want running", st)
	}

	d.transition(t, id, "freeze", api.TierFrozen)
	if !exists(netnsPath(id)) {
		t.Errorf("a frozen sandbox should keep its network namespace %s", netnsPath(id))
	}
	if st := d.runscStatus(t, id); st != "paused" {
		t.Fatalf("frozen sandbox: runsc says %q, want paused", st)
	}
	expectCount(t, ep, 2, "call to the frozen sandbox (memory kept)")
	got := d.get(t, id)
	if got.Tier != api.TierHot || got.LastWakeFrom != api.TierFrozen {
		t.Fatalf("after a call to the frozen sandbox: tier %q last_wake_from %q, want hot from frozen", got.Tier, got.LastWakeFrom)
	}
	// A frozen wake does not rescore its processes (node.wake): they keep
	// the high OOM score they got when they started.
	d.checkOOMScores(t, id, "after a frozen wake")

	// The gateway is the only way in: a host process dialling the
	// sandbox's address directly is reset at once (such a connection would
	// otherwise be left established and break the checkpoint below).
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(sb.Address, "8000"), 3*time.Second); err == nil {
		c.Close()
		t.Errorf("a direct host connection to %s:8000 was accepted; only the gateway may connect", sb.Address)
	}
	d.transition(t, id, "snapshot", api.TierSnapshot)
	// The image is complete when the snapshot answers; the stopped
	// container, the namespace and the veth go just after it
	// (internal/node: checkpoint's finish).
	if ents, err := os.ReadDir(d.snapshotDir(id)); err != nil || len(ents) == 0 {
		t.Fatalf("snapshot sandbox has no checkpoint image in %s (%v, %d entries)", d.snapshotDir(id), err, len(ents))
	}
	for _, p := range settled(func() []string {
		var out []string
		if exists(netnsPath(id)) {
			out = append(out, "snapshot sandbox still has its network namespace "+netnsPath(id))
		}
		if linkExists(hostLink(id)) {
			out = append(out, "snapshot sandbox still has its host link "+hostLink(id))
		}
		if st := d.runscState(id); len(st) > 0 {
			out = append(out, fmt.Sprintf("snapshot sandbox still has runsc state %v", st))
		}
		for pid, cl := range processesMentioning(d.sandboxDir(id) + "/") {
			out = append(out, fmt.Sprintf("snapshot sandbox still has process %d: %.200s", pid, cl))
		}
		return out
	}) {
		t.Error(p)
	}
	if n := curlCount(t, ep); n != 3 {
		t.Fatalf("call (curl) to the snapshot sandbox answered count=%d, want 3 (memory restored from disk)", n)
	}
	got = d.get(t, id)
	if got.Tier != api.TierHot || got.LastWakeFrom != api.TierSnapshot {
		t.Fatalf("after a call to the snapshot sandbox: tier %q last_wake_from %q, want hot from snapshot", got.Tier, got.LastWakeFrom)
	}
	if got.Address != sb.Address {
		t.Errorf("address changed across snapshot/restore: %s, was %s", got.Address, sb.Address)
	}

	d.transition(t, id, "detach", api.TierDetached)
	if exists(netnsPath(id)) || exists(d.snapshotDir(id)) {
		t.Errorf("detached sandbox kept its network namespace (%v) or snapshot image (%v)", exists(netnsPath(id)), exists(d.snapshotDir(id)))
	}
	expectCount(t, ep, 1, "call to the detached sandbox (cold start)")
	got = d.get(t, id)
	if got.Tier != api.TierHot || got.LastWakeFrom != api.TierDetached {
		t.Fatalf("after a call to the detached sandbox: tier %q last_wake_from %q, want hot from detached", got.Tier, got.LastWakeFrom)
	}

	d.deleteSandbox(t, id)
	if r, err := call(http.MethodGet, ep+"/", nil, nil, gatewayTimeout); err == nil {
		t.Errorf("the endpoint of a deleted sandbox still answers: HTTP %d %q", r.Status, r.Body)
	}
}

// TestLifecycleProcess is the same walk on the process backend, which has
// no snapshot tier on this machine (CRIU): snapshot must say so.
func TestLifecycleProcess(t *testing.T) {
	d := startDaemon(t, "--backend", "process")
	d.registerWeb(t, "web")
	sb := d.create(t, "web", "plain")
	if sb.Backend != "process" {
		t.Errorf("sandbox backend %q, want process", sb.Backend)
	}
	ep := endpoint(t, sb)
	id := sb.ID

	expectCount(t, ep, 1, "first call")
	d.transition(t, id, "freeze", api.TierFrozen)
	expectCount(t, ep, 2, "call to the frozen sandbox (memory kept)")
	if got := d.get(t, id); got.Tier != api.TierHot || got.LastWakeFrom != api.TierFrozen {
		t.Fatalf("after a call to the frozen sandbox: tier %q last_wake_from %q, want hot from frozen", got.Tier, got.LastWakeFrom)
	}

	_, err := d.C.Transition(ctxT(t), id, "snapshot")
	e := expectAPIError(t, err, http.StatusConflict, api.CodeNotSupported)
	if !strings.Contains(e.Body.Message, "CRIU") {
		t.Errorf("not_supported message does not mention CRIU: %q", e.Body.Message)
	}
	if got := d.get(t, id); got.Tier != api.TierHot || got.Transition != "" {
		t.Fatalf("after the refused snapshot: tier %q transition %q, want hot", got.Tier, got.Transition)
	}
	expectCount(t, ep, 3, "call after the refused snapshot (still running)")

	d.transition(t, id, "detach", api.TierDetached)
	expectCount(t, ep, 1, "call to the detached sandbox (cold start)")
	if got := d.get(t, id); got.Tier != api.TierHot || got.LastWakeFrom != api.TierDetached {
		t.Fatalf("after a call to the detached sandbox: tier %q last_wake_from %q, want hot from detached", got.Tier, got.LastWakeFrom)
	}
	d.deleteSandbox(t, id)
}

// TestCycles freezes and wakes one sandbox 20 times, then snapshots and
// restores it 20 times; every call must see the counter one higher.
func TestCycles(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	sb := d.create(t, "web", "cycles")
	ep := endpoint(t, sb)
	want := 1
	expectCount(t, ep, want, "first call")
	for _, c := range []struct {
		op   string
		tier api.Tier
	}{{"freeze", api.TierFrozen}, {"snapshot", api.TierSnapshot}} {
		for i := 1; i <= 20; i++ {
			d.transition(t, sb.ID, c.op, c.tier)
			want++
			// Every other call with curl: clients close differently.
			if i%2 == 1 {
				if n := curlCount(t, ep); n != want {
					t.Fatalf("%s cycle %d: curl answered count=%d, want %d", c.op, i, n, want)
				}
			} else {
				expectCount(t, ep, want, c.op+" cycle "+itoa(i))
			}
			if got := d.get(t, sb.ID); got.LastWakeFrom != c.tier {
				t.Fatalf("%s cycle %d: last_wake_from %q, want %q", c.op, i, got.LastWakeFrom, c.tier)
			}
		}
	}
}

// TestConcurrentWake fires 16 calls at once at a sandbox on disk, then at a
// detached one: one wake serves them all, every call answers 200, and the
// counters they saw are distinct and contiguous.
func TestConcurrentWake(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	sb := d.create(t, "web", "crowd")
	ep := endpoint(t, sb)
	expectCount(t, ep, 1, "first call")

	burst := func(t *testing.T, from api.Tier, first int) {
		t.Helper()
		const n = 16
		counts := make([]int, n)
		errs := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := call(http.MethodGet, ep+"/", nil, nil, gatewayTimeout)
				switch {
				case err != nil:
					errs[i] = err.Error()
				case r.Status != http.StatusOK:
					errs[i] = "HTTP " + itoa(r.Status) + ": " + r.Body
				default:
					if counts[i], err = parseCount(r.Body); err != nil {
						errs[i] = err.Error()
					}
				}
			}()
		}
		wg.Wait()
		for i, e := range errs {
			if e != "" {
				t.Errorf("call %d of %d during the wake from %s: %s", i, n, from, e)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		slices.Sort(counts)
		for i, c := range counts {
			if c != first+i {
				t.Fatalf("counters seen during the wake from %s: %v, want %d..%d (distinct, contiguous: one wake, state kept)", from, counts, first, first+n-1)
			}
		}
		if got := d.get(t, sb.ID); got.Tier != api.TierHot || got.LastWakeFrom != from {
			t.Fatalf("after the burst: tier %q last_wake_from %q, want hot from %s", got.Tier, got.LastWakeFrom, from)
		}
	}

	t.Run("snapshot", func(t *testing.T) {
		d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
		burst(t, api.TierSnapshot, 2)
	})
	t.Run("detached", func(t *testing.T) {
		d.transition(t, sb.ID, "detach", api.TierDetached)
		burst(t, api.TierDetached, 1)
	})
}

// TestApp64 runs the 64 MiB numpy demo through a snapshot and restore: the
// heap is still there afterwards.
func TestApp64(t *testing.T) {
	d := startDaemon(t)
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{
		Name: "app64", RootfsDir: app64Rootfs,
		Process: api.Process{Args: app64Demo.Args, Env: app64Demo.Env}, Ports: app64Demo.Ports,
	}); err != nil {
		t.Fatal(err)
	}
	sb := d.create(t, "app64", "heavy")
	ep := endpoint(t, sb)
	const heap = " heap_bytes=67108864"
	body := getBody(t, ep, "/")
	if n, err := parseCount(body); err != nil || n != 1 || !strings.Contains(body, heap) {
		t.Fatalf("first call answered %q, want count=1 and%s", body, heap)
	}
	d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
	body = getBody(t, ep, "/")
	if n, err := parseCount(body); err != nil || n != 2 || !strings.Contains(body, heap) {
		t.Fatalf("call after restore answered %q, want count=2 and%s", body, heap)
	}
	if got := d.get(t, sb.ID); got.LastWakeFrom != api.TierSnapshot {
		t.Fatalf("last_wake_from %q, want snapshot", got.LastWakeFrom)
	}
	// Every page of the restored heap reads back: 8 Mi float64 ones.
	if body := getBody(t, ep, "/heap"); strings.TrimSpace(body) != "sum=8388608 bytes=67108864" {
		t.Fatalf("GET /heap after restore: %q, want sum=8388608 bytes=67108864", body)
	}
	d.deleteSandbox(t, sb.ID)
}
