package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
)

// memAvailableMiB reads MemAvailable from /proc/meminfo.
func memAvailableMiB(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if _, err := fmt.Sscanf(sc.Text(), "MemAvailable: %d kB", &kb); err == nil {
			return kb / 1024
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// TestMemoryReserve restarts a daemon with two hot sandboxes and a reserve
// it can never meet: it refuses new sandboxes and wakes with 503 and
// Retry-After, and pushes both sandboxes to disk. With the reserve lifted
// they wake with their memory.
func TestMemoryReserve(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	a := d.create(t, "web", "a")
	b := d.create(t, "web", "b")
	for _, sb := range []api.Sandbox{a, b} {
		expectCount(t, endpoint(t, sb), 1, sb.Name+": first call")
	}
	d.Stop(t)

	reserve := memAvailableMiB(t) + 100000
	d.Start(t, "--memory-reserve", strconv.FormatInt(reserve, 10))

	r := d.raw(t, "POST", "/v1/sandboxes", d.Token, "application/json", strings.NewReader(`{"template":"web","name":"c"}`))
	e := expectErrorReply(t, r, http.StatusServiceUnavailable, api.CodeUnavailable)
	if !strings.Contains(strings.ToLower(e.Message), "memory") {
		t.Errorf("503 message does not mention memory: %q", e.Message)
	}
	if r.Header.Get("Retry-After") == "" {
		t.Errorf("503 on create has no Retry-After header")
	}
	if st, err := d.C.Node(ctxT(t)); err != nil || st.MemReserveMiB != reserve {
		t.Errorf("GET /v1/node: reserve %d (err %v), want %d", st.MemReserveMiB, err, reserve)
	}

	for _, sb := range []api.Sandbox{a, b} {
		got := d.waitTier(t, sb.ID, api.TierSnapshot, 60*time.Second)
		if got.Note != "" {
			t.Errorf("%s pushed to disk with note %q", sb.Name, got.Note)
		}
		if exists(netnsPath(sb.ID)) {
			t.Errorf("%s is snapshot but kept its network namespace", sb.Name)
		}
	}

	// A call now needs a wake the node cannot afford: refused, not queued.
	gr, err := call(http.MethodGet, endpoint(t, a)+"/", nil, nil, gatewayTimeout)
	if err != nil {
		t.Fatalf("call through the gateway while short on memory: %v (want 503)", err)
	}
	if gr.Status != http.StatusServiceUnavailable || gr.Header.Get("Retry-After") == "" {
		t.Fatalf("call through the gateway while short on memory: HTTP %d Retry-After %q body %q, want 503 with Retry-After",
			gr.Status, gr.Header.Get("Retry-After"), gr.Body)
	}
	_, err = d.C.Transition(ctxT(t), b.ID, "wake")
	if e := expectAPIError(t, err, http.StatusServiceUnavailable, api.CodeUnavailable); !strings.Contains(strings.ToLower(e.Body.Message), "memory") {
		t.Errorf("503 on wake does not mention memory: %q", e.Body.Message)
	}
	for _, sb := range []api.Sandbox{a, b} {
		if got := d.get(t, sb.ID); got.Tier != api.TierSnapshot {
			t.Fatalf("after the refused wakes %s is %q, want snapshot", sb.Name, got.Tier)
		}
	}
	if sbs, _ := d.C.Sandboxes(ctxT(t)); len(sbs) != 2 {
		t.Fatalf("%d sandboxes, want 2 (the refused create must not leave one)", len(sbs))
	}
	d.checkKernelObjects(t)

	d.Restart(t, "--memory-reserve", "0")
	for _, sb := range []api.Sandbox{a, b} {
		expectCount(t, endpoint(t, sb), 2, sb.Name+": call after the reserve is lifted (memory kept on disk)")
		if got := d.get(t, sb.ID); got.LastWakeFrom != api.TierSnapshot {
			t.Errorf("%s: last_wake_from %q, want snapshot", sb.Name, got.LastWakeFrom)
		}
	}
}

// TestIdleTimers shortens the idle timers: a sandbox left alone walks
// hot → frozen → snapshot → detached, and traffic brings it back to hot.
func TestIdleTimers(t *testing.T) {
	d := startDaemon(t, "--freeze-after", "1s", "--snapshot-after", "1s", "--detach-after", "2s")
	d.registerWeb(t, "web")
	sb := d.create(t, "web", "idle")
	ep := endpoint(t, sb)
	expectCount(t, ep, 1, "first call")

	const step = 30 * time.Second
	d.waitTier(t, sb.ID, api.TierFrozen, step)
	snap := d.waitTier(t, sb.ID, api.TierSnapshot, step)
	if snap.Note != "" {
		t.Errorf("idle snapshot left a note: %q", snap.Note)
	}
	d.waitTier(t, sb.ID, api.TierDetached, step)
	if exists(netnsPath(sb.ID)) || exists(d.snapshotDir(sb.ID)) {
		t.Errorf("idle-detached sandbox kept its network namespace or snapshot image")
	}

	before := time.Now().Add(-time.Second)
	expectCount(t, ep, 1, "call to the idle-detached sandbox (cold start)")
	got := d.get(t, sb.ID)
	if got.LastWakeFrom != api.TierDetached {
		t.Errorf("last_wake_from %q, want detached", got.LastWakeFrom)
	}
	if got.LastActive.Before(before) {
		t.Errorf("last_active %v was not refreshed by the call at %v", got.LastActive, before)
	}

	// It walks down again, and a call while it sleeps wakes it with its
	// memory (from frozen, or from snapshot if the timer got there first).
	d.waitTier(t, sb.ID, api.TierFrozen, step)
	expectCount(t, ep, 2, "call to the idle-frozen sandbox")
	got = d.get(t, sb.ID)
	if got.LastWakeFrom != api.TierFrozen && got.LastWakeFrom != api.TierSnapshot {
		t.Errorf("last_wake_from %q, want frozen (or snapshot)", got.LastWakeFrom)
	}
}
