package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestResultsWriteAndRead(t *testing.T) {
	r := NewResults("bench/test", "Test run")
	r.Started = time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	r.Source = Source{Commit: "0123456789abcdef0123456789abcdef01234567"}
	r.Params["n"] = 3
	r.Params["poll"] = "10ms"
	a := r.AddSeries("hot/web/client", "GET / through the gateway", "3.8 ms")
	for _, v := range []float64{3, 1, 2} {
		a.Add(v)
	}
	a.Fail("HTTP 503")
	a.Fail("HTTP 503")
	r.AddSeries("empty", "never measured", "").Skipped = "not supported"

	if got := r.DirName(); got != "2026-11-30-0123456" {
		t.Errorf("DirName = %q", got)
	}
	base := t.TempDir()
	d, err := NewDir(base, r.DirName())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(d.Path, ".tmp") {
		t.Errorf("in-progress dir %q lacks .tmp", d.Path)
	}
	if err := d.Write(r); err != nil {
		t.Fatal(err)
	}
	final, err := d.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if final != filepath.Join(base, "2026-11-30-0123456") {
		t.Errorf("final = %q", final)
	}
	// A second run with the same name gets a suffix, not the same dir.
	d2, err := NewDir(base, r.DirName())
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(base, "2026-11-30-0123456-2.tmp"); d2.Path != want {
		t.Errorf("second dir = %q, want %q", d2.Path, want)
	}

	got, err := ReadResults(filepath.Join(final, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := got.Series[0]
	if s.Summary == nil || *s.Summary != (Summary{N: 3, MinMs: 1, P50Ms: 2, P99Ms: 3, MaxMs: 3}) {
		t.Errorf("summary = %+v", s.Summary)
	}
	if len(s.SamplesMs) != 3 || s.SamplesMs[0] != 3 {
		t.Errorf("raw samples not kept in order: %v", s.SamplesMs)
	}
	if got.Series[1].SamplesMs == nil {
		t.Errorf("empty series has null samples")
	}
	md, err := os.ReadFile(filepath.Join(final, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| hot/web/client | 3 | 2.00 | 3.00 | 1.00 | 3.00 | 3.8 ms | 2 |",
		"| empty | 0 | — | — | — | — | — |  |",
		"HTTP 503 (×2)",
		"skipped: not supported",
		"| n | 3 |",
		"| poll | 10ms |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
}

// Done is a last Write, stamped finished, then Finish.
func TestDirDone(t *testing.T) {
	base := t.TempDir()
	r := NewResults("bench/test", "Test")
	d, err := NewDir(base, "run")
	if err != nil {
		t.Fatal(err)
	}
	final, err := d.Done(r)
	if err != nil || final != filepath.Join(base, "run") {
		t.Fatalf("Done = %q, %v", final, err)
	}
	got, err := ReadResults(filepath.Join(final, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Finished.IsZero() || got.Finished.Before(got.Started) {
		t.Errorf("finished %v, started %v", got.Finished, got.Started)
	}
}

func TestParseCPUInfo(t *testing.T) {
	in := "processor\t: 0\nmodel name\t: AMD EPYC 9K65\nflags\t: x\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9K65\n"
	model, cores := parseCPUInfo(in)
	if model != "AMD EPYC 9K65" || cores != 2 {
		t.Errorf("parseCPUInfo = %q, %d", model, cores)
	}
	if got := parseMemTotalMiB("MemTotal:       24683520 kB\nMemFree: 1 kB\n"); got != 24105 {
		t.Errorf("parseMemTotalMiB = %d", got)
	}
	if got := parseOSRelease("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"); got != "Debian GNU/Linux 12 (bookworm)" {
		t.Errorf("parseOSRelease = %q", got)
	}
}

func TestCollectSource(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is needed to record the commit of a results file: apt-get install -y git")
	}
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	run("init", "-q")
	os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644)
	run("add", "a")
	run("commit", "-q", "-m", "a")
	ctx := context.Background()
	s := CollectSource(ctx, dir)
	if len(s.Commit) != 40 || s.Dirty || s.Error != "" {
		t.Fatalf("clean tree: %+v", s)
	}
	os.MkdirAll(filepath.Join(dir, "bench", "results", "x"), 0o755)
	os.WriteFile(filepath.Join(dir, "bench", "results", "x", "r.json"), nil, 0o644)
	if s := CollectSource(ctx, dir, filepath.Join(dir, "bench", "results")); s.Dirty {
		t.Errorf("ignored results dir made the tree dirty: %+v", s)
	}
	if s := CollectSource(ctx, dir, "bench/results"); s.Dirty {
		t.Errorf("ignored (relative) results dir made the tree dirty: %+v", s)
	}
	os.WriteFile(filepath.Join(dir, "a"), []byte("b"), 0o644)
	s = CollectSource(ctx, dir, "bench/results")
	if !s.Dirty || len(s.Changes) != 1 || s.Changes[0] != " M a" {
		t.Errorf("modified file: %+v", s)
	}
	if s := CollectSource(ctx, t.TempDir()); s.Error == "" || s.Commit != "" {
		t.Errorf("not a repository: %+v", s)
	}
}

func TestRounds(t *testing.T) {
	s := []float64{1, 2, 3, 4, 5}
	for _, c := range []struct {
		ends []int
		want [][]float64
	}{
		{nil, [][]float64{{1, 2, 3, 4, 5}}},
		{[]int{2, 5}, [][]float64{{1, 2}, {3, 4, 5}}},
		{[]int{2, 2, 5}, [][]float64{{1, 2}, {}, {3, 4, 5}}},
		{[]int{2}, [][]float64{{1, 2}, {3, 4, 5}}}, // a round cut short
		{[]int{2, 9}, [][]float64{{1, 2}, {3, 4, 5}}},
	} {
		got := Rounds(s, c.ends)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Rounds(%v, %v) = %v, want %v", s, c.ends, got, c.want)
		}
	}
	var sr Series
	sr.Add(1)
	sr.EndRound()
	sr.Add(2)
	sr.Add(3)
	sr.EndRound()
	if fmt.Sprint(sr.RoundEnds) != "[1 3]" {
		t.Errorf("RoundEnds %v", sr.RoundEnds)
	}
}

func TestResultsP50(t *testing.T) {
	r := NewResults("t", "t")
	s := r.AddSeries("a", "", "")
	for _, v := range []float64{5, 1, 3, 2} {
		s.Add(v)
	}
	r.AddSeries("empty", "", "")
	// Nearest rank over 4 samples: the 2nd smallest, as the tables.
	for name, want := range map[string]float64{"a": 2, "empty": 0, "none": 0} {
		if got := r.P50(name); got != want {
			t.Errorf("P50(%q) = %v, want %v", name, got, want)
		}
	}
}
