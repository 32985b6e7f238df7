package main

import (
	"math"
	"strings"
	"testing"
)

// one is a series measured in one round.
func one(s ...float64) measured { return measured{samples: s} }

func TestRatioRows(t *testing.T) {
	m := map[string]measured{
		// Nearest rank: p50 of 4 samples is the 2nd smallest, p99 the max.
		"start/web/client":     one(120, 100, 110, 300),
		"raw-start/web/client": one(100, 90, 95, 200),
		// Snapshot wake within its goal; frozen has no raw side.
		"wake-snapshot/web/client": one(104),
		"raw-restore/web/client":   one(100),
		"wake-frozen/web/client":   one(10),
		// A raw series with no samples yields no row.
		"start/app64/client":     one(300),
		"raw-start/app64/client": one(),
		"mem-hot/web/sandstormd": one(25, 26, 24),
		"mem-hot/web/raw":        one(24, 25, 24),
	}
	rows := ratioRows(m, []string{"web", "app64"})
	if len(rows) != 3 {
		t.Fatalf("rows = %+v", rows)
	}
	start := rows[0]
	if start.Series != "start/web/client" || start.Baseline != "raw-start/web/client" ||
		start.P50 != 110 || start.BaselineP50 != 95 || start.P99 != 300 || start.BaselineP99 != 200 {
		t.Errorf("start row = %+v", start)
	}
	if math.Abs(start.RatioP50-110.0/95) > 1e-12 || math.Abs(start.RatioP99-1.5) > 1e-12 {
		t.Errorf("start ratios %v, %v", start.RatioP50, start.RatioP99)
	}
	if start.MeetsP50 == nil || *start.MeetsP50 || start.MeetsP99 == nil || *start.MeetsP99 || len(start.Rounds) != 0 {
		t.Errorf("start: 1.16 and 1.5 > 1.05 should not meet the goal, in one round: %+v", start)
	}
	snap := rows[1]
	if snap.What != comparisons[1].what || snap.MeetsP50 == nil || !*snap.MeetsP50 || snap.Goal.String() != "≤ 1.05" {
		t.Errorf("snapshot row = %+v", snap)
	}
	mem := rows[2]
	if !strings.HasSuffix(mem.What, "MiB") || mem.P50 != 25 || mem.BaselineP50 != 24 || mem.MeetsP50 != nil || mem.Goal != nil {
		t.Errorf("memory row = %+v", mem)
	}

	tb := ratioTable(rows)
	if len(tb.Rows) != 3 || len(tb.Rows[0]) != len(tb.Columns) {
		t.Fatalf("table %+v", tb)
	}
	if got := tb.Rows[0]; got[2] != "110 / 95.0" || got[3] != "1.16" || got[7] != "≤ 1.05" || got[8] != "not met" || got[9] != "not met" || got[6] != "4/4" {
		t.Errorf("start cells %q", got)
	}
	if got := tb.Rows[2]; got[2] != "25.0 / 24.0" || got[7] != "—" || got[8] != "—" {
		t.Errorf("memory cells %q", got)
	}
}

// TestRatioRowsRounds: a comparison measured in rounds has its ratio in
// each round beside the whole run's; one whose rounds fall on both sides
// of its goal straddles it, and says so. A goal in milliseconds over the
// baseline (the frozen wake's) is checked as a difference.
func TestRatioRowsRounds(t *testing.T) {
	m := map[string]measured{
		// Round 1: 100 / 100; round 2: 110 / 100. Whole run p50 100/100.
		"start/web/client":     {samples: []float64{100, 100, 100, 110, 110, 110}, ends: []int{3, 6}},
		"raw-start/web/client": {samples: []float64{100, 100, 100, 100, 100, 100}, ends: []int{3, 6}},
		// Frozen: +1 ms, then +3 ms.
		"wake-frozen/web/client": {samples: []float64{11, 11, 13, 13}, ends: []int{2, 4}},
		"raw-resume/web/client":  {samples: []float64{10, 10, 10, 10}, ends: []int{2, 4}},
	}
	rows := ratioRows(m, []string{"web"})
	if len(rows) != 2 {
		t.Fatalf("rows = %+v", rows)
	}
	st := rows[0]
	if len(st.Rounds) != 2 || st.Rounds[0].RatioP50 != 1 || math.Abs(st.Rounds[1].RatioP50-1.1) > 1e-12 ||
		!*st.Rounds[0].MeetsP50 || *st.Rounds[1].MeetsP50 || !*st.MeetsP50 {
		t.Errorf("start rounds %+v", st)
	}
	fr := rows[1]
	if fr.Goal == nil || fr.Goal.PlusMs != 2 || !*fr.MeetsP50 || *fr.MeetsP99 || len(fr.Rounds) != 2 || !*fr.Rounds[0].MeetsP50 || *fr.Rounds[1].MeetsP50 {
		t.Errorf("frozen row %+v", fr)
	}
	tb := ratioTable(rows)
	if got := tb.Rows[0]; got[3] != "1.00 [1.00–1.10]" || got[8] != "met (straddles: 1 of 2 rounds)" {
		t.Errorf("start cells %q", got)
	}
	if got := tb.Rows[1]; got[3] != "+1.0 ms (1.10) [1.10–1.30]" || got[7] != "≤ +2 ms" || got[8] != "met (straddles: 1 of 2 rounds)" || got[9] != "not met (straddles: 1 of 2 rounds)" {
		t.Errorf("frozen cells %q", got)
	}
}

