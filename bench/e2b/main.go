// Command e2b times the E2B API from the SDK's side: the real e2b npm
// package (testdata/e2b, pinned) drives a sandstormd this command starts
// for itself, and every sample is the SDK's own call as a program would
// make it. The series are the issue's: create → first command (pooled
// from a warm template, and cold), commands.run('echo') round trip,
// files.write/read of 1 MiB and of 100 MiB, connect from each tier (and
// the first command after it); and what envd costs a sandbox in memory and
// in its snapshot image (memory.go). Results go to
// bench/results/e2b-<date>-<commit>.
//
//	go run ./bench/e2b -n 20
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/sandbox/gvisor"
)

type config struct {
	bench.Flags
	n                      int
	runsc, subnet, gwPorts string
	nodeBin, platform      string
}

func main() {
	var c config
	fs := flag.NewFlagSet("e2b", flag.ContinueOnError)
	fs.IntVar(&c.n, "n", 20, "samples per series (write/read of 100 MiB: a quarter, at least 3; echo: 5×)")
	c.Register(fs)
	fs.StringVar(&c.runsc, "runsc", "bin/runsc", "runsc binary (make runsc)")
	fs.StringVar(&c.subnet, "subnet", "10.151.0.0/16", "sandbox subnet; must be unused on this host")
	fs.StringVar(&c.gwPorts, "gateway-ports", "31000-31999", "gateway port range")
	fs.StringVar(&c.nodeBin, "node", "node", "the Node.js binary that runs the SDK")
	fs.StringVar(&c.platform, "platform", gvisor.DefaultPlatform, "runsc platform of the raw runsc restore baseline (sandstormd runs with its default)")
	bench.ParseFlags(fs, func() error {
		if c.n < 1 {
			return bench.ErrBadArguments
		}
		return nil
	})
	bench.Main("e2b", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

// descriptions of the series the script measures, by name.
var descriptions = map[string]string{
	"create-pooled→first-run":         "Sandbox.create('base') from the warm pool, then commands.run('true') answered (SDK side)",
	"create-cold→first-run":           "Sandbox.create of base without a warm image (runsc run of envd as init), then commands.run('true') answered",
	"run-echo":                        "commands.run('echo hi') round trip on a hot sandbox",
	"write-1MiB":                      "files.write of 1 MiB (multipart upload through the master and the node)",
	"read-1MiB":                       "files.read of 1 MiB as bytes",
	"write-100MiB":                    "files.write of 100 MiB",
	"read-100MiB":                     "files.read of 100 MiB as bytes",
	"read-100MiB-stream":              "files.read of 100 MiB as a stream, consumed chunk by chunk",
	"raw-echo-in-sandbox":             "baseline of run-echo: bash -l -c 'echo hi' started inside the sandbox by Python's subprocess, as user (no API, network or SDK)",
	"fetch-formdata-up-100MiB":        "the same multipart upload by Node's own fetch (no SDK), through sandstormd to envd as the SDK sends it",
	"baseline-fetch-up-100MiB":        "baseline of write-100MiB: Node's fetch POSTing 100 MiB over TLS to a loopback server that discards it",
	"baseline-fetch-down-100MiB":      "baseline of read-100MiB: Node's fetch of 100 MiB over TLS from a loopback server, as bytes",
	"pause→not-running":               "pause() (with memory: the snapshot tier) until isRunning() answers false",
	"connect-paused→first-run":        "Sandbox.connect of a paused sandbox, then commands.run('true') answered",
	"pause→not-running/heap1g":        "pause() of a sandbox whose process holds a 1 GiB heap (base-1g: 1536 MiB limit) until isRunning() answers false",
	"connect-paused→first-run/heap1g": "Sandbox.connect of that paused sandbox, then commands.run('true') answered",
	"createSnapshot":                  "createSnapshot() of a hot sandbox (a clone kept in the snapshot tier; the sandbox runs on)",
	"create-from-snapshot→first-run":  "Sandbox.create(snapshotId), then commands.run('true') answered (a clone of the snapshot, with its memory)",
	"fork-1":                          "fork() of a hot sandbox: the call, until the fork runs",
	"fork-10":                         "fork({count: 10}): the call, until the ten run",
	"port-from-snapshot":              "GET of port 8000 (python -m http.server) of a sandbox the API put in the snapshot tier: the request wakes it",
	"watch-write→event":               "watchDir: from a files.write's start to its write event",
}

func run(ctx context.Context, c config) (string, error) {
	script, err := filepath.Abs(filepath.Join(c.Repo, "testdata", "e2b", "bench.mjs"))
	if err != nil {
		return "", err
	}
	sdk := filepath.Join(filepath.Dir(script), "node_modules", "e2b", "package.json")
	var pkg struct{ Version string }
	if b, err := os.ReadFile(sdk); err != nil || json.Unmarshal(b, &pkg) != nil {
		return "", fmt.Errorf("the E2B SDK is not installed in testdata/e2b: npm ci --prefix testdata/e2b")
	}
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/e2b", Title: "The E2B SDK (e2b on npm) against sandstormd: create, commands, files, connect from each tier",
		Out: c.Out, Repo: c.Repo, Prefix: "e2b-", Runsc: c.runsc, Demo: "base", Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer br.Close()
	res, dir, work, absRunsc, rootfs, d, b := br.Results, br.Dir, br.Work, br.Runsc, br.Rootfs, br.Demo, br.Binary
	sd, err := bench.StartSDKDaemon(ctx, br, c.subnet, c.gwPorts)
	if err != nil {
		return "", err
	}
	defer sd.Stop()
	data, envdBin := sd.Data, filepath.Join(filepath.Dir(b.Path), "sandstorm-envd")
	res.Params = map[string]any{"n": c.n, "sandstormd_args": sd.Args, "sandstormd": b, "e2b_sdk": pkg.Version, "node": nodeVersion(ctx, c.nodeBin)}
	cl := sd.Client
	proc := api.Process{Args: d.Args, Env: d.Env, Envd: d.Envd}
	for _, t := range []api.TemplateRequest{
		{Name: "base", RootfsDir: rootfs, Process: proc, Ports: d.Ports, Warm: d.Warm},
		{Name: "base-cold", RootfsDir: rootfs, Process: proc, Ports: d.Ports},
		{Name: "base-1g", RootfsDir: rootfs, Process: proc, Ports: d.Ports, MemoryMiB: heapLimitMiB},
	} {
		if _, err := cl.CreateTemplate(ctx, t); err != nil {
			return "", fmt.Errorf("register %s: %w", t.Name, err)
		}
	}
	key, err := cl.CreateAPIKey(ctx, "bench")
	if err != nil {
		return "", err
	}
	token, err := os.ReadFile(filepath.Join(data, "pki", "api-token"))
	if err != nil {
		return "", err
	}
	apiURL := "https://" + sd.API
	baseURL, stopBaseline, err := baselineServer(data)
	if err != nil {
		return "", fmt.Errorf("baseline server: %w", err)
	}
	defer stopBaseline()
	env := append(sd.SDKEnv(key.Key), "N="+strconv.Itoa(c.n),
		"SANDSTORM_API="+apiURL, "SANDSTORM_TOKEN="+strings.TrimSpace(string(token)), "BASELINE_URL="+baseURL,
		"HEAP_MIB="+strconv.Itoa(heapMiB), "HEAP_N="+strconv.Itoa(heapN(c.n)))
	fmt.Fprintf(os.Stderr, "machine: %s\nrunning the SDK (e2b %s), n=%d…\n", res.Machine, pkg.Version, c.n)
	samples, err := runScript(ctx, c.nodeBin, script, env)
	if err != nil {
		return "", err
	}
	addSeries(res, samples)
	avoid, _ := netip.ParsePrefix(c.subnet)
	if err := measureRawRestore(ctx, res, absRunsc, c.platform, envdBin, rootfs, proc, avoid, c.n); err != nil {
		return "", fmt.Errorf("raw runsc restore: %w", err)
	}
	if err := measureRawHeap(ctx, res, absRunsc, c.platform, envdBin, rootfs, proc, avoid, heapN(c.n)); err != nil {
		return "", fmt.Errorf("raw runsc restore of a heap: %w", err)
	}
	res.Tables = append(res.Tables, goals(res))
	if err := measureMemory(ctx, res, cl, data, work, max(3, c.n/3)); err != nil {
		return "", fmt.Errorf("memory: %w", err)
	}
	return dir.Done(res)
}

// mibOf is N of a series that moves N MiB ("write-100MiB",
// "read-100MiB-stream", "baseline-fetch-up-100MiB"), 0 for another.
func mibOf(name string) int {
	m := mibRE.FindStringSubmatch(name)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

var mibRE = regexp.MustCompile(`^(?:write|read|fetch-formdata-up|baseline-fetch-(?:up|down))-(\d+)MiB`)

func describeConnect(name string) string {
	if tier, ok := strings.CutSuffix(strings.TrimPrefix(name, "connect-from-"), "/node-wake"); ok {
		return fmt.Sprintf("the node's own time for the wake from %s that a connect made (its last_wake_ms)", tier)
	}
	tier, first := strings.CutSuffix(strings.TrimPrefix(name, "connect-from-"), "→first-run")
	if first {
		return fmt.Sprintf("after a connect from %s: commands.run('true') answered", tier)
	}
	return fmt.Sprintf("Sandbox.connect of a sandbox the API put in %s (it wakes it)", tier)
}

// goals is the goals next to what this run measured, each beside
// its baseline from the same run, at p50 and p99.
func goals(res *bench.Results) *bench.Table {
	by := map[string]*bench.Series{}
	for _, s := range res.Series {
		by[s.Name] = s
	}
	at := func(name string, p99 bool) (float64, bool) {
		s := by[name]
		if s == nil || len(s.SamplesMs) == 0 {
			return 0, false
		}
		sum, err := bench.Summarize(s.SamplesMs)
		if err != nil {
			return 0, false
		}
		if p99 {
			return sum.P99Ms, true
		}
		return sum.P50Ms, true
	}
	ms := func(name string, p99 bool) string {
		if v, ok := at(name, p99); ok {
			return fmt.Sprintf("%.1f ms", v)
		}
		return "—"
	}
	rate := func(name string, mib int, p99 bool) string {
		if v, ok := at(name, p99); ok {
			return fmt.Sprintf("%.0f MB/s", float64(mib)*1.048576/(v/1000))
		}
		return "—"
	}
	plus := func(name, base string, p99 bool) string {
		a, ok1 := at(name, p99)
		b, ok2 := at(base, p99)
		if !ok1 || !ok2 {
			return "—"
		}
		return fmt.Sprintf("%+.1f ms", a-b)
	}
	ratio := func(name, base string, p99 bool) string {
		a, ok1 := at(name, p99)
		b, ok2 := at(base, p99)
		if !ok1 || !ok2 || b == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f ×", a/b)
	}
	t := &bench.Table{
		Title:       "The issue's goals, each beside its baseline in this run",
		Description: "p50 (p99). Rates are 100 MiB over the time; the baselines are what the same machine does with sandstormd out of the path.",
		Columns:     []string{"goal", "measured", "baseline in this run", "difference"},
	}
	both := func(f func(bool) string) string { return f(false) + " (" + f(true) + ")" }
	// vs is a goal's row: series name beside series base (label: what
	// the base is), and diff of the two, each at p50 (p99).
	vs := func(goal, name, label, base string, diff func(string, string, bool) string) []string {
		return []string{goal, both(func(p bool) string { return ms(name, p) }),
			label + ": " + both(func(p bool) string { return ms(base, p) }),
			both(func(p bool) string { return diff(name, base, p) })}
	}
	t.Rows = [][]string{
		{"pooled create → first command ≤ 100 ms", both(func(p bool) string { return ms("create-pooled→first-run", p) }), "", ""},
		vs("commands.run('echo') ≤ 10 ms", "run-echo", "in-sandbox bash -l -c", "raw-echo-in-sandbox", plus),
		{"files.write of 100 MiB ≥ 200 MB/s", both(func(p bool) string { return rate("write-100MiB", 100, p) }),
			"Node's fetch up: " + both(func(p bool) string { return rate("baseline-fetch-up-100MiB", 100, p) }),
			"the same multipart by Node's fetch through sandstormd, no SDK: " + both(func(p bool) string { return rate("fetch-formdata-up-100MiB", 100, p) })},
		{"files.read of 100 MiB ≥ 200 MB/s", both(func(p bool) string { return rate("read-100MiB", 100, p) }) + "; stream " + both(func(p bool) string { return rate("read-100MiB-stream", 100, p) }),
			"Node's fetch down: " + both(func(p bool) string { return rate("baseline-fetch-down-100MiB", 100, p) }), ""},
		vs("connect from snapshot ≤ raw runsc restore + 15 ms", "connect-from-snapshot", "runsc restore → envd answers", "raw-restore/base/client", plus),
		vs("(the node's own wake from snapshot)", "connect-from-snapshot/node-wake", "runsc restore alone", "raw-restore/base/runsc", plus),
		vs("connect of a paused sandbox → first command ≤ 1.1 × raw restore", "connect-paused→first-run", "runsc restore → envd answers", "raw-restore/base/client", ratio),
		vs("pause → isRunning() false ≤ 1.1 × raw checkpoint", "pause→not-running", "runsc checkpoint alone", "raw-checkpoint/base/runsc", ratio),
		vs("pause, 1 GiB heap → isRunning() false ≤ 1.1 × raw checkpoint", "pause→not-running/heap1g", "runsc checkpoint alone", "raw-checkpoint/heap1g/runsc", ratio),
		vs("connect of it paused → first command ≤ 1.1 × raw restore", "connect-paused→first-run/heap1g", "runsc restore → envd answers", "raw-restore/heap1g/client", ratio),
		vs("create from a snapshot → first command ≤ a warm-template create", "create-from-snapshot→first-run", "pooled create → first command", "create-pooled→first-run", ratio),
		vs("a port of a snapshotted sandbox ≤ raw restore + 15 ms", "port-from-snapshot", "runsc restore → envd answers", "raw-restore/base/client", plus),
		{"watch: write → event ≤ 10 ms p50", both(func(p bool) string { return ms("watch-write→event", p) }), "", ""},
		{"(fork of 1; of 10)", both(func(p bool) string { return ms("fork-1", p) }) + "; " + both(func(p bool) string { return ms("fork-10", p) }), "", ""},
	}
	return t
}

// heapN is how many samples the 1 GiB heap's series take: each is a
// checkpoint or restore of a gigabyte.
func heapN(n int) int { return max(3, n/4) }

func median(ms []float64) float64 {
	s := append([]float64(nil), ms...)
	sort.Float64s(s)
	return s[(len(s)-1)/2] // nearest rank, as internal/bench
}

func nodeVersion(ctx context.Context, bin string) string {
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// runScript runs the SDK's script and reads its report: the last line of
// its output, samples in ms by series name.
func runScript(ctx context.Context, nodeBin, script string, env []string) (map[string][]float64, error) {
	cmd := exec.CommandContext(ctx, nodeBin, script)
	cmd.Dir, cmd.Env, cmd.Stderr = filepath.Dir(script), env, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", script, err)
	}
	var samples map[string][]float64
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &samples); err != nil {
		return nil, fmt.Errorf("the script's report: %w", err)
	}
	return samples, nil
}

// addSeries records the script's samples as series, in name order, with
// each transfer's median throughput noted.
func addSeries(res *bench.Results, samples map[string][]float64) {
	names := make([]string, 0, len(samples))
	for name := range samples {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		desc := descriptions[name]
		if desc == "" {
			desc = describeConnect(name)
		}
		s := res.AddSeries(name, desc, "")
		for _, ms := range samples[name] {
			s.Add(ms)
		}
		if m := mibOf(name); m > 0 && len(s.SamplesMs) > 0 {
			med := median(s.SamplesMs)
			s.Note("median %.0f MB/s (%d MiB in %.1f ms)", float64(m)*1.048576/(med/1000), m, med)
		}
	}
}
