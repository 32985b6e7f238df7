package e2e

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestBaselinesBenchmark runs a tiny bench/baselines, with the two
// runtimes every machine here has — a plain process and sandstormd —
// three copies of the web demo each, so that the benchmark does not rot:
// its copies start and answer, its tables are written, and it leaves
// nothing running, nor its daemon's route. It asserts no timing.
func TestBaselinesBenchmark(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "baselines")
	if out, err := exec.Command("go", "build", "-o", bin, "sandstorm/bench/baselines").CombinedOutput(); err != nil {
		t.Fatalf("build bench/baselines: %v\n%s", err, out)
	}
	out := t.TempDir()
	repo, _ := filepath.Abs("../..")
	cmd := exec.Command(bin, "--runtimes", "process,sandstormd", "--programs", "web", "--max-copies", "3", "-n", "2",
		"--rootfs", "web="+webRootfs, "--sandstormd", sandstormdBin, "--runsc", runscBin, "--repo", repo, "--out", out,
		"--subnet", "10.152.0.0/16", "--gateway-ports", "21000-21049")
	cmd.Dir = repo
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench/baselines: %v\n%s", err, b)
	}
	files, _ := filepath.Glob(filepath.Join(out, "baselines-*", "results.json"))
	if len(files) != 1 {
		t.Fatalf("results: %v\n%s", files, b)
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Series []struct {
			Name      string    `json:"name"`
			SamplesMs []float64 `json:"samples_ms"`
			Failures  []string  `json:"failures"`
		} `json:"series"`
		Tables []struct {
			Title string          `json:"title"`
			Data  json.RawMessage `json:"data"`
		} `json:"tables"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	starts := 0
	for _, s := range res.Series {
		if strings.HasPrefix(s.Name, "start/web/") {
			starts++
			if len(s.SamplesMs) != 2 || len(s.Failures) != 0 {
				t.Errorf("%s: %d samples, failures %v, want 2 and none", s.Name, len(s.SamplesMs), s.Failures)
			}
		}
	}
	if starts != 4 {
		t.Errorf("%d start series, want 4 (2 runtimes, 2 polls)", starts)
	}
	var rows []struct {
		Runtime, Program string
		Copies, Answered int
		Err              string
	}
	for _, tb := range res.Tables {
		if strings.HasPrefix(tb.Title, "Density") {
			json.Unmarshal(tb.Data, &rows)
		}
	}
	if len(rows) != 2 {
		t.Fatalf("density rows %+v, want 2", rows)
	}
	for _, r := range rows {
		if r.Copies != 3 || r.Answered != 3 || r.Err != "" {
			t.Errorf("%+v: want 3 copies, all answering", r)
		}
	}
	// Nothing left: no copy's process, no daemon of the benchmark's.
	for port := 31000; port < 31003; port++ {
		if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			c.Close()
			t.Errorf("a copy still answers on port %d", port)
		}
	}
	if ps, _ := exec.Command("pgrep", "-f", "data-dir "+filepath.Join(os.TempDir(), "ssbaselines")).Output(); len(ps) > 0 {
		t.Errorf("a sandstormd of the benchmark's still runs: %s", ps)
	}
	// Nor the route its daemon's subnet leaves (the host as it was).
	if rt, _ := exec.Command("ip", "route", "show", "type", "unreachable", "10.152.0.0/16").Output(); strings.TrimSpace(string(rt)) != "" {
		t.Errorf("the benchmark's daemon left its subnet's route: %s", rt)
	}
}
