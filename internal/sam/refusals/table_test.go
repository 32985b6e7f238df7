package refusals

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// clock is a table's time, moved by the test.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func table(size int) (*Table, *clock) {
	c := &clock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)}
	t := NewTable(size)
	t.now = c.now
	return t, c
}

func name(principal, target string) Refusal {
	return Refusal{Principal: principal, By: api.RefusedByBoundary, What: api.RefusedName, Target: target, Reason: "destination not granted"}
}

// TestTableAggregates: one row per (principal, by, what, target, reason,
// from), counted, with the first and last time; Take empties the table
// and lists newest first.
func TestTableAggregates(t *testing.T) {
	tb, c := table(10)
	first := c.t
	for i := 0; i < 3; i++ {
		tb.Add(name("agent-a", "example.com"))
		c.t = c.t.Add(time.Second)
	}
	tb.Add(name("agent-b", "example.com"))
	tb.Add(Refusal{Principal: "agent-a", By: api.RefusedBySAMNode, What: api.RefusedModel, Target: "gpt-big", Reason: "not granted", From: "node-a"})
	rep := tb.Take()
	if len(rep.Rows) != 3 || rep.Dropped != 0 {
		t.Fatalf("report %+v", rep)
	}
	a := rep.Rows[2] // the oldest last
	if a.Principal != "agent-a" || a.Target != "example.com" || a.Count != 3 || !a.First.Equal(first) || !a.Last.Equal(first.Add(2*time.Second)) {
		t.Errorf("agent-a's row %+v", a)
	}
	if rep.Rows[0].Principal != "agent-a" || rep.Rows[0].What != api.RefusedModel || rep.Rows[1].Principal != "agent-b" {
		t.Errorf("order: %+v", rep.Rows)
	}
	if err := Check(rep); err != nil {
		t.Errorf("a table's own report fails Check: %v", err)
	}
	if again := tb.Take(); !Empty(again) {
		t.Errorf("after Take: %+v", again)
	}
}

// TestTableFlood: a flood of distinct refusals (an agent spamming random
// names) costs the table its size, no more; every refusal is counted,
// itemised or dropped, and a known row still counts when the table is
// full.
func TestTableFlood(t *testing.T) {
	const size, n = 100, 200_000
	tb, _ := table(size)
	for i := 0; i < n; i++ {
		tb.Add(name("attacker", fmt.Sprintf("x%d.example.com", i)))
	}
	tb.Add(name("attacker", "x0.example.com"))
	if tb.Len() != size {
		t.Fatalf("%d rows, want %d", tb.Len(), size)
	}
	rep := tb.Take()
	var itemised uint64
	for _, r := range rep.Rows {
		itemised += r.Count
	}
	if itemised+rep.Dropped != n+1 || rep.Dropped != n-size {
		t.Errorf("itemised %d + dropped %d, want %d with %d dropped", itemised, rep.Dropped, n+1, n-size)
	}
}

// TestTableConcurrent: adds from many goroutines (the boundaries of a
// node share one table) lose none.
func TestTableConcurrent(t *testing.T) {
	tb, _ := table(MaxRows)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				tb.Add(name(fmt.Sprintf("agent-%d", g), fmt.Sprintf("n%d", i%10)))
			}
		}()
	}
	wg.Wait()
	rep := tb.Take()
	var total uint64
	for _, r := range rep.Rows {
		total += r.Count
	}
	if len(rep.Rows) != 80 || total != 40000 {
		t.Errorf("%d rows, %d refusals; want 80, 40000", len(rep.Rows), total)
	}
}

// TestAddCostsNoAllocation: counting a refusal already in the table
// allocates nothing — it is on a boundary's refusal path.
func TestAddCostsNoAllocation(t *testing.T) {
	tb, _ := table(10)
	r := name("agent-a", "example.com")
	tb.Add(r)
	if n := testing.AllocsPerRun(1000, func() { tb.Add(r) }); n != 0 {
		t.Errorf("Add of a known row: %v allocations", n)
	}
}

// TestMerge: a report merged into a table sums counts, widens the
// times, and counts what finds no room as dropped; counts saturate.
func TestMerge(t *testing.T) {
	tb, c := table(2)
	tb.Add(name("agent-a", "example.com"))
	t0 := c.t
	rep := api.RefusalReport{Dropped: 7, Rows: []api.RefusalRow{
		{Principal: "agent-a", By: api.RefusedByBoundary, What: api.RefusedName, Target: "example.com", Reason: "destination not granted", Count: 4, First: t0.Add(-time.Minute), Last: t0.Add(time.Minute)},
		{Principal: "agent-b", By: api.RefusedByBoundary, What: api.RefusedDNS, Target: "a.example", Reason: "destination not granted", Count: 2, First: t0, Last: t0},
		{Principal: "agent-c", By: api.RefusedByBoundary, What: api.RefusedDNS, Target: "b.example", Reason: "destination not granted", Count: 5, First: t0, Last: t0},
	}}
	tb.Merge(rep)
	got := tb.Take()
	if len(got.Rows) != 2 || got.Dropped != 12 {
		t.Fatalf("merged: %+v", got)
	}
	a := got.Rows[0]
	if a.Count != 5 || !a.First.Equal(t0.Add(-time.Minute)) || !a.Last.Equal(t0.Add(time.Minute)) {
		t.Errorf("agent-a after merge: %+v", a)
	}
	tb.Merge(api.RefusalReport{Dropped: ^uint64(0) - 1})
	tb.Merge(api.RefusalReport{Dropped: 5})
	if d := tb.Take().Dropped; d != ^uint64(0) {
		t.Errorf("dropped wrapped: %d", d)
	}
}

