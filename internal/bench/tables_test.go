package bench

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestTableMarkdown(t *testing.T) {
	tb := &Table{
		Title:       "Ratios",
		Description: "sandstormd over raw runsc",
		Columns:     []string{"what", "a|b", "ratio"},
		Rows:        [][]string{{"start", "1", "1.10"}, {"short"}},
		Data:        map[string]float64{"start": 1.1},
	}
	got := tb.Markdown()
	want := "## Ratios\n\nsandstormd over raw runsc\n\n| what | a\\|b | ratio |\n|---|---|---|\n| start | 1 | 1.10 |\n| short |  |  |\n"
	if got != want {
		t.Errorf("Markdown =\n%s\nwant\n%s", got, want)
	}
}

func TestResultsMarkdownRendersTables(t *testing.T) {
	r := NewResults("bench/test", "Test run")
	r.AddSeries("hot/web/client", "GET /", "").Add(2)
	if strings.Contains(r.Markdown(), "## Ratios") {
		t.Fatal("a table rendered before any was added")
	}
	r.Tables = append(r.Tables, &Table{Title: "Ratios", Columns: []string{"x"}, Rows: [][]string{{"1"}}})
	md := r.Markdown()
	table, ratios := strings.Index(md, "| hot/web/client |"), strings.Index(md, "## Ratios")
	if table < 0 || ratios < table || ratios > strings.Index(md, "## Series") {
		t.Errorf("the table should come after the summary table and before the series:\n%s", md)
	}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(js, &back); err != nil || len(back.Tables) != 1 || back.Tables[0].Rows[0][0] != "1" {
		t.Errorf("tables did not survive JSON: %v %+v", err, back.Tables)
	}
}
