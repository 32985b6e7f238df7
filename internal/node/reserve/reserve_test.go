package reserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/tier"
)

// fakeCore is a node of sandboxes in memory: what the guard pushes,
// detaches and settles is recorded.
type fakeCore struct {
	mu       sync.Mutex
	views    []tier.View
	conns    map[string]int
	usage    map[string]sandbox.MemStat
	noCkpt   bool
	pooled   int
	pushed   []string
	detached []string
	gone     map[string]bool // id → oom
}

func (c *fakeCore) Views() []tier.View {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.views)
}
func (c *fakeCore) Connections(id string) int { return c.conns[id] }
func (c *fakeCore) Usage(id string) (int64, sandbox.MemStat, bool) {
	ms, ok := c.usage[id]
	return ms.UsageBytes >> 20, ms, ok
}
func (c *fakeCore) CanCheckpoint() bool { return !c.noCkpt }
func (c *fakeCore) Push(_ context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pushed = append(c.pushed, id)
	c.setTier(id, api.TierSnapshot)
	return nil
}
func (c *fakeCore) Detach(_ context.Context, id, _ string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.detached = append(c.detached, id)
	c.setTier(id, api.TierDetached)
	return nil
}
func (c *fakeCore) DropPooled(string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pooled == 0 {
		return false
	}
	c.pooled--
	return true
}
func (c *fakeCore) Gone(id string, oom bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone == nil {
		c.gone = map[string]bool{}
	}
	c.gone[id] = oom
}

// setTier: caller holds mu.
func (c *fakeCore) setTier(id string, t api.Tier) {
	for i := range c.views {
		if c.views[i].ID == id {
			c.views[i].Tier = t
		}
	}
}

func testGuard(core *fakeCore, avail *int64, starting map[string]bool) *Guard {
	return New(Config{
		MemReserveMiB: 1000,
		MemAvailable:  func() (int64, error) { return *avail, nil },
		Admission:     time.Second,
		Starting:      func() map[string]bool { return starting },
		Settle:        func(time.Time) {},
		Log:           slog.New(slog.DiscardHandler),
	}, core)
}

func view(id string, t api.Tier, idleFor time.Duration) tier.View {
	return tier.View{ID: id, Tier: t, LastActive: time.Now().Add(-idleFor)}
}

// TestAdmitPushesUntilItFits: a start short of memory first costs the
// pool, then the sandboxes least in demand one at a time — never one
// still starting, one just used, or one with a connection open — until
// it fits; with nothing left to push it is refused as no memory.
func TestAdmitPushesUntilItFits(t *testing.T) {
	core := &fakeCore{
		views: []tier.View{
			view("old", api.TierHot, time.Hour), view("older", api.TierFrozen, 2*time.Hour),
			view("busy", api.TierHot, 3*time.Hour), view("fresh", api.TierHot, 0), view("starting", api.TierHot, 4*time.Hour),
		},
		conns:  map[string]int{"busy": 1},
		pooled: 1,
	}
	avail := int64(500)
	g := testGuard(core, &avail, map[string]bool{"starting": true})
	asks := 0
	ask := func() error {
		if asks++; asks < 8 { // each round asks twice: before and after taking the push slot
			return fmt.Errorf("%w: short", admission.ErrNoMemory)
		}
		return nil
	}
	if err := g.Admit(context.Background(), "new", ask); err != nil {
		t.Fatalf("admit: %v", err)
	}
	if core.pooled != 0 {
		t.Error("the pooled sandbox was not given up first")
	}
	if want := []string{"older", "old"}; !slices.Equal(core.pushed, want) {
		t.Errorf("pushed %v, want %v (least in demand first, none starting, busy or fresh)", core.pushed, want)
	}
	err := g.Admit(context.Background(), "new2", func() error { return fmt.Errorf("%w: short", admission.ErrNoMemory) })
	if !errors.Is(err, admission.ErrNoMemory) {
		t.Errorf("nothing left to push: %v, want no memory", err)
	}
}

// TestPushDetachesWhenTooShortToCheckpoint: a checkpoint needs memory of
// its own; with less than that available, the sandbox is detached
// knowingly instead.
func TestPushDetachesWhenTooShortToCheckpoint(t *testing.T) {
	core := &fakeCore{
		views: []tier.View{view("big", api.TierHot, time.Hour)},
		usage: map[string]sandbox.MemStat{"big": {UsageBytes: 4096 << 20}},
	}
	avail := int64(100) // < CheckpointRoomMiB(4096) = 2048
	g := testGuard(core, &avail, nil)
	g.pushSlot <- struct{}{}
	if !g.pushDown(context.Background(), "", "test") || !slices.Equal(core.detached, []string{"big"}) || len(core.pushed) != 0 {
		t.Errorf("pushed %v, detached %v; want big detached", core.pushed, core.detached)
	}
}

// TestFindKilled: a hot sandbox whose process is gone is settled (saying
// whether the OOM killer took it); the largest frozen one sets the room
// admission keeps for a checkpoint.
func TestFindKilled(t *testing.T) {
	core := &fakeCore{
		views: []tier.View{view("ok", api.TierHot, 0), view("oom", api.TierHot, 0), view("exited", api.TierHot, 0), view("cold", api.TierFrozen, 0)},
		usage: map[string]sandbox.MemStat{
			"ok": {UsageBytes: 100 << 20}, "oom": {Gone: true, OOMKilled: true}, "exited": {Gone: true},
			"cold": {UsageBytes: 3000 << 20},
		},
	}
	avail := int64(10000)
	g := testGuard(core, &avail, nil)
	g.findKilled()
	if len(core.gone) != 2 || !core.gone["oom"] || core.gone["exited"] {
		t.Errorf("settled %v, want oom (killed) and exited (not)", core.gone)
	}
	if got := g.KeepMiB(); got != CheckpointRoomMiB(3000) {
		t.Errorf("KeepMiB %d, want room for the largest frozen sandbox's checkpoint (%d)", got, CheckpointRoomMiB(3000))
	}
}

// TestDiskStep: under the disk reserve, snapshot sandboxes are detached,
// least recently active first, until the disk is above it again.
func TestDiskStep(t *testing.T) {
	core := &fakeCore{views: []tier.View{
		view("recent", api.TierSnapshot, time.Minute), view("stale", api.TierSnapshot, time.Hour),
		view("hot", api.TierHot, 2*time.Hour),
	}}
	free := int64(10)
	g := New(Config{DiskReserveMiB: 100, Log: slog.New(slog.DiscardHandler), DiskFree: func() (int64, error) {
		core.mu.Lock()
		defer core.mu.Unlock()
		return free + 100*int64(len(core.detached)), nil
	}}, core)
	g.DiskStep()
	if !slices.Equal(core.detached, []string{"stale"}) {
		t.Errorf("detached %v, want only the least recently active snapshot", core.detached)
	}
}

// TestSettledOutlivesItsGuard: what is learned is written (0600) and read
// back by the next node; an unreadable file starts empty.
func TestSettledOutlivesItsGuard(t *testing.T) {
	path := filepath.Join(t.TempDir(), "settled-sizes.json")
	log := slog.New(slog.DiscardHandler)
	LoadSettled(path, log).Learned("web@sha256:1", 24)
	if got := LoadSettled(path, log).Sizes(); got["web@sha256:1"] != 24 {
		t.Errorf("read back %v", got)
	}
}