// TestClean: text is cut on a rune boundary and made printable.
func TestClean(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"example.com", "example.com"},
		{"a\nb\x00c\x7f", "a?b?c?"},
		{"\xff\xfe", "??"},
		{"héllo", "héllo"},
		{strings.Repeat("é", 200), strings.Repeat("é", MaxTarget/2)},
		{strings.Repeat("x", 300), strings.Repeat("x", MaxTarget)},
	} {
		if got := clean(c.in, MaxTarget); got != c.want {
			t.Errorf("clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestCheck: what a receiver refuses, whole.
func TestCheck(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	good := func() api.RefusalRow {
		return api.RefusalRow{Principal: "agent-a", By: api.RefusedBySAMNode, What: api.RefusedTool, Target: "everything__add", Reason: "not granted", From: "node-a", Count: 1, First: t0, Last: t0}
	}
	if err := Check(api.RefusalReport{Rows: []api.RefusalRow{good()}}); err != nil {
		t.Fatalf("a good report: %v", err)
	}
	for what, mod := range map[string]func(*api.RefusalRow){
		"no principal":               func(r *api.RefusalRow) { r.Principal = "" },
		"a principal with a space":   func(r *api.RefusalRow) { r.Principal = "agent a" },
		"a long principal":           func(r *api.RefusalRow) { r.Principal = strings.Repeat("p", MaxPrincipal+1) },
		"an unknown decider":         func(r *api.RefusalRow) { r.By = "router" },
		"a kind not sam-node's":      func(r *api.RefusalRow) { r.What = api.RefusedDNS },
		"an unknown kind":            func(r *api.RefusalRow) { r.What = "secrets" },
		"no target":                  func(r *api.RefusalRow) { r.Target = "" },
		"a long target":              func(r *api.RefusalRow) { r.Target = strings.Repeat("t", MaxTarget+1) },
		"a control character":        func(r *api.RefusalRow) { r.Target = "a\x1b[2Jb" },
		"invalid UTF-8":              func(r *api.RefusalRow) { r.Reason = "\xff" },
		"no reason":                  func(r *api.RefusalRow) { r.Reason = "" },
		"a member name with a space": func(r *api.RefusalRow) { r.From = "node a" },
		"a long member name":         func(r *api.RefusalRow) { r.From = strings.Repeat("n", MaxMember+1) },
		"from on a boundary's row":   func(r *api.RefusalRow) { r.By, r.What = api.RefusedByBoundary, api.RefusedName },
		"count 0":                    func(r *api.RefusalRow) { r.Count = 0 },
		"no first":                   func(r *api.RefusalRow) { r.First = time.Time{} },
		"last before first":          func(r *api.RefusalRow) { r.Last = t0.Add(-time.Second) },
	} {
		r := good()
		mod(&r)
		if err := Check(api.RefusalReport{Rows: []api.RefusalRow{good(), r}}); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%s: %v, want bad input", what, err)
		}
	}
	many := make([]api.RefusalRow, MaxRows+1)
	for i := range many {
		many[i] = good()
	}
	if err := Check(api.RefusalReport{Rows: many}); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("%d rows: %v", len(many), err)
	}
}

// FuzzTableReportPassesCheck: whatever text a refusal carries (a SOCKS5
// client names its destination in raw bytes), the report the table
// makes of it passes every receiver's Check.
func FuzzTableReportPassesCheck(f *testing.F) {
	f.Add("agent-a", "example.com", "destination not granted", "")
	f.Add("agent-\xff", "\x00\n"+strings.Repeat("é", 300), strings.Repeat("\x7f", 400), "node a\n")
	f.Fuzz(func(t *testing.T, principal, target, reason, from string) {
		if principal == "" || target == "" || reason == "" {
			t.Skip() // a principal is never empty; the deciders always name a target and a reason
		}
		tb := NewTable(4)
		tb.Add(Refusal{Principal: principal, By: api.RefusedBySAMNode, What: api.RefusedTool, Target: target, Reason: reason, From: from})
		rep := tb.Take()
		if err := Check(rep); err != nil {
			t.Fatalf("Add(%q, %q, %q, %q) made a report Check refuses: %v", principal, target, reason, from, err)
		}
	})
}

// BenchmarkAdd is what a boundary's refusal path pays to itemise a
// refusal: a known row (an agent repeating itself) and a full table (an
// agent spamming new names).
func BenchmarkAdd(b *testing.B) {
	b.Run("known", func(b *testing.B) {
		tb := NewTable(MaxRows)
		r := name("agent-a", "example.com")
		for b.Loop() {
			tb.Add(r)
		}
	})
	b.Run("full", func(b *testing.B) {
		tb := NewTable(MaxRows)
		for i := 0; i < MaxRows; i++ {
			tb.Add(name("agent-a", fmt.Sprintf("n%d.example", i)))
		}
		r := name("agent-a", "new.example")
		for b.Loop() {
			tb.Add(r)
		}
	})
}