// TestRatioRowsWarm: a warm start is compared with the cold start of the
// same template, against the warm template's goal of half of it.
func TestRatioRowsWarm(t *testing.T) {
	m := map[string]measured{
		"start/web/client":        one(200, 220, 210),
		"warm-start/web/client":   one(100, 90, 120),
		"start/web/node":          one(80),
		"warm-start/web/node":     one(60),
		"start/app64/client":      one(300),
		"warm-start/app64/client": one(160),
		"mem-hot/web/sandstormd":  one(30),
		"mem-hot/web/warm":        one(45),
	}
	rows := ratioRows(m, []string{"web", "app64"})
	if len(rows) != 4 {
		t.Fatalf("rows = %+v", rows)
	}
	w := rows[0]
	if w.Series != "warm-start/web/client" || w.Baseline != "start/web/client" || w.P50 != 100 || w.BaselineP50 != 210 ||
		w.Goal.String() != "≤ 0.5" || w.MeetsP50 == nil || !*w.MeetsP50 {
		t.Errorf("web warm row = %+v", w)
	}
	if n := rows[1]; n.Series != "warm-start/web/node" || math.Abs(n.RatioP50-0.75) > 1e-12 || n.MeetsP50 != nil {
		t.Errorf("web node row = %+v", n)
	}
	if m := rows[2]; m.Series != "mem-hot/web/warm" || m.Baseline != "mem-hot/web/sandstormd" || m.RatioP50 != 1.5 {
		t.Errorf("web memory row = %+v", m)
	}
	if a := rows[3]; a.Template != "app64" || a.MeetsP50 == nil || *a.MeetsP50 {
		t.Errorf("app64: 160/300 > 0.5 should not meet the goal: %+v", a)
	}
	if got := ratioTable(rows).Rows[0]; got[3] != "0.48" || got[8] != "met" {
		t.Errorf("warm cells %q", got)
	}
}

func TestMemoryTable(t *testing.T) {
	var m memory
	a := m.get("web", "sandstormd")
	a.SamplesMiB = append(a.SamplesMiB, 25.5, 24.25, 26)
	if m.get("web", "sandstormd") != a {
		t.Fatal("get made a second series of the same name")
	}
	b := m.get("web", "raw")
	b.Failures = append(b.Failures, "sandbox raw-1 is gone")
	tb := memoryTable(m.list)
	if len(tb.Rows) != 2 {
		t.Fatalf("rows %q", tb.Rows)
	}
	if got := tb.Rows[0]; got[0] != "mem-hot/web/sandstormd" || got[1] != "3" || got[2] != "25.5" || got[3] != "26.0" || got[4] != "24.2" || got[7] != "25.5, 24.2, 26.0" {
		t.Errorf("sandstormd row %q", got)
	}
	if a.Summary == nil || a.Summary.P50 != 25.5 || a.Summary.N != 3 {
		t.Errorf("summary %+v", a.Summary)
	}
	if got := tb.Rows[1]; got[1] != "0" || got[6] != "1" || !strings.Contains(got[7], "gone") || b.Summary != nil {
		t.Errorf("raw row %q (summary %+v)", got, b.Summary)
	}
}

func TestRoundsTable(t *testing.T) {
	m := map[string]measured{
		"a": {samples: []float64{1, 2, 3, 10, 20, 30}, ends: []int{3, 6}},
		"b": {samples: []float64{5}, ends: []int{1, 1}}, // nothing in round 2
		"c": {samples: []float64{}, ends: []int{0, 0}},  // never measured: no row
	}
	tb := roundsTable([]string{"a", "b", "c"}, m, func(string) string { return "ms" })
	if tb == nil || len(tb.Columns) != 5 || len(tb.Rows) != 2 {
		t.Fatalf("table %+v", tb)
	}
	if got := tb.Rows[0]; got[2] != "2.00 / 3.00 (n 3)" || got[3] != "20.0 / 30.0 (n 3)" || got[4] != "10.00 ×" {
		t.Errorf("a: %q", got)
	}
	if got := tb.Rows[1]; got[3] != "—" || got[4] != "1.00 ×" {
		t.Errorf("b: %q", got)
	}
	if roundsTable([]string{"a"}, map[string]measured{"a": one(1, 2)}, func(string) string { return "ms" }) != nil {
		t.Error("a table for a run of one round")
	}
}
