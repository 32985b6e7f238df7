package main

import (
	"context"
	"fmt"
	"math"
	"strings"

	"sandstorm/internal/bench"
	"sandstorm/internal/bench/raw"
	"sandstorm/internal/sandbox/gvisor"
)

// memSeries is one kind of sandbox's memory in the hot tier, in MiB: its
// memory cgroup's usage (gVisor's application memory is a memfd charged
// there, with the sentry's own), read as the node reads it, once per
// sandbox right after its first answer.
type memSeries struct {
	Name        string              `json:"name"` // mem-hot/<template>/<runtime>
	Description string              `json:"description"`
	SamplesMiB  []float64           `json:"samples_mib"`
	RoundEnds   []int               `json:"round_ends,omitempty"` // as bench.Series.RoundEnds
	Summary     *bench.Distribution `json:"summary_mib,omitempty"`
	Failures    []string            `json:"failures,omitempty"`
}

// memory holds the memory series in the order they were first read.
type memory struct{ list []*memSeries }

var memDescriptions = map[string]string{
	"sandstormd":  "memory cgroup usage of a sandstormd sandbox right after its first answer (each start sample's sandbox; the cgroup runsc made under the daemon's root)",
	"warm":        "the same for each warm-start sample's sandbox (a restore of the warm image)",
	"warm-pool":   "the same for each warm-pool sample's sandbox (restored ahead of demand, resumed and reseeded by the create)",
	"raw":         "memory cgroup usage of a raw runsc sandbox right after its first answer (each raw-start sample's sandbox)",
	"clone-child": "the same for each clone child right after its first answer (a restore of its parent's image)",
}

// get returns the series of template t under runtime ("sandstormd",
// "raw"), made on first use.
func (m *memory) get(t, runtime string) *memSeries {
	name := "mem-hot/" + t + "/" + runtime
	for _, s := range m.list {
		if s.Name == name {
			return s
		}
	}
	s := &memSeries{Name: name, Description: memDescriptions[runtime], SamplesMiB: []float64{}}
	m.list = append(m.list, s)
	return s
}

// read records the memory of container id under be's root, or why it
// could not be read (a failure here never fails the time sample).
func (s *memSeries) read(ctx context.Context, be *gvisor.Backend, id string) {
	mib, err := raw.MemoryMiB(ctx, be, id)
	if err != nil {
		s.Failures = append(s.Failures, err.Error())
		return
	}
	s.SamplesMiB = append(s.SamplesMiB, mib)
}

// comparison is one row kind of the ratio table: a series over the
// baseline it is compared with (%s is the template) — sandstormd over raw
// runsc, or a warm start over the cold one.
type comparison struct {
	what     string
	series   string
	baseline string
	goal     bench.Goal
}

// comparisons are the ratios the README quotes. The goals are issue 19's
// for sandstormd over raw runsc of the same app on the same runsc, each at
// p50 and p99: create to first answer through the gateway within 1.05 ×
// raw runsc run to first answer, the wake from snapshot within 1.05 × raw
// runsc restore to first answer, the snapshot through the API within 1.3 ×
// runsc checkpoint alone, the wake from frozen within raw runsc resume to
// first answer + 2 ms; and the warm template's: a warm start within 0.5 ×
// the cold start of the same app.
var comparisons = []comparison{
	{"start → first answer, ms", "start/%s/client", "raw-start/%s/client", bench.Goal{Ratio: 1.05}},
	{"wake from snapshot → answer, ms", "wake-snapshot/%s/client", "raw-restore/%s/client", bench.Goal{Ratio: 1.05}},
	{"into snapshot: API round trip / runsc checkpoint alone, ms", "snapshot/%s/api", "raw-checkpoint/%s/runsc", bench.Goal{Ratio: 1.3}},
	{"wake from frozen → answer, ms", "wake-frozen/%s/client", "raw-resume/%s/client", bench.Goal{PlusMs: 2}},
	{"hot request, gateway / straight to the sandbox, ms", "hot/%s/client", "raw-hot/%s/client", bench.Goal{}},
	{"create: node's own time / runsc run alone, ms", "start/%s/node", "raw-start/%s/runsc", bench.Goal{}},
	{"restore: node's own time / runsc restore alone, ms", "wake-snapshot/%s/node", "raw-restore/%s/runsc", bench.Goal{}},
	{"into frozen: API round trip / runsc pause alone, ms", "freeze/%s/api", "raw-pause/%s/runsc", bench.Goal{}},
	{"sandbox CPU, start → first answer, ms", "start/%s/sandbox-cpu", "raw-start/%s/sandbox-cpu", bench.Goal{}},
	{"sandbox CPU, restore → first answer, ms", "wake-snapshot/%s/sandbox-cpu", "raw-restore/%s/sandbox-cpu", bench.Goal{}},
	{"hot memory at first answer, MiB", "mem-hot/%s/sandstormd", "mem-hot/%s/raw", bench.Goal{}},
	{"warm start → first answer / cold start, ms", "warm-start/%s/client", "start/%s/client", bench.Goal{Ratio: 0.5}},
	{"warm create: node's own time / cold create's, ms", "warm-start/%s/node", "start/%s/node", bench.Goal{}},
	{"pooled warm start → first answer / cold start, ms", "warm-pool/%s/client", "start/%s/client", bench.Goal{Ratio: 0.5}},
	{"hot memory at first answer: warm / cold, MiB", "mem-hot/%s/warm", "mem-hot/%s/sandstormd", bench.Goal{}},
	{"hot memory at first answer: clone child / cold, MiB", "mem-hot/%s/clone-child", "mem-hot/%s/sandstormd", bench.Goal{}},
}

