package sambench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/internal/bench/sambench/sambenchtest"
)

func TestReportFromTwoRuns(t *testing.T) {
	nd := sambenchtest.StartNode(t, "agent-a")
	bx := sambenchtest.StartBoundary(t, nd.Socket)
	dir := t.TempDir()
	nd.Mode.Store(sambenchtest.ModeFlaky)

	// Through the boundary, new flows, with its counters scraped and this
	// process standing in for the boundary's RSS.
	a, err := Run(context.Background(), Config{
		Socket: bx.Socket, Target: meshURL, Requests: 20, Concurrency: 2, Warmup: 3, NewFlow: true,
		Scrape: []string{bx.MetricsURL}, RSSPids: []int{os.Getpid()}, Labels: map[string]string{"step": "16"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The baseline, and a deny run through the boundary.
	nd.Mode.Store(sambenchtest.ModeOK)
	b, err := Run(context.Background(), Config{
		TargetUnix: nd.Socket, Target: "http://localhost/v1/models", Requests: 20, Concurrency: 2,
		Headers: []Header{{"X-Sam-Principal", "agent-a"}}, Labels: map[string]string{"step": "2"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Run(context.Background(), Config{
		Socket: bx.Socket, Target: "http://elsewhere.example/", Requests: 20, Concurrency: 2, ExpectDeny: true,
		Scrape: []string{bx.MetricsURL}, Labels: map[string]string{"step": "2", "case": "deny"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for name, o := range map[string]*Observations{"z-step16.json": a, "a-step2.json": b, "m-deny.json": c} {
		p := filepath.Join(dir, "results", name)
		if err := WriteFile(p, o); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	back, err := ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if back.Main == nil || len(back.Main.Samples) != 20 {
		t.Fatalf("read back %+v", back.Main)
	}

	md, err := Report(files)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + md)
	again, _ := Report([]string{files[2], files[0], files[1]})
	if again != md {
		t.Errorf("report depends on the order of its arguments")
	}
	for _, want := range []string{
		"# sam-bench\n",
		"- Machine: " + a.Machine.String(),
		"- Source: " + a.Source.String(),
		"| label | route | flow | mode | ok | failed | p50 ms | p99 ms |",
		"| step=2 | baseline | reused | allow | 20 | 0 | ",
		"| step=16 | boundary | new | allow | 10 | 10 | ",
		"| case=deny,step=2 | boundary | reused | deny | 20 | 0 | ",
		"## Warmup",
		"step=16 (z-step16.json), main: http 500 ×10",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	rows := tableRows(md)
	if len(rows) != 3 {
		t.Fatalf("%d table rows:\n%s", len(rows), md)
	}
	// Ordered by label: "case=deny,step=2" < "step=2" < "step=16".
	for i, prefix := range []string{"| case=deny,step=2 |", "| step=2 |", "| step=16 |"} {
		if !strings.HasPrefix(rows[i], prefix) {
			t.Errorf("row %d = %q, want it to start %q", i, rows[i], prefix)
		}
	}
	cells := strings.Split(rows[0], "|")
	// | label | route | flow | mode | ok | failed | p50 | p99 | req/s | adm | refusals/s | refused (boundary) | leaked | RSS | file |
	if got := strings.TrimSpace(cells[11]); got == "—" || got == "0" {
		t.Errorf("deny run: refusals/s %q", got)
	}
	if got := strings.TrimSpace(cells[12]); got != "20" {
		t.Errorf("deny run: boundary refused %q, want 20", got)
	}
	if got := strings.TrimSpace(cells[13]); got != "0" {
		t.Errorf("deny run: leaked %q", got)
	}
	cells = strings.Split(rows[2], "|")
	if got := strings.TrimSpace(cells[10]); got == "—" {
		t.Errorf("new-flow run through the boundary has no admission time")
	}
	if got := strings.TrimSpace(cells[14]); got == "—" {
		t.Errorf("RSS not reported")
	}

	if _, err := Report(nil); err == nil {
		t.Errorf("empty report accepted")
	}
	junk := filepath.Join(dir, "junk.json")
	os.WriteFile(junk, []byte(`{"tool":"other"}`), 0o644)
	if _, err := Report([]string{junk}); err == nil {
		t.Errorf("a file that is not sam-bench's was accepted")
	}
}

// tableRows returns the data rows of the first table in md.
func tableRows(md string) []string {
	var rows []string
	in := false
	for line := range strings.Lines(md) {
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, "|---"):
			in = true
		case in && strings.HasPrefix(line, "|"):
			rows = append(rows, line)
		case in:
			return rows
		}
	}
	return rows
}

func TestNaturalCompare(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"step=2", "step=16", -1},
		{"step=16", "step=2", 1},
		{"step=8", "step=8", 0},
		{"step=08", "step=9", -1},
		{"", "a", -1},
		{"a", "b", -1},
		{"step=2,x", "step=2", 1},
		{"n64", "n128", -1},
	} {
		if got := naturalCompare(c.a, c.b); got != c.want {
			t.Errorf("naturalCompare(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
