package bench

import (
	"fmt"
	"strings"
)

// Table is a small table a tool derives from its series, or from
// measurements that are not latencies (ratios between two series, memory
// per sandbox in MiB), kept in results.json and rendered in results.md
// after the summary table. Rows are the cells as shown; Data carries the
// same figures as numbers for tools, shaped as the tool chooses (it is
// not rendered).
type Table struct {
	Title       string     `json:"title"`
	Description string     `json:"description,omitempty"`
	Columns     []string   `json:"columns"`
	Rows        [][]string `json:"rows"`
	Data        any        `json:"data,omitempty"`
}

// Markdown renders t as a level-2 section: title, description, table. A
// row shorter than Columns is padded with empty cells; "|" in a cell is
// escaped.
func (t *Table) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n", t.Title)
	if t.Description != "" {
		fmt.Fprintf(&b, "%s\n\n", t.Description)
	}
	if len(t.Columns) == 0 {
		return b.String()
	}
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	b.WriteString("|")
	for _, c := range t.Columns {
		fmt.Fprintf(&b, " %s |", cell(c))
	}
	b.WriteString("\n|")
	for range t.Columns {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, row := range t.Rows {
		b.WriteString("|")
		for i := range t.Columns {
			v := ""
			if i < len(row) {
				v = row[i]
			}
			fmt.Fprintf(&b, " %s |", cell(v))
		}
		b.WriteString("\n")
	}
	return b.String()
}