// ratioRow is one computed row, for results.json: Series over Baseline,
// over the whole run and round by round.
type ratioRow struct {
	What     string `json:"what"`
	Template string `json:"template"`
	Series   string `json:"series"`
	Baseline string `json:"baseline"`
	ratio
	Goal     *bench.Goal `json:"goal,omitempty"`
	MeetsP50 *bool       `json:"meets_p50,omitempty"`
	MeetsP99 *bool       `json:"meets_p99,omitempty"`
	// Rounds are the same figures within each round of the run (both
	// series measured close together in time): how far a ratio moves
	// between rounds, and whether it straddles its goal.
	Rounds []roundRow `json:"rounds,omitempty"`
}

// roundRow is a comparison within one round.
type roundRow struct {
	Round int `json:"round"`
	ratio
	MeetsP50 *bool `json:"meets_p50,omitempty"`
	MeetsP99 *bool `json:"meets_p99,omitempty"`
}

// ratio is a series' p50 and p99 over its baseline's: what a row over the
// whole run and a row of one round both hold (embedded, its fields are
// theirs in results.json).
type ratio struct {
	N           int     `json:"n"`
	BaselineN   int     `json:"baseline_n"`
	P50         float64 `json:"p50"`
	BaselineP50 float64 `json:"baseline_p50"`
	RatioP50    float64 `json:"ratio_p50"`
	P99         float64 `json:"p99"`
	BaselineP99 float64 `json:"baseline_p99"`
	RatioP99    float64 `json:"ratio_p99"`
}

// ratioOf compares samples with baseline; ok is false when either has no
// samples or the baseline's p50 or p99 is not positive (no ratio).
func ratioOf(samples, baseline []float64) (r ratio, ok bool) {
	sd, err1 := bench.Distribute(samples)
	bd, err2 := bench.Distribute(baseline)
	if err1 != nil || err2 != nil || bd.P50 <= 0 || bd.P99 <= 0 {
		return r, false
	}
	return ratio{N: sd.N, BaselineN: bd.N,
		P50: sd.P50, BaselineP50: bd.P50, RatioP50: sd.P50 / bd.P50,
		P99: sd.P99, BaselineP99: bd.P99, RatioP99: sd.P99 / bd.P99}, true
}

// meets checks r against g at p50 and at p99.
func (r ratio) meets(g bench.Goal) (p50, p99 *bool) {
	return g.Meets(r.P50, r.BaselineP50), g.Meets(r.P99, r.BaselineP99)
}

// measured is a series' samples and where its rounds end.
type measured struct {
	samples []float64
	ends    []int
}

