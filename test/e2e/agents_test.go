package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/bench"
	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/bench/sambench/agents"
)

// TestSamBenchAgents is a small run of sam-bench agents (issue 17's
// benchmark of many agents pushing at once), end to end: the real
// sam-bench binary starts a real sam-node and sandstormd, fills the node
// with three real runsc sandboxes, has two of them push through their own
// boundaries and then straight to sam-node, and removes everything it
// started. It checks what the results say happened — every request
// served, the servers' counters agreeing with the client's count — and
// that nothing is left behind. It asserts no timing.
func TestSamBenchAgents(t *testing.T) {
	samBench := filepath.Join(workDir, "sam-bench")
	if out, err := exec.Command("go", "build", "-o", samBench, "sandstorm/cmd/sam-bench").CombinedOutput(); err != nil {
		t.Fatalf("go build sam-bench: %v\n%s", err, out)
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	const pushers, requests = 2, 20
	cmd := exec.Command(samBench, "agents", "--max", "3", "--pushers", "2", "--requests", "20", "--rounds", "1",
		"--sandstormd", sandstormdBin, "--node-bin", samNodeBin, "--runsc", runscBin, "--repo", repo, "--out", out,
		"--subnet", pickSubnet(t), "--gateway-ports", pickGatewayPorts(t, 10), "--memory-reserve", "0", "--fill-for", "2m",
		"--settle-quiet", "1s", "--idle-cpu", "1s")
	start := time.Now()
	logs, err := cmd.CombinedOutput()
	t.Logf("sam-bench agents took %v:\n%s", time.Since(start).Round(time.Millisecond), logs)
	if err != nil {
		t.Fatalf("sam-bench agents: %v", err)
	}
	dirs, _ := filepath.Glob(filepath.Join(out, "agents-*"))
	if len(dirs) != 1 || strings.HasSuffix(dirs[0], ".tmp") {
		t.Fatalf("results directories %v, want one, finished", dirs)
	}
	res, err := bench.ReadResults(filepath.Join(dirs[0], "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Params["fill_created"]; got != float64(3) {
		t.Errorf("fill_created %v, want 3 (stopped by %v)", got, res.Params["fill_stopped_by"])
	}
	if got := res.Params["fill_stopped_by"]; got != "--max 3 reached" {
		t.Errorf("fill stopped by %q", got)
	}
	var pushes []agents.Push
	b, _ := json.Marshal(res.Params["pushes"])
	if err := json.Unmarshal(b, &pushes); err != nil {
		t.Fatal(err)
	}
	routes := map[string]bool{}
	for _, p := range pushes {
		routes[p.Route] = true
		if p.Agents != pushers || p.Requests != pushers*requests || p.OK != p.Requests || p.Starved != 0 {
			t.Errorf("%s push: %d agents, %d requests, %d served, %d starved; failures %v", p.Route, p.Agents, p.Requests, p.OK, p.Starved, p.Failures)
		}
		want := 1
		if p.Route == sambench.RouteBoundary {
			want = 3 // sam-node's count, the boundaries' forwarded requests, no new flow
		}
		if len(p.Counters) != want {
			t.Errorf("%s push: counters %+v", p.Route, p.Counters)
		}
		for _, c := range p.Counters {
			if !c.Agree {
				t.Errorf("%s push: %s moved by %v, the client counted %d", p.Route, c.Series, c.Delta, c.Client)
			}
		}
	}
	if !routes[sambench.RouteBoundary] || !routes[sambench.RouteBaseline] {
		t.Errorf("pushes by route: %v", routes)
	}
	for _, f := range []string{"results.md", "push-1-boundary.csv.gz", "push-1-baseline.csv.gz", "sandstormd.log", "sam-node.log"} {
		if _, err := os.Stat(filepath.Join(dirs[0], f)); err != nil {
			t.Error(err)
		}
	}

	// Nothing left behind: its cleanup note names the work directory it
	// removed, and no process still names that directory.
	var work string
	for _, n := range res.Notes {
		if rest, ok := strings.CutPrefix(n, "cleanup: every sandbox deleted"); ok {
			work = rest[strings.LastIndex(rest, " /")+1 : strings.LastIndex(rest, " removed")]
		}
	}
	if work == "" {
		t.Fatalf("no cleanup note in %q", res.Notes)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("%s still there (%v)", work, err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), work) {
			t.Errorf("%s: %q still runs", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
