package warm

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// TestID: a warm build's container ID is 12 characters like a sandbox's
// (its veth name, "ssv"+ID, must fit IFNAMSIZ), stable for a name,
// distinct across names, and never a sandbox's (those are 12 hex digits;
// "w" is not one).
func TestID(t *testing.T) {
	a, b := ID("web"), ID("app64")
	if len(a) != 12 || a[0] != 'w' || a != ID("web") || a == b {
		t.Errorf("ID: %q %q", a, b)
	}
	if len("ssv"+a) > 15 {
		t.Errorf("veth name %q is over 15 bytes", "ssv"+a)
	}
}

// fakeCore is a node that makes pooled sandboxes in memory.
type fakeCore struct {
	mu        sync.Mutex
	templates []store.Template
	ready     map[string]bool
	room      string // Room's answer
	failMake  bool
	made      int
	discarded []string
}

func (c *fakeCore) Templates() []store.Template { return c.templates }
func (c *fakeCore) Ready(name string) bool      { return c.ready[name] }
func (c *fakeCore) Room(store.Template) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.room
}
func (c *fakeCore) Make(t store.Template) (Pooled, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failMake {
		return Pooled{}, errors.New("restore failed")
	}
	c.made++
	return Pooled{ID: fmt.Sprintf("%s-%d", t.Name, c.made), Template: t.Name, LimitMiB: 512, Made: time.Now()}, nil
}
func (c *fakeCore) Discard(p Pooled) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.discarded = append(c.discarded, p.ID)
}

func warmTemplate(name string, pool int) store.Template {
	return store.Template{Name: name, Warm: &api.Warm{Pool: pool}}
}

// TestFillTopsUpWhileThereIsRoom: each warm template with a restorable
// image is filled to its pool size; a template without an image, or
// with no pool, is not; no room, or a failed restore, stops the fill
// without counting a sandbox.
func TestFillTopsUpWhileThereIsRoom(t *testing.T) {
	core := &fakeCore{
		templates: []store.Template{warmTemplate("web", 2), warmTemplate("cold", 3), {Name: "plain"}},
		ready:     map[string]bool{"web": true, "plain": true},
	}
	p := NewPool(core, slog.New(slog.DiscardHandler))
	p.Fill(nil)
	if got := p.Sizes(); len(got) != 1 || got["web"] != 2 {
		t.Fatalf("sizes after a fill: %v, want web:2", got)
	}
	p.Fill(nil)
	if core.made != 2 {
		t.Errorf("a full pool was filled again: %d made", core.made)
	}
	p.Drain("")
	core.room = "3 MiB of headroom, want 1024"
	p.Fill(nil)
	if p.Size() != 0 {
		t.Errorf("filled with no room: %v", p.Sizes())
	}
	core.room, core.failMake = "", true
	p.Fill(nil)
	if p.Size() != 0 {
		t.Errorf("a failed restore was pooled: %v", p.Sizes())
	}
}

// TestTake: a take hands out a pooled sandbox of the template with the
// memory limit asked for, each only once, and asks for a refill; a
// template or limit the pool has none of gets nothing.
func TestTake(t *testing.T) {
	p := NewPool(&fakeCore{}, slog.New(slog.DiscardHandler))
	p.pools["web"] = []Pooled{{ID: "a", Template: "web", LimitMiB: 512}, {ID: "b", Template: "web", LimitMiB: 1024}}
	if _, ok := p.Take("other", 512); ok {
		t.Fatal("took from another template's pool")
	}
	if _, ok := p.Take("web", 256); ok {
		t.Fatal("took a sandbox with another memory limit")
	}
	s, ok := p.Take("web", 1024)
	if !ok || s.ID != "b" {
		t.Fatalf("take of limit 1024 = %+v, %v; want b", s, ok)
	}
	select {
	case <-p.kick:
	case <-time.After(10 * RefillAfter):
		t.Error("a take did not ask for a refill")
	}
	if _, ok := p.Take("web", 1024); ok {
		t.Error("the same pooled sandbox was handed out twice")
	}
	if p.Size() != 1 {
		t.Errorf("pool holds %d, want 1", p.Size())
	}
}

