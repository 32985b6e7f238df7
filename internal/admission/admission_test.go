package admission

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
)

// fakeMem is a machine's memory: what is available, and what each
// sandbox's cgroup holds.
type fakeMem struct {
	mu    sync.Mutex
	avail int64
	held  map[string]int64
}

func (f *fakeMem) available() (int64, error) { f.mu.Lock(); defer f.mu.Unlock(); return f.avail, nil }
func (f *fakeMem) heldOf(id string) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.held[id]
	return h, ok
}
func (f *fakeMem) set(id string, mib int64) { f.mu.Lock(); f.held[id] = mib; f.mu.Unlock() }

func newMem(avail int64) (*fakeMem, *Admission) {
	m := &fakeMem{avail: avail, held: map[string]int64{}}
	return m, New(Config{MemReserveMiB: 1000, MemAvailable: m.available, Held: m.heldOf})
}

// TestMemoryCountsPromises: what admitted sandboxes have yet to take
// counts as used, so admissions one after another (or at once) cannot
// together promise more than there is; a refusal is no room, with the
// numbers; a release gives the room back.
func TestMemoryCountsPromises(t *testing.T) {
	_, a := newMem(4000) // 3000 over the reserve
	if err := a.Memory("a", 1024); err != nil {
		t.Fatal(err)
	}
	if err := a.Memory("b", 1024); err != nil {
		t.Fatal(err)
	}
	err := a.Memory("c", 1024)
	if !errors.Is(err, ErrNoMemory) || !errors.Is(err, errdefs.ErrNoRoom) || !strings.Contains(err.Error(), "2048 MiB of it promised") {
		t.Fatalf("a third 1 GiB with 3000 MiB over the reserve: %v", err)
	}
	if a.Promised() != 2048 || !a.Starting()["a"] || a.Starting()["c"] {
		t.Errorf("promised %d, starting %v", a.Promised(), a.Starting())
	}
	a.Release("a")
	if err := a.Memory("c", 1024); err != nil {
		t.Errorf("after a release: %v", err)
	}

	_, b := newMem(4000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.Memory(string(rune('a'+i)), 1024) == nil {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != 2 {
		t.Errorf("8 at once: %d admitted, want 2 (3000 MiB over the reserve)", admitted)
	}
}

// TestKeepsRoomForACheckpoint: what Keep asks for stays free above the
// reserve, for the checkpoint that makes room next; the refusal says so.
func TestKeepsRoomForACheckpoint(t *testing.T) {
	m := &fakeMem{avail: 2000, held: map[string]int64{}}
	keep := int64(150)
	a := New(Config{MemReserveMiB: 1000, MemAvailable: m.available, Held: m.heldOf, Keep: func() int64 { return keep }})
	if h, _ := a.Headroom(); h != 850 {
		t.Errorf("headroom %d, want 1000 over the reserve less 150 kept", h)
	}
	err := a.Memory("a", 900)
	if !errors.Is(err, ErrNoMemory) || !strings.Contains(err.Error(), "150 MiB above it kept for a checkpoint") {
		t.Fatalf("900 MiB with 1000 over the reserve, 150 of it kept: %v", err)
	}
	if err := a.Memory("a", 850); err != nil {
		t.Errorf("850 MiB: %v", err)
	}
	keep = -5 // nonsense counts as none
	if h, _ := a.Headroom(); h != 150 {
		t.Errorf("headroom %d after 850 promised and nothing kept, want 150", h)
	}
}

// TestSettle: a promise ends when its sandbox took what it was promised,
// or stopped growing after its first seconds, or its window passed; what
// a template's sandboxes settle at is what its next ones are admitted at.
func TestSettle(t *testing.T) {
	m, a := newMem(100000)
	now := time.Now()
	a.Start("full", "web", 100)
	a.Start("flat", "app", 1024)
	a.Start("young", "app", 1024)
	a.Start("silent", "app", 1024)
	m.set("full", 120)
	m.set("flat", 60)
	m.set("young", 60)
	a.Settle(now) // records where flat and young are
	a.mu.Lock()
	p := a.promises["young"]
	p.since = now // just started
	a.promises["young"] = p
	for _, id := range []string{"flat", "silent"} {
		p := a.promises[id]
		p.since = now.Add(-10 * time.Second)
		a.promises[id] = p
	}
	p = a.promises["silent"]
	p.since = now.Add(-SettleWindow)
	a.promises["silent"] = p
	a.mu.Unlock()
	a.Settle(now)
	st := a.Starting()
	if st["full"] || st["flat"] || st["silent"] || !st["young"] {
		t.Errorf("after settling: still starting %v, want only young", st)
	}
	if p := a.promises["young"]; p.expectedMiB >= 1024 || p.expectedMiB < 60 {
		t.Errorf("app settled at 60 MiB; the start of it still outstanding counts %d MiB", p.expectedMiB)
	}
	if e := a.Expected("web", 1024); e >= 1024 || e < 120 {
		t.Errorf("web settled at 120 MiB; its next is admitted at %d", e)
	}
	if e := a.Expected("other", 512); e != 512 {
		t.Errorf("a template with nothing settled is admitted at its limit: %d", e)
	}
}

// TestBurstOfStarts is issue 19's fill: starts of one template, many
// at once before any has settled, each count at their limit until the
// first settles; from then every one still outstanding counts at a
// margin over the settled size, so the burst that follows is admitted.
// A wake keeps its own size and teaches nothing. What was learned is
// handed to Learned, and a new Admission given it (Settled) prices its
// first start at the margin.
func TestBurstOfStarts(t *testing.T) {
	m := &fakeMem{avail: 23000, held: map[string]int64{}}
	kept := map[string]int64{}
	a := New(Config{MemReserveMiB: 1000, MemAvailable: m.available, Held: m.heldOf,
		Learned: func(k string, v int64) { kept[k] = v }})
	start := time.Now()
	n := 0
	for ; a.Start(fmt.Sprint("s", n), "web@d1", 1024) == nil; n++ {
	}
	if n != 21 { // 22000 MiB over the reserve, 1024 each
		t.Fatalf("before anything settled: %d starts admitted, want 21", n)
	}
	if err := a.Memory("woken", 600); !errors.Is(err, ErrNoMemory) {
		t.Fatalf("a wake with the node promised to the brim: %v", err)
	}
	for i := 0; i < n; i++ {
		m.set(fmt.Sprint("s", i), 20)
	}
	a.Settle(start) // first look: they hold 20 MiB, not yet 3 s old
	if a.Promised() != int64(n)*1004 {
		t.Fatalf("nothing settled yet: promised %d", a.Promised())
	}
	// s0 is 5 s old and flat: settled at 20 MiB. The others still
	// count, but at 25 MiB (20 + 25 %), 5 of which they have yet to take.
	a.mu.Lock()
	p := a.promises["s0"]
	p.since = start.Add(-5 * time.Second)
	a.promises["s0"] = p
	a.mu.Unlock()
	a.Settle(start)
	if got, want := a.Promised(), int64(n-1)*5; got != want {
		t.Errorf("after the first settled: promised %d MiB, want %d", got, want)
	}
	if kept["web@d1"] != 20 {
		t.Errorf("learned %v", kept)
	}
	more := 0
	for ; more < 200 && a.Start(fmt.Sprint("t", more), "web@d1", 1024) == nil; more++ {
	}
	if more != 200 {
		t.Errorf("after the template settled: %d more starts admitted, want 200", more)
	}
	if err := a.Memory("woken", 300); err != nil {
		t.Errorf("a wake with room: %v", err)
	}
	if a.promises["woken"].expectedMiB != 300 {
		t.Errorf("a wake was repriced: %+v", a.promises["woken"])
	}
	if e := a.Expected("web@d2", 1024); e != 1024 {
		t.Errorf("another build of the template learned nothing yet: %d", e)
	}

	b := New(Config{MemReserveMiB: 1000, MemAvailable: m.available, Held: m.heldOf, Settled: kept})
	if err := b.Start("u", "web@d1", 1024); err != nil || b.Promised() != 25 {
		t.Errorf("a restarted node's first start: %v, promised %d", err, b.Promised())
	}
}

// TestDiskAndFDs: below the disk reserve (or below it once the image is
// written) is no room; so is a start that would leave fewer than
// FDHeadroom descriptors; a reserve of 0 and a limit the process cannot
// read refuse nothing.
func TestDiskAndFDs(t *testing.T) {
	free := int64(5000)
	a := New(Config{DiskReserveMiB: 1000, DiskFree: func() (int64, error) { return free, nil }, DataDir: "/var/lib/x",
		FDs: func() (int, uint64, error) { return 700, 1000, nil }})
	if err := a.Disk("a snapshot", 3000); err != nil {
		t.Error(err)
	}
	if err := a.Disk("a snapshot", 4500); !errors.Is(err, ErrNoDisk) || !strings.Contains(err.Error(), "/var/lib/x") {
		t.Errorf("an image that would cross the reserve: %v", err)
	}
	if err := a.FDs(); err != nil {
		t.Errorf("700 of 1000 open: %v", err)
	}
	b := New(Config{FDs: func() (int, uint64, error) { return 800, 1000, nil }})
	if err := b.FDs(); !errors.Is(err, ErrNoFDs) || !errors.Is(err, errdefs.ErrNoRoom) {
		t.Errorf("800 of 1000 open: %v", err)
	}
	c := New(Config{FDs: func() (int, uint64, error) { return 0, 0, errors.New("no /proc") }})
	if c.FDs() != nil || c.Disk("x", 1<<40) != nil || c.Memory("x", 1<<40) != nil {
		t.Error("checks that are off, or cannot read, refused")
	}
}

// TestNothingKeptWithoutAReserve: with no reserve admission is off, and
// nothing is taken off the headroom for a checkpoint either.
func TestNothingKeptWithoutAReserve(t *testing.T) {
	m := &fakeMem{avail: 2000, held: map[string]int64{}}
	a := New(Config{MemAvailable: m.available, Held: m.heldOf, Keep: func() int64 { return 150 }})
	if k := a.Kept(); k != 0 {
		t.Errorf("kept %d MiB without a reserve", k)
	}
	if h, _ := a.Headroom(); h != 2000 {
		t.Errorf("headroom %d without a reserve, want all 2000 available", h)
	}
}
