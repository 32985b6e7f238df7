package main

import (
	"context"
	"fmt"
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
	target   string
}

// comparisons are the ratios the README quotes. The targets are issue 8's:
// create to first answer through the gateway within 1.15 × raw runsc run
// to first answer, and the wake from snapshot within 1.05 × raw runsc
// restore to first answer, of the same app on the same runsc; and the
// warm template's: a warm start within 0.5 × the cold start of the same
// app.
var comparisons = []comparison{
	{"start → first answer, ms", "start/%s/client", "raw-start/%s/client", "≤ 1.15"},
	{"wake from snapshot → answer, ms", "wake-snapshot/%s/client", "raw-restore/%s/client", "≤ 1.05"},
	{"wake from frozen → answer, ms", "wake-frozen/%s/client", "raw-resume/%s/client", ""},
	{"create: node's own time / runsc run alone, ms", "start/%s/node", "raw-start/%s/runsc", ""},
	{"restore: node's own time / runsc restore alone, ms", "wake-snapshot/%s/node", "raw-restore/%s/runsc", ""},
	{"into snapshot: API round trip / runsc checkpoint alone, ms", "snapshot/%s/api", "raw-checkpoint/%s/runsc", ""},
	{"into frozen: API round trip / runsc pause alone, ms", "freeze/%s/api", "raw-pause/%s/runsc", ""},
	{"hot memory at first answer, MiB", "mem-hot/%s/sandstormd", "mem-hot/%s/raw", ""},
	{"warm start → first answer / cold start, ms", "warm-start/%s/client", "start/%s/client", "≤ 0.5"},
	{"warm create: node's own time / cold create's, ms", "warm-start/%s/node", "start/%s/node", ""},
	{"pooled warm start → first answer / cold start, ms", "warm-pool/%s/client", "start/%s/client", "≤ 0.5"},
	{"hot memory at first answer: warm / cold, MiB", "mem-hot/%s/warm", "mem-hot/%s/sandstormd", ""},
}

// ratioRow is one computed row, for results.json: Series over Baseline.
type ratioRow struct {
	What           string  `json:"what"`
	Template       string  `json:"template"`
	Series         string  `json:"series"`
	Baseline       string  `json:"baseline"`
	N              int     `json:"n"`
	BaselineN      int     `json:"baseline_n"`
	P50            float64 `json:"p50"`
	BaselineP50    float64 `json:"baseline_p50"`
	RatioP50       float64 `json:"ratio_p50"`
	P99            float64 `json:"p99"`
	BaselineP99    float64 `json:"baseline_p99"`
	RatioP99       float64 `json:"ratio_p99"`
	Target         string  `json:"target,omitempty"`
	MeetsTargetP50 *bool   `json:"meets_target_p50,omitempty"`
}

// ratioRows computes every comparison that has samples on both sides, for
// each template in order. Percentiles are nearest rank (bench.Distribute),
// as in the summary table; ratios are of the p50s and of the p99s.
func ratioRows(samples map[string][]float64, templates []string) []ratioRow {
	var out []ratioRow
	for _, t := range templates {
		for _, c := range comparisons {
			sName, bName := fmt.Sprintf(c.series, t), fmt.Sprintf(c.baseline, t)
			sd, err1 := bench.Distribute(samples[sName])
			bd, err2 := bench.Distribute(samples[bName])
			if err1 != nil || err2 != nil || bd.P50 <= 0 || bd.P99 <= 0 {
				continue
			}
			row := ratioRow{
				What: c.what, Template: t, Series: sName, Baseline: bName,
				N: sd.N, BaselineN: bd.N,
				P50: sd.P50, BaselineP50: bd.P50, RatioP50: sd.P50 / bd.P50,
				P99: sd.P99, BaselineP99: bd.P99, RatioP99: sd.P99 / bd.P99,
				Target: c.target,
			}
			if th, ok := parseTarget(c.target); ok {
				meets := row.RatioP50 <= th
				row.MeetsTargetP50 = &meets
			}
			out = append(out, row)
		}
	}
	return out
}

// parseTarget reads "≤ 1.15".
func parseTarget(s string) (float64, bool) {
	var v float64
	if _, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(s, "≤")), "%g", &v); err != nil {
		return 0, false
	}
	return v, true
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
			"a sandstormd series over raw runsc's, or a warm start over the cold start; ratios of the nearest-rank p50s and p99s. " +
			"Targets (issue 8's for sandstormd / raw, the warm template's for warm / cold) are on the p50 ratio.",
		Columns: []string{"comparison", "template", "p50", "baseline p50", "ratio p50", "p99", "baseline p99", "ratio p99", "n (series/baseline)", "target"},
		Data:    rows,
	}
	for _, r := range rows {
		target := r.Target
		if r.MeetsTargetP50 != nil {
			if *r.MeetsTargetP50 {
				target += " (met)"
			} else {
				target += " (not met)"
			}
		}
		if target == "" {
			target = "—"
		}
		t.Rows = append(t.Rows, []string{r.What, r.Template,
			formatValue(r.What, r.P50), formatValue(r.What, r.BaselineP50), fmt.Sprintf("%.2f", r.RatioP50),
			formatValue(r.What, r.P99), formatValue(r.What, r.BaselineP99), fmt.Sprintf("%.2f", r.RatioP99),
			fmt.Sprintf("%d/%d", r.N, r.BaselineN), target})
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
	samples := map[string][]float64{}
	for _, s := range r.res.Series {
		samples[s.Name] = s.SamplesMs
	}
	for _, m := range r.mem.list {
		samples[m.Name] = m.SamplesMiB
	}
	var out []*bench.Table
	if rows := ratioRows(samples, r.cfg.templates); len(rows) > 0 {
		out = append(out, ratioTable(rows))
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
