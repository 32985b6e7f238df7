package sambench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sandstorm/internal/bench"
)

// WriteFile writes obs as JSON to path (its directory created), through a
// temporary file so that a reader never sees half of it. The JSON is
// compact: indented, every raw sample would take ten lines.
func WriteFile(path string, obs *Observations) error {
	b, err := json.Marshal(obs)
	if err != nil {
		return err
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	tmp := path + ".part"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadFile reads an observations file written by sam-bench run.
func ReadFile(path string) (*Observations, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var obs Observations
	if err := json.Unmarshal(b, &obs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if obs.Tool != Tool || obs.Main == nil {
		return nil, fmt.Errorf("%s: not a %s observations file", path, Tool)
	}
	return &obs, nil
}

// Run as read for a report, with the file it came from.
type fileObs struct {
	file string
	*Observations
}

// Report reads the observations files and renders them as Markdown: a
// header with the machine and commit, one table row per file (ordered by
// label, numbers in labels compared as numbers, so step=2 comes before
// step=16), the warmups, and what went wrong.
func Report(paths []string) (string, error) {
	var runs []fileObs
	for _, p := range paths {
		obs, err := ReadFile(p)
		if err != nil {
			return "", err
		}
		runs = append(runs, fileObs{file: filepath.Base(p), Observations: obs})
	}
	if len(runs) == 0 {
		return "", fmt.Errorf("no observations files")
	}
	slices.SortStableFunc(runs, func(a, b fileObs) int {
		return cmp.Or(
			naturalCompare(a.Label, b.Label),
			cmp.Compare(a.Route, b.Route),
			cmp.Compare(a.Flow, b.Flow),
			cmp.Compare(a.Mode, b.Mode),
			naturalCompare(a.file, b.file),
		)
	})
	return render(runs), nil
}

func render(runs []fileObs) string {
	var b strings.Builder
	b.WriteString("# sam-bench\n\n")
	header(&b, "Machine", runs, func(o fileObs) string { return o.Machine.String() })
	header(&b, "Source", runs, func(o fileObs) string { return o.Source.String() })
	first, last := runs[0].Started, runs[0].Finished
	for _, r := range runs {
		if r.Started.Before(first) {
			first = r.Started
		}
		if r.Finished.After(last) {
			last = r.Finished
		}
	}
	fmt.Fprintf(&b, "- Recorded: %s to %s, %d runs\n\n", first.UTC().Format("2006-01-02 15:04:05"), last.UTC().Format("2006-01-02 15:04:05 UTC"), len(runs))

	b.WriteString("| label | route | flow | mode | ok | failed | p50 ms | p99 ms | req/s | admission µs | refusals/s | refused (boundary) | leaked | RSS MiB | file |\n")
	b.WriteString("|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range runs {
		m := r.Main
		p50, p99 := "—", "—"
		if m.LatencyUs != nil {
			p50, p99 = bench.FormatMs(m.LatencyUs.P50/1000), bench.FormatMs(m.LatencyUs.P99/1000)
		}
		reqs, refusals, leaked := "—", "—", "—"
		if r.Mode == ModeDeny {
			refusals = fmt.Sprintf("%.0f", m.OKPerSecond)
			leaked = fmt.Sprint(m.Leaked)
		} else {
			reqs = fmt.Sprintf("%.0f", m.OKPerSecond)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			cell(orDash(r.Label)), r.Route, r.Flow, r.Mode, m.OK, m.Failed, p50, p99, reqs,
			optFloat(r.Derived.AdmissionMeanUs, "%.1f"), refusals, optFloat(r.Derived.BoundaryRefusals, "%.0f"),
			leaked, rss(r.Processes), cell(r.file))
	}
	b.WriteString("\nLatency is client-side, to the end of the response body (or, for a deny run, to the refusal), " +
		"over the main phase only; percentiles are nearest-rank over the full sorted sample, so each figure was observed. " +
		"Failed requests are not in the distribution. \"ok\" is requests that met the run's expectation: served (allow) or refused (deny). " +
		"\"admission µs\" is the boundary's own mean (Δsum/Δcount of its admission histogram over the main phase), " +
		"\"refused (boundary)\" its own count of refused flows; both from --scrape. RSS is resident memory after the run, " +
		"summed over the processes named (their number in brackets when more than one).\n")

	var warm []fileObs
	for _, r := range runs {
		if r.Warmup != nil && r.Warmup.Requests > 0 {
			warm = append(warm, r)
		}
	}
	if len(warm) > 0 {
		b.WriteString("\n## Warmup\n\nIssued before the main phase and kept out of it; the first request is the one that pays for cold caches.\n\n")
		b.WriteString("| label | route | flow | mode | ok | failed | first ms | p50 ms | max ms |\n|---|---|---|---|--:|--:|--:|--:|--:|\n")
		for _, r := range warm {
			w := r.Warmup
			firstMs, p50, max := "—", "—", "—"
			for _, s := range w.Samples {
				if s.Seq == 0 {
					firstMs = bench.FormatMs(float64(s.TotalUs) / 1000)
				}
			}
			if w.LatencyUs != nil {
				p50, max = bench.FormatMs(w.LatencyUs.P50/1000), bench.FormatMs(w.LatencyUs.Max/1000)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %s | %s | %s |\n",
				cell(orDash(r.Label)), r.Route, r.Flow, r.Mode, w.OK, w.Failed, firstMs, p50, max)
		}
	}

	var problems []string
	for _, r := range runs {
		name := orDash(r.Label) + " (" + r.file + ")"
		for _, ph := range []struct {
			name string
			p    *Phase
		}{{"warmup", r.Warmup}, {"main", r.Main}} {
			if ph.p == nil || len(ph.p.Failures) == 0 {
				continue
			}
			var kinds []string
			for _, k := range slices.Sorted(maps.Keys(ph.p.Failures)) {
				kinds = append(kinds, fmt.Sprintf("%s ×%d", k, ph.p.Failures[k]))
			}
			problems = append(problems, fmt.Sprintf("%s, %s: %s", name, ph.name, strings.Join(kinds, ", ")))
		}
		for _, n := range r.Notes {
			problems = append(problems, name+": "+n)
		}
	}
	if len(problems) > 0 {
		b.WriteString("\n## Failures and notes\n\n")
		for _, p := range problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	return b.String()
}

// header writes "- what: value" when every run agrees, otherwise one line
// per distinct value with the runs that had it.
func header(b *strings.Builder, what string, runs []fileObs, value func(fileObs) string) {
	var order []string
	who := map[string][]string{}
	for _, r := range runs {
		v := value(r)
		if _, ok := who[v]; !ok {
			order = append(order, v)
		}
		who[v] = append(who[v], r.file)
	}
	if len(order) == 1 {
		fmt.Fprintf(b, "- %s: %s\n", what, order[0])
		return
	}
	fmt.Fprintf(b, "- %s (differs between runs):\n", what)
	for _, v := range order {
		fmt.Fprintf(b, "  - %s: %s\n", v, strings.Join(who[v], ", "))
	}
}

func rss(procs []Proc) string {
	if len(procs) == 0 {
		return "—"
	}
	var kib int64
	for _, p := range procs {
		kib += p.RSSKiB
	}
	s := fmt.Sprintf("%.1f", float64(kib)/1024)
	if len(procs) > 1 {
		s += fmt.Sprintf(" (%d)", len(procs))
	}
	return s
}

func optFloat(v *float64, format string) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf(format, *v)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// naturalCompare orders strings with runs of digits compared as numbers.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da != "" && db != "" {
			ta, tb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if c := cmp.Or(cmp.Compare(len(ta), len(tb)), cmp.Compare(ta, tb)); c != 0 {
				return c
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}