// TestDropOldestThenDrain: memory pressure gives up the oldest pooled
// sandbox first, across templates; a drain of one template discards its
// pool only, and a drain of all the rest.
func TestDropOldestThenDrain(t *testing.T) {
	core := &fakeCore{}
	p := NewPool(core, slog.New(slog.DiscardHandler))
	now := time.Now()
	p.pools["web"] = []Pooled{{ID: "w1", Template: "web", Made: now.Add(-time.Minute)}, {ID: "w2", Template: "web", Made: now}}
	p.pools["api"] = []Pooled{{ID: "a1", Template: "api", Made: now.Add(-time.Hour)}}
	if !p.DropOldest("test") || !slices.Equal(core.discarded, []string{"a1"}) {
		t.Fatalf("dropped %v, want the oldest, a1", core.discarded)
	}
	if n := p.Drain("web"); n != 2 || p.Size() != 0 {
		t.Errorf("drain of web took %d, left %v", n, p.Sizes())
	}
	if p.DropOldest("test") {
		t.Error("dropped from an empty pool")
	}
	if !slices.Equal(core.discarded, []string{"a1", "w1", "w2"}) && !slices.Equal(core.discarded, []string{"a1", "w2", "w1"}) {
		t.Errorf("discarded %v", core.discarded)
	}
}

// TestLoopStops: the loop fills on a kick and ends when stop closes.
func TestLoopStops(t *testing.T) {
	core := &fakeCore{templates: []store.Template{warmTemplate("web", 1)}, ready: map[string]bool{"web": true}}
	p := NewPool(core, slog.New(slog.DiscardHandler))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { p.Loop(stop); close(done) }()
	p.Kick()
	testenv.WaitFor(t, 10*time.Second, "a kick to fill the pool", func() bool { return p.Len("web") == 1 })
	close(stop)
	<-done
}

// drainingCore drains the pool while a sandbox is being made, as a
// template's removal does when it lands during a restore.
type drainingCore struct {
	*fakeCore
	pool  *Pool
	drain string
}

func (c *drainingCore) Make(t store.Template) (Pooled, error) {
	s, err := c.fakeCore.Make(t)
	if c.drain != "-" {
		c.pool.Drain(c.drain)
		c.drain = "-" // once
	}
	return s, err
}

// listedCore drains the pool right after listing the templates, as a
// template's removal does when it lands between a refill's listing and
// its first restore.
type listedCore struct {
	*fakeCore
	pool *Pool
}

func (c *listedCore) Templates() []store.Template {
	ts := c.fakeCore.Templates()
	c.pool.Drain("web")
	return ts
}

// TestDrainedAfterListingIsDiscarded: a restore begun after its
// template's pool was drained, but within the refill pass that listed
// the template before the drain, is discarded too.
func TestDrainedAfterListingIsDiscarded(t *testing.T) {
	core := &listedCore{fakeCore: &fakeCore{templates: []store.Template{warmTemplate("web", 2)}, ready: map[string]bool{"web": true}}}
	p := NewPool(core, slog.New(slog.DiscardHandler))
	core.pool = p
	p.Fill(nil)
	if got := p.Len("web"); got != 0 || !slices.Equal(core.discarded, []string{"web-1"}) {
		t.Errorf("web's pool holds %d, discarded %v; want 0 and [web-1]", got, core.discarded)
	}
}

// TestMadeWhileDrainedIsDiscarded: a sandbox whose restore was under way
// when its template's pool was drained (the template removed, or
// registered again) is discarded, not pooled for a template that is gone;
// a drain of all pools counts for every template, and a drain of another
// template's pool changes nothing.
func TestMadeWhileDrainedIsDiscarded(t *testing.T) {
	for _, c := range []struct {
		drain string
		want  int
	}{{"web", 0}, {"", 0}, {"other", 2}} {
		core := &drainingCore{fakeCore: &fakeCore{templates: []store.Template{warmTemplate("web", 2)}, ready: map[string]bool{"web": true}}, drain: c.drain}
		p := NewPool(core, slog.New(slog.DiscardHandler))
		core.pool = p
		p.Fill(nil)
		if got := p.Len("web"); got != c.want {
			t.Errorf("drain %q during a make: web's pool holds %d, want %d", c.drain, got, c.want)
		}
		if c.want == 0 && !slices.Equal(core.discarded, []string{"web-1"}) {
			t.Errorf("drain %q during a make: discarded %v, want [web-1]", c.drain, core.discarded)
		}
	}
}
