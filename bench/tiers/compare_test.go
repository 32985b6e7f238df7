package main

import (
	"math"
	"strings"
	"testing"
)

func TestRatioRows(t *testing.T) {
	samples := map[string][]float64{
		// Nearest rank: p50 of 4 samples is the 2nd smallest, p99 the max.
		"start/web/client":     {120, 100, 110, 300},
		"raw-start/web/client": {100, 90, 95, 200},
		// Snapshot wake within target; frozen has no raw side.
		"wake-snapshot/web/client": {104},
		"raw-restore/web/client":   {100},
		"wake-frozen/web/client":   {10},
		// A raw series with no samples yields no row.
		"start/app64/client":     {300},
		"raw-start/app64/client": {},
		"mem-hot/web/sandstormd": {25, 26, 24},
		"mem-hot/web/raw":        {24, 25, 24},
	}
	rows := ratioRows(samples, []string{"web", "app64"})
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
	if start.MeetsTargetP50 == nil || *start.MeetsTargetP50 != false {
		t.Errorf("start: 1.16 > 1.15 should not meet the target: %v", start.MeetsTargetP50)
	}
	snap := rows[1]
	if snap.What != comparisons[1].what || snap.MeetsTargetP50 == nil || !*snap.MeetsTargetP50 || snap.Target != "≤ 1.05" {
		t.Errorf("snapshot row = %+v", snap)
	}
	mem := rows[2]
	if !strings.HasSuffix(mem.What, "MiB") || mem.P50 != 25 || mem.BaselineP50 != 24 || mem.MeetsTargetP50 != nil {
		t.Errorf("memory row = %+v", mem)
	}

	tb := ratioTable(rows)
	if len(tb.Rows) != 3 || len(tb.Rows[0]) != len(tb.Columns) {
		t.Fatalf("table %+v", tb)
	}
	if got := tb.Rows[0]; got[4] != "1.16" || got[9] != "≤ 1.15 (not met)" || got[8] != "4/4" {
		t.Errorf("start cells %q", got)
	}
	if got := tb.Rows[2]; got[2] != "25.0" || got[9] != "—" {
		t.Errorf("memory cells %q", got)
	}
}

// TestRatioRowsWarm: a warm start is compared with the cold start of the
// same template, against the warm template's target of half of it.
func TestRatioRowsWarm(t *testing.T) {
	samples := map[string][]float64{
		"start/web/client":        {200, 220, 210},
		"warm-start/web/client":   {100, 90, 120},
		"start/web/node":          {80},
		"warm-start/web/node":     {60},
		"start/app64/client":      {300},
		"warm-start/app64/client": {160},
		"mem-hot/web/sandstormd":  {30},
		"mem-hot/web/warm":        {45},
	}
	rows := ratioRows(samples, []string{"web", "app64"})
	if len(rows) != 4 {
		t.Fatalf("rows = %+v", rows)
	}
	w := rows[0]
	if w.Series != "warm-start/web/client" || w.Baseline != "start/web/client" || w.P50 != 100 || w.BaselineP50 != 210 ||
		w.Target != "≤ 0.5" || w.MeetsTargetP50 == nil || !*w.MeetsTargetP50 {
		t.Errorf("web warm row = %+v", w)
	}
	if n := rows[1]; n.Series != "warm-start/web/node" || math.Abs(n.RatioP50-0.75) > 1e-12 || n.MeetsTargetP50 != nil {
		t.Errorf("web node row = %+v", n)
	}
	if m := rows[2]; m.Series != "mem-hot/web/warm" || m.Baseline != "mem-hot/web/sandstormd" || m.RatioP50 != 1.5 {
		t.Errorf("web memory row = %+v", m)
	}
	if a := rows[3]; a.Template != "app64" || a.MeetsTargetP50 == nil || *a.MeetsTargetP50 {
		t.Errorf("app64: 160/300 > 0.5 should not meet the target: %+v", a)
	}
	if got := ratioTable(rows).Rows[0]; got[4] != "0.48" || got[9] != "≤ 0.5 (met)" {
		t.Errorf("warm cells %q", got)
	}
}

func TestParseTarget(t *testing.T) {
	for s, want := range map[string]float64{"≤ 1.15": 1.15, "≤1.05": 1.05, "≤ 0.5": 0.5} {
		if v, ok := parseTarget(s); !ok || v != want {
			t.Errorf("parseTarget(%q) = %v, %v", s, v, ok)
		}
	}
	if _, ok := parseTarget(""); ok {
		t.Error(`parseTarget("") ok`)
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
