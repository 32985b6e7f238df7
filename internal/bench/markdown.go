package bench

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// FormatMs formats milliseconds for a table: two decimals below 10 ms, one
// below 100 ms, none above.
func FormatMs(ms float64) string {
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f", ms)
	default:
		return fmt.Sprintf("%.0f", ms)
	}
}

// Table renders the summary table of the series: series, n, p50, p99, min,
// max (ms), the seed's figure, and how many attempts failed.
func (r *Results) Table() string {
	var b strings.Builder
	b.WriteString("| series | n | p50 ms | p99 ms | min ms | max ms | seed | failed |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|---|--:|\n")
	for _, s := range r.Series {
		seed := s.Seed
		if seed == "" {
			seed = "—"
		}
		failed := ""
		if len(s.Failures) > 0 {
			failed = fmt.Sprint(len(s.Failures))
		}
		if s.Skipped != "" && len(s.SamplesMs) == 0 {
			fmt.Fprintf(&b, "| %s | 0 | — | — | — | — | %s | %s |\n", s.Name, seed, failed)
			continue
		}
		sum, err := Summarize(s.SamplesMs)
		if err != nil {
			fmt.Fprintf(&b, "| %s | 0 | — | — | — | — | %s | %s |\n", s.Name, seed, failed)
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", s.Name, sum.N,
			FormatMs(sum.P50Ms), FormatMs(sum.P99Ms), FormatMs(sum.MinMs), FormatMs(sum.MaxMs), seed, failed)
	}
	return b.String()
}

// Markdown renders the results for people: a header naming the machine and
// commit, the summary table, what each series measures, what went wrong,
// and the parameters. The raw samples are in results.json.
func (r *Results) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", r.Title)
	fmt.Fprintf(&b, "- Run: %s", r.Started.UTC().Format("2006-01-02 15:04:05 UTC"))
	if !r.Finished.IsZero() {
		fmt.Fprintf(&b, " to %s (%s)", r.Finished.UTC().Format("15:04:05 UTC"), r.Finished.Sub(r.Started).Round(1e9))
	} else {
		b.WriteString(" (not finished: partial results)")
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "- Source: %s\n", r.Source)
	fmt.Fprintf(&b, "- Machine: %s\n", r.Machine)
	fmt.Fprintf(&b, "- Tool: %s\n\n", r.Tool)
	b.WriteString(r.Table())
	b.WriteString("\nPercentiles are nearest-rank over the full sorted sample, so every figure is a sample " +
		"that was observed; with n < 100, p99 is the maximum. Raw samples: results.json.\n")
	for _, t := range r.Tables {
		b.WriteString("\n")
		b.WriteString(t.Markdown())
	}

	b.WriteString("\n## Series\n\n")
	for _, s := range r.Series {
		fmt.Fprintf(&b, "- **%s**: %s\n", s.Name, s.Description)
		if s.Skipped != "" {
			fmt.Fprintf(&b, "  - skipped: %s\n", s.Skipped)
		}
		if len(s.Failures) > 0 {
			fmt.Fprintf(&b, "  - %d attempt(s) failed:\n", len(s.Failures))
			for _, line := range condense(s.Failures, 5) {
				fmt.Fprintf(&b, "    - %s\n", line)
			}
		}
		for _, line := range condense(s.Notes, 5) {
			fmt.Fprintf(&b, "  - note: %s\n", line)
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	if len(r.Params) > 0 {
		b.WriteString("\n## Parameters\n\n| parameter | value |\n|---|---|\n")
		keys := make([]string, 0, len(r.Params))
		for k := range r.Params {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "| %s | %s |\n", k, paramText(r.Params[k]))
		}
	}
	if r.Source.Dirty {
		fmt.Fprintf(&b, "\n## Uncommitted changes at the time of the run\n\n```\n%s\n```\n", strings.Join(r.Source.Changes, "\n"))
	}
	return b.String()
}

// paramText renders a parameter value; strings as they are, the rest as JSON.
func paramText(v any) string {
	if s, ok := v.(string); ok {
		return strings.ReplaceAll(s, "|", `\|`)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.ReplaceAll(string(b), "|", `\|`)
}

// condense keeps the first max distinct lines of lines, each with how many
// times it occurred, and says how many more distinct lines there were.
func condense(lines []string, max int) []string {
	var order []string
	count := map[string]int{}
	for _, l := range lines {
		if count[l] == 0 {
			order = append(order, l)
		}
		count[l]++
	}
	var out []string
	for i, l := range order {
		if i == max {
			out = append(out, fmt.Sprintf("… and %d more distinct", len(order)-max))
			break
		}
		if count[l] > 1 {
			l = fmt.Sprintf("%s (×%d)", l, count[l])
		}
		out = append(out, l)
	}
	return out
}

// OneLine is s on one line (white space folded), cut at 200 bytes: an
// answer's body or a command's last words, for a note or an error.
func OneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
