package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/memguard"
)

// oomLines counts the kernel log's OOM-killer lines (global and per-cgroup).
func oomLines(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		t.Fatalf("dmesg: %v", err)
	}
	return len(oomRE.FindAll(out, -1))
}

var oomRE = regexp.MustCompile(`(?i)out of memory|oom-kill|oom_reaper`)

// TestMemoryFlood is issue 7's flood, scaled to CI: sandboxes that fill a
// 256 MiB heap right after they start, created four at a time against a
// reserve that leaves room for only a few. MemAvailable never falls below
// the reserve, the kernel kills nothing, the excess is refused with 503 (in
// words that say it is memory) or pushed to disk, and every sandbox that was
// accepted answers — with its memory, if it went to disk.
func TestMemoryFlood(t *testing.T) {
	const (
		total, parallel = 12, 4
		heapMiB         = 256
		limitMiB        = 448 // heap + Python and numpy + the sentry
		roomFor         = 4   // sandboxes at their limit above the reserve
	)
	avail := memAvailableMiB(t)
	reserve := avail - roomFor*limitMiB
	if reserve < 1024 {
		t.Fatalf("only %d MiB available: this test needs %d MiB above a reserve of at least 1 GiB", avail, roomFor*limitMiB)
	}
	d := startDaemon(t, "--memory-reserve", strconv.FormatInt(reserve, 10), "--max-wakes", "2")
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "heap", RootfsDir: app64Rootfs,
		Process:   api.Process{Args: app64Demo.Args, Env: append(append([]string{}, app64Demo.Env...), fmt.Sprintf("HEAP_MIB=%d", heapMiB))},
		Ports:     app64Demo.Ports,
		MemoryMiB: limitMiB}); err != nil {
		t.Fatal(err)
	}
	oomBefore := oomLines(t)

	// MemAvailable, sampled every 20 ms for the whole test.
	minAvail := memguard.WatchLow(20 * time.Millisecond)
	defer minAvail.Stop()

	// The flood.
	var mu sync.Mutex
	var accepted []api.Sandbox
	refused := 0
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := 0; i < total; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"template":"heap","name":"flood-%02d"}`, i)
			r := d.raw(t, "POST", "/v1/sandboxes", d.Token, "application/json", strings.NewReader(body))
			mu.Lock()
			defer mu.Unlock()
			switch r.Status {
			case http.StatusCreated:
				var sb api.Sandbox
				if err := json.Unmarshal([]byte(r.Body), &sb); err != nil {
					t.Errorf("create %d: %v", i, err)
					return
				}
				d.track(sb.ID)
				accepted = append(accepted, sb)
			case http.StatusServiceUnavailable:
				e := expectErrorReply(t, r, http.StatusServiceUnavailable, api.CodeUnavailable)
				if !strings.Contains(e.Message, "memory") || r.Header.Get("Retry-After") == "" {
					t.Errorf("create %d refused without saying it is memory, or without Retry-After: %q", i, e.Message)
				}
				refused++
			default:
				t.Errorf("create %d: HTTP %d %s", i, r.Status, r.Body)
			}
		}()
	}
	wg.Wait()
	if len(accepted) < roomFor-1 {
		t.Fatalf("only %d of %d creates accepted (%d refused): the node should fit about %d", len(accepted), total, refused, roomFor)
	}
	// If the kernel must kill, it takes a sandbox: every process of one
	// carries a high OOM score.
	d.checkOOMScores(t, accepted[0].ID, "after its start")
	// A second wave, once the first has filled its heaps: the node makes
	// room by pushing the sandboxes least in demand to disk. A 503 says
	// when to retry; the client does.
	for i := 0; i < parallel; i++ {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			body := fmt.Sprintf(`{"template":"heap","name":"wave2-%d"}`, i)
			r := d.raw(t, "POST", "/v1/sandboxes", d.Token, "application/json", strings.NewReader(body))
			if r.Status == http.StatusCreated {
				var sb api.Sandbox
				if err := json.Unmarshal([]byte(r.Body), &sb); err != nil {
					t.Fatal(err)
				}
				d.track(sb.ID)
				accepted = append(accepted, sb)
				break
			}
			if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || time.Now().After(deadline) {
				t.Fatalf("second wave create %d: HTTP %d %s", i, r.Status, r.Body)
			}
			refused++
			time.Sleep(time.Second) // as Retry-After says
		}
	}
	onDisk := 0
	for _, sb := range accepted {
		if got := d.get(t, sb.ID); got.Tier == api.TierSnapshot || got.Tier == api.TierDetached {
			onDisk++
		}
	}
	if onDisk == 0 {
		t.Errorf("%d sandboxes of %d MiB fit above the reserve and none was pushed to disk", len(accepted), limitMiB)
	}

	// Every accepted sandbox answers, with the heap it built; one pushed to
	// disk comes back with its memory (its counter goes on). A wake that
	// cannot be made room for in time is a 503 with Retry-After: retried.
	pushed := 0
	for round := 1; round <= 2; round++ {
		for _, sb := range accepted {
			got := d.get(t, sb.ID)
			if got.Tier == api.TierSnapshot {
				pushed++
			}
			deadline := time.Now().Add(3 * time.Minute)
			for {
				r, err := call("GET", endpoint(t, sb)+"/", nil, nil, gatewayTimeout)
				if err == nil && r.Status == 200 {
					n, perr := parseCount(r.Body)
					if perr != nil || n != round || !strings.Contains(r.Body, fmt.Sprintf("heap_bytes=%d", heapMiB<<20)) {
						t.Errorf("%s round %d: %q (tier was %s, note %q)", sb.Name, round, r.Body, got.Tier, got.Note)
					}
					break
				}
				if err == nil && r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "" && time.Now().Before(deadline) {
					time.Sleep(time.Second) // as Retry-After says
					continue
				}
				t.Fatalf("%s round %d: %v HTTP %d %q", sb.Name, round, err, r.Status, r.Body)
			}
		}
	}
	for _, sb := range accepted {
		if got := d.get(t, sb.ID); strings.Contains(got.Note, "killed") || strings.Contains(got.Note, "lost") {
			t.Errorf("%s: note %q", sb.Name, got.Note)
		}
	}
	if m := minAvail.Min(); m < reserve {
		t.Errorf("MemAvailable fell to %d MiB at %s (the daemon log's clock), below the reserve of %d MiB", m, minAvail.At().UTC().Format("15:04:05.000"), reserve)
	}
	if n := oomLines(t) - oomBefore; n != 0 {
		t.Errorf("%d OOM-killer lines in the kernel log during the flood", n)
	}
	t.Logf("%d accepted, %d refused (503), %d on disk after the second wave, %d seen on disk while called; MemAvailable %d MiB at start, %d MiB at the lowest, reserve %d MiB",
		len(accepted), refused, onDisk, pushed, avail, minAvail.Min(), reserve)
}

// TestDiskReserve: below its disk reserve the node takes no new sandbox and
// no snapshot it was asked for (503, saying it is the disk), and when its
// own idle timers would snapshot a sandbox it detaches it instead and says
// what was lost — it never starts an image the disk cannot hold.
func TestDiskReserve(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	a := d.create(t, "web", "a")
	expectCount(t, endpoint(t, a), 1, "first call")
	d.Stop(t)

	var st syscall.Statfs_t
	if err := syscall.Statfs(d.DataDir, &st); err != nil {
		t.Fatal(err)
	}
	reserve := int64(st.Bavail)*int64(st.Bsize)>>20 + 100000
	d.Start(t, "--disk-reserve", strconv.FormatInt(reserve, 10), "--freeze-after", "300ms", "--snapshot-after", "300ms")

	r := d.raw(t, "POST", "/v1/sandboxes", d.Token, "application/json", strings.NewReader(`{"template":"web","name":"b"}`))
	if e := expectErrorReply(t, r, http.StatusServiceUnavailable, api.CodeUnavailable); !strings.Contains(e.Message, "disk") || r.Header.Get("Retry-After") == "" {
		t.Errorf("create below the disk reserve: %q (Retry-After %q), want a 503 that says it is the disk", e.Message, r.Header.Get("Retry-After"))
	}
	// The idle timers freeze it, then detach it instead of snapshotting.
	got := d.waitTier(t, a.ID, api.TierDetached, 60*time.Second)
	if !strings.Contains(got.Note, "disk") || !strings.Contains(got.Note, "memory state was lost") {
		t.Errorf("detached for want of disk with note %q", got.Note)
	}
	if exists(d.snapshotDir(a.ID)) || exists(d.snapshotDir(a.ID)+".tmp") {
		t.Error("a snapshot image was written below the disk reserve")
	}
	// Its next request cold-starts it (its counter starts again), and an
	// explicit snapshot is refused with a reason while it keeps running.
	expectCount(t, endpoint(t, a), 1, "after the detach")
	d.Restart(t, "--disk-reserve", strconv.FormatInt(reserve, 10))
	_, err := d.C.Transition(ctxT(t), a.ID, "snapshot")
	if e := expectAPIError(t, err, http.StatusServiceUnavailable, api.CodeUnavailable); !strings.Contains(e.Body.Message, "disk") {
		t.Errorf("snapshot below the disk reserve: %q", e.Body.Message)
	}
	if got := d.get(t, a.ID); got.Tier != api.TierHot {
		t.Errorf("after the refused snapshot: tier %s, want hot", got.Tier)
	}
	expectCount(t, endpoint(t, a), 2, "still running after the refused snapshot")
}

// TestOOMKilledIsReported: a sandbox whose program outgrows its memory limit
// is killed by the kernel inside its own cgroup — nothing else on the node
// is touched — and the node reports it as such and cold-starts it on its
// next request: never left half-alive, never silent.
func TestOOMKilledIsReported(t *testing.T) {
	d := startDaemon(t)
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "greedy", RootfsDir: app64Rootfs,
		Process:   api.Process{Args: app64Demo.Args, Env: append(append([]string{}, app64Demo.Env...), "HEAP_MIB=400")},
		Ports:     app64Demo.Ports,
		MemoryMiB: 160}); err != nil {
		t.Fatal(err)
	}
	sb, err := d.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "greedy", Name: "greedy"})
	if err != nil {
		t.Fatal(err)
	}
	d.track(sb.ID)
	if sb.MemoryMiB != 160 {
		t.Errorf("memory_mib %d, want the template's 160", sb.MemoryMiB)
	}
	got := d.waitTier(t, sb.ID, api.TierDetached, time.Minute)
	if !strings.Contains(got.Note, "killed: out of memory") {
		t.Errorf("note %q, want it to say the kernel killed it for memory", got.Note)
	}
	// The sandstormd it ran under is alive and well.
	if _, err := d.C.Node(ctxT(t)); err != nil {
		t.Fatalf("the daemon after its sandbox was OOM-killed: %v", err)
	}
}