// ratioRows computes every comparison that has samples on both sides, for
// each template in order, over the run and within each round in which
// both sides have samples. Percentiles are nearest rank (bench.Distribute),
// as in the summary table; ratios are of the p50s and of the p99s.
func ratioRows(m map[string]measured, templates []string) []ratioRow {
	var out []ratioRow
	for _, t := range templates {
		for _, c := range comparisons {
			sName, bName := fmt.Sprintf(c.series, t), fmt.Sprintf(c.baseline, t)
			all, ok := ratioOf(m[sName].samples, m[bName].samples)
			if !ok {
				continue
			}
			row := ratioRow{What: c.what, Template: t, Series: sName, Baseline: bName, ratio: all}
			if c.goal.Set() {
				g := c.goal
				row.Goal = &g
				row.MeetsP50, row.MeetsP99 = all.meets(g)
			}
			sr, br := bench.Rounds(m[sName].samples, m[sName].ends), bench.Rounds(m[bName].samples, m[bName].ends)
			if len(sr) > 1 || len(br) > 1 {
				for k := 0; k < min(len(sr), len(br)); k++ {
					inRound, ok := ratioOf(sr[k], br[k])
					if !ok {
						continue
					}
					rr := roundRow{Round: k + 1, ratio: inRound}
					if row.Goal != nil {
						rr.MeetsP50, rr.MeetsP99 = inRound.meets(*row.Goal)
					}
					row.Rounds = append(row.Rounds, rr)
				}
			}
			out = append(out, row)
		}
	}
	return out
}

// roundsMet counts the rounds of r that meet its goal at p50 (p99 false)
// or p99.
func roundsMet(r ratioRow, p99 bool) (met, n int) {
	for _, rr := range r.Rounds {
		m := rr.MeetsP50
		if p99 {
			m = rr.MeetsP99
		}
		if m == nil {
			continue
		}
		n++
		if *m {
			met++
		}
	}
	return met, n
}

