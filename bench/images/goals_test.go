package main

import (
	"strings"
	"testing"

	"sandstorm/internal/bench"
)

func results(series map[string][]float64) *bench.Results {
	r := bench.NewResults("t", "t")
	for name, samples := range series {
		s := r.AddSeries(name, "", "")
		for _, v := range samples {
			s.Add(v)
		}
	}
	return r
}

// TestGoals: ratios at p50 and p99 and the verdicts — a ratio goal
// judged against the baseline's p50, the cached build against 1 s, a
// comparison with no goal only reported, a missing baseline not judged.
func TestGoals(t *testing.T) {
	res := results(map[string][]float64{
		"pull/100MiB/sandstormd":   {300, 400, 500},
		"pull/100MiB/skopeo+umoci": {800, 800, 1000},
		"pull/500MiB/sandstormd":   {3000, 3100, 3200},
		"pull/500MiB/skopeo+umoci": {2000, 2500, 2600},
		"build-cached/sandstormd":  {900, 950, 1500},
		"build-cold/sandstormd":    {5000},
		"build-cold/podman":        {2500},
	})
	tab := goals(res, []int{100, 500})
	rows := map[string][]string{}
	for _, r := range tab.Rows {
		rows[r[0]] = r
	}
	check := func(goal string, col int, want string) {
		t.Helper()
		r, ok := rows[goal]
		if !ok {
			t.Fatalf("no row %q in %v", goal, tab.Rows)
		}
		if r[col] != want {
			t.Errorf("%s column %d = %q, want %q", goal, col, r[col], want)
		}
	}
	check("pull + unpack of 100 MiB ≤ 1.0 × skopeo + umoci", 4, "0.50 (0.50)")
	check("pull + unpack of 100 MiB ≤ 1.0 × skopeo + umoci", 5, "met")
	check("pull + unpack of 500 MiB ≤ 1.0 × skopeo + umoci", 4, "1.24 (1.23)")
	check("pull + unpack of 500 MiB ≤ 1.0 × skopeo + umoci", 5, "not met")
	check("Dockerfile build, fully cached ≤ 1 s", 5, "met") // p50: the 2nd of 3, 950
	check("Dockerfile build, fully cached ≤ 1 s", 3, "—")
	check("Dockerfile build, cold (reported)", 4, "2.00 (2.00)")
	check("Dockerfile build, cold (reported)", 5, "—")
	check("create → first answer, image template, cold (reported)", 1, "—")
	if !strings.Contains(tab.Markdown(), "| goal | sandstormd |") {
		t.Errorf("markdown:\n%s", tab.Markdown())
	}
}
