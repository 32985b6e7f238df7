package main

import (
	"fmt"

	"sandstorm/internal/bench"
)

// comparison is one row of the goals table: a series of ours beside its
// baseline from the same run, and what it must stay within (ratio: at
// most that many times the baseline's p50; limitMs: a p50 of at most
// that many ms; neither: only reported).
type comparison struct {
	Goal     string   `json:"goal"`
	Series   string   `json:"series"`
	Baseline string   `json:"baseline,omitempty"`
	Ratio    float64  `json:"ratio_goal,omitempty"`
	LimitMs  float64  `json:"limit_ms,omitempty"`
	P50Ms    *float64 `json:"p50_ms,omitempty"`
	P99Ms    *float64 `json:"p99_ms,omitempty"`
	BaseP50  *float64 `json:"baseline_p50_ms,omitempty"`
	BaseP99  *float64 `json:"baseline_p99_ms,omitempty"`
	Met      *bool    `json:"met,omitempty"`
}

// comparisons are the goals and the comparisons it asks for, for
// the run's sizes.
func comparisons(sizes []int) []comparison {
	var cs []comparison
	for _, mib := range sizes {
		sz := sizeName(mib)
		cs = append(cs, comparison{Goal: fmt.Sprintf("pull + unpack of %d MiB ≤ 1.0 × skopeo + umoci", mib),
			Series: "pull/" + sz + "/sandstormd", Baseline: "pull/" + sz + "/skopeo+umoci", Ratio: 1})
	}
	return append(cs,
		comparison{Goal: "Dockerfile build, fully cached ≤ 1 s", Series: "build-cached/sandstormd", Baseline: "build-cached/podman", LimitMs: 1000},
		comparison{Goal: "Dockerfile build, cold (reported)", Series: "build-cold/sandstormd", Baseline: "build-cold/podman"},
		comparison{Goal: "create → first answer, image template, cold (reported)", Series: "start-cold/sandstormd", Baseline: "start/podman+runsc"},
		comparison{Goal: "create → first answer, image template, warm (reported)", Series: "start-warm/sandstormd", Baseline: "start/podman+runsc"},
	)
}

// fill sets c's figures from by and whether its goal is met (left nil
// when there is no goal, or a figure it needs is missing).
func (c *comparison) fill(by map[string]bench.Summary) {
	if s, ok := by[c.Series]; ok {
		c.P50Ms, c.P99Ms = &s.P50Ms, &s.P99Ms
	}
	if b, ok := by[c.Baseline]; ok {
		c.BaseP50, c.BaseP99 = &b.P50Ms, &b.P99Ms
	}
	switch {
	case c.P50Ms == nil:
	case c.LimitMs > 0:
		m := *c.P50Ms <= c.LimitMs
		c.Met = &m
	case c.Ratio > 0 && c.BaseP50 != nil && *c.BaseP50 > 0:
		m := *c.P50Ms / *c.BaseP50 <= c.Ratio
		c.Met = &m
	}
}

// goals is the goals table of res: each of ours beside its baseline at
// p50 (p99), their ratio, and the verdict.
func goals(res *bench.Results, sizes []int) *bench.Table {
	by := map[string]bench.Summary{}
	for _, s := range res.Series {
		if sum, err := bench.Summarize(s.SamplesMs); err == nil {
			by[s.Name] = sum
		}
	}
	cs := comparisons(sizes)
	t := &bench.Table{
		Title:       "The issue's goals, each beside its baseline in this run",
		Description: "p50 (p99) in ms, nearest rank; ratio = ours / theirs at p50 (and at p99). A goal is judged at p50.",
		Columns:     []string{"goal", "sandstormd", "baseline", "baseline p50 (p99)", "ratio", "verdict"},
		Data:        &cs,
	}
	for i := range cs {
		c := &cs[i]
		c.fill(by)
		t.Rows = append(t.Rows, []string{c.Goal, pair(c.P50Ms, c.P99Ms), c.Baseline, pair(c.BaseP50, c.BaseP99), ratios(c), verdict(c.Met)})
	}
	return t
}

// pair is "p50 (p99)" in ms, "—" when missing.
func pair(p50, p99 *float64) string {
	if p50 == nil || p99 == nil {
		return "—"
	}
	return bench.FormatMs(*p50) + " (" + bench.FormatMs(*p99) + ")"
}

// ratios is ours over the baseline at p50 (p99), "—" without both.
func ratios(c *comparison) string {
	if c.P50Ms == nil || c.BaseP50 == nil || *c.BaseP50 == 0 || *c.BaseP99 == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f (%.2f)", *c.P50Ms / *c.BaseP50, *c.P99Ms / *c.BaseP99)
}

func verdict(met *bool) string {
	switch {
	case met == nil:
		return "—"
	case *met:
		return "met"
	}
	return "not met"
}