// spread is the range of a row's ratio across its rounds, "" with fewer
// than two.
func spread(r ratioRow, p99 bool) string {
	if len(r.Rounds) < 2 {
		return ""
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, rr := range r.Rounds {
		v := rr.RatioP50
		if p99 {
			v = rr.RatioP99
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	return fmt.Sprintf("%.2f–%.2f", lo, hi)
}

// formatValue formats a p50 or p99 of a comparison for the table: ms as
// the summary table does, MiB with one decimal.
func formatValue(what string, v float64) string {
	if strings.HasSuffix(what, "MiB") {
		return fmt.Sprintf("%.1f", v)
	}
	return bench.FormatMs(v)
}

// ratioTable renders rows as a bench.Table.
func ratioTable(rows []ratioRow) *bench.Table {
	t := &bench.Table{
		Title: "sandstormd / raw runsc, warm / cold",
		Description: "Each series over its baseline of the same template, both measured in this run on the same runsc, platform and bundle: " +
			"a sandstormd series over raw runsc's, or a warm start over the cold start; ratios of the nearest-rank p50s and p99s, " +
			"over the whole run and, in brackets, their range across the run's rounds (each round measures every series in turn, so a series and its baseline close together in time). " +
			"Goals (issue 19's for sandstormd / raw, the warm template's for warm / cold) are checked at p50 and at p99; a goal met over the run but not in every round, or the other way round, straddles it.",
		Columns: []string{"comparison", "template", "p50 / baseline", "ratio p50 [rounds]", "p99 / baseline", "ratio p99 [rounds]", "n (series/baseline)", "goal", "at p50", "at p99"},
		Data:    rows,
	}
	for _, r := range rows {
		goalS, m50, m99 := "—", "—", "—"
		if r.Goal != nil {
			goalS = r.Goal.String()
			met, n := roundsMet(r, false)
			m50 = bench.Verdict(r.MeetsP50, met, n)
			met, n = roundsMet(r, true)
			m99 = bench.Verdict(r.MeetsP99, met, n)
		}
		withSpread := func(cell, sp string) string {
			if sp == "" {
				return cell
			}
			return cell + " [" + sp + "]"
		}
		t.Rows = append(t.Rows, []string{r.What, r.Template,
			formatValue(r.What, r.P50) + " / " + formatValue(r.What, r.BaselineP50), withSpread(r.Goal.Format(r.P50, r.BaselineP50), spread(r, false)),
			formatValue(r.What, r.P99) + " / " + formatValue(r.What, r.BaselineP99), withSpread(r.Goal.Format(r.P99, r.BaselineP99), spread(r, true)),
			fmt.Sprintf("%d/%d", r.N, r.BaselineN), goalS, m50, m99})
	}
	return t
}

// roundsTable renders every series' p50 and p99 within each round of the
// run, so that a figure's spread across rounds shows beside its value over
// the whole run (the summary table). Nil for a run of one round.
func roundsTable(names []string, m map[string]measured, unit func(string) string) *bench.Table {
	rounds := 0
	for _, n := range names {
		rounds = max(rounds, len(bench.Rounds(m[n].samples, m[n].ends)))
	}
	if rounds < 2 {
		return nil
	}
	t := &bench.Table{
		Title: "Each figure round by round",
		Description: "p50 / p99 (nearest rank) of every series within each round of the run, and the spread of the p50s across rounds " +
			"(highest over lowest). Round k's samples are series[].samples_ms[round_ends[k-1]:round_ends[k]] in results.json.",
		Columns: []string{"series", "unit"},
	}
	for k := 1; k <= rounds; k++ {
		t.Columns = append(t.Columns, fmt.Sprintf("round %d", k))
	}
	t.Columns = append(t.Columns, "p50 spread")
	for _, n := range names {
		rs := bench.Rounds(m[n].samples, m[n].ends)
		row := []string{n, unit(n)}
		lo, hi := math.Inf(1), math.Inf(-1)
		any := false
		for k := 0; k < rounds; k++ {
			if k >= len(rs) || len(rs[k]) == 0 {
				row = append(row, "—")
				continue
			}
			d, _ := bench.Distribute(rs[k])
			row = append(row, fmt.Sprintf("%s / %s (n %d)", bench.FormatMs(d.P50), bench.FormatMs(d.P99), d.N))
			lo, hi = min(lo, d.P50), max(hi, d.P50)
			any = true
		}
		if !any {
			continue
		}
		if lo > 0 {
			row = append(row, fmt.Sprintf("%.2f ×", hi/lo))
		} else {
			row = append(row, "—")
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// memoryTable renders the memory series, raw samples included.
func memoryTable(list []*memSeries) *bench.Table {
	t := &bench.Table{
		Title: "Memory per hot sandbox (MiB)",
		Description: "Memory cgroup usage (memory.usage_in_bytes of the cgroup runsc makes for the sandbox) right after the first answer, " +
			"one reading per sandbox; nearest-rank percentiles. Raw samples in results.json (tables[].data).",
		Columns: []string{"series", "n", "p50", "p99", "min", "max", "failed", "samples"},
		Data:    list,
	}
	for _, s := range list {
		s.Summary = nil
		failed := ""
		if len(s.Failures) > 0 {
			failed = fmt.Sprint(len(s.Failures))
		}
		d, err := bench.Distribute(s.SamplesMiB)
		if err != nil {
			t.Rows = append(t.Rows, []string{s.Name, "0", "—", "—", "—", "—", failed, firstFailure(s.Failures)})
			continue
		}
		s.Summary = &d
		var sam []string
		for _, v := range s.SamplesMiB {
			sam = append(sam, fmt.Sprintf("%.1f", v))
		}
		t.Rows = append(t.Rows, []string{s.Name, fmt.Sprint(d.N),
			fmt.Sprintf("%.1f", d.P50), fmt.Sprintf("%.1f", d.P99), fmt.Sprintf("%.1f", d.Min), fmt.Sprintf("%.1f", d.Max),
			failed, strings.Join(sam, ", ")})
	}
	return t
}

func firstFailure(fs []string) string {
	if len(fs) == 0 {
		return ""
	}
	return "first failure: " + bench.OneLine(fs[0])
}

// tables are the derived tables of the run so far: the ratios and the
// memory readings (none when there is nothing to show).
func (r *runner) tables() []*bench.Table {
	m := map[string]measured{}
	for _, s := range r.res.Series {
		m[s.Name] = measured{s.SamplesMs, s.RoundEnds}
	}
	for _, s := range r.mem.list {
		m[s.Name] = measured{s.SamplesMiB, s.RoundEnds}
	}
	var out []*bench.Table
	if rows := ratioRows(m, r.cfg.templates); len(rows) > 0 {
		out = append(out, ratioTable(rows))
	}
	var names []string
	for _, s := range r.res.Series {
		names = append(names, s.Name)
	}
	for _, s := range r.mem.list {
		names = append(names, s.Name)
	}
	unit := func(n string) string {
		if strings.HasPrefix(n, "mem-") {
			return "MiB"
		}
		return "ms"
	}
	if rt := roundsTable(names, m, unit); rt != nil {
		out = append(out, rt)
	}
	if len(r.mem.list) > 0 {
		out = append(out, memoryTable(r.mem.list))
	}
	return out
}

// write writes the results so far, derived tables included.
func (r *runner) write() error {
	r.res.Tables = r.tables()
	return r.dir.Write(r.res)
}
