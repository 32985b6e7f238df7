// Command interpreter times E2B's code interpreter against sandstormd
// from the SDK's side (issue 33's benchmark): the published
// @e2b/code-interpreter (testdata/e2b-code-interpreter, pinned) drives a
// sandstormd this command starts, and every sample is the SDK's own call
// as a program makes it: runCode('1+1') round trip (Python, JavaScript,
// Java), a matplotlib chart, pooled create → first runCode result (goal
// ≤ 150 ms at p50), a JavaScript and a Java kernel's first cell, and a
// kernel's variable read after pause and connect. Results go to
// bench/results/interpreter-<date>-<commit>.
//
//	go run ./bench/interpreter -n 20
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/bench"
)

type config struct {
	bench.Flags
	n                      int
	runsc, subnet, gwPorts string
	nodeBin                string
}

func main() {
	var c config
	fs := flag.NewFlagSet("interpreter", flag.ContinueOnError)
	fs.IntVar(&c.n, "n", 20, "samples per series (runCode('1+1'): 5×)")
	c.Register(fs)
	fs.StringVar(&c.runsc, "runsc", "bin/runsc", "runsc binary (make runsc)")
	fs.StringVar(&c.subnet, "subnet", "10.152.0.0/16", "sandbox subnet; must be unused on this host")
	fs.StringVar(&c.gwPorts, "gateway-ports", "21000-21999", "gateway port range")
	fs.StringVar(&c.nodeBin, "node", "node", "the Node.js binary that runs the SDK")
	bench.ParseFlags(fs, func() error {
		if c.n < 1 {
			return bench.ErrBadArguments
		}
		return nil
	})
	bench.Main("interpreter", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

var descriptions = map[string]string{
	"create-pooled→first-result":   "Sandbox.create() of code-interpreter-v1 from its warm pool (a restored, running kernel), then runCode('1+1') answered (SDK side)",
	"runCode-1+1":                  "runCode('1+1') round trip on a hot sandbox's default context",
	"runCode-chart":                "runCode of a matplotlib line chart with plt.show(), until its PNG result is in",
	"runCode-js-first":             "the first runCode('1+1', {language: 'js'}) of a pooled sandbox: its default JavaScript kernel starts then (ipykernel, Node.js, TypeScript's parser)",
	"runCode-js-1+1":               "runCode('1+1', {language: 'js'}) round trip on a hot sandbox's default JavaScript context",
	"runCode-java-first":           "the first runCode('1+1', {language: 'java'}) of a pooled sandbox: a Java context's kernel starts then (ipykernel, a JVM, JShell)",
	"runCode-java-1+1":             "runCode('1+1', {language: 'java'}) round trip on a hot sandbox's Java context",
	"pause":                        "pause() (the snapshot tier, the kernel's memory kept)",
	"connect-paused":               "connect() of the paused sandbox (a restore)",
	"connect-paused→variable-read": "connect() of the paused sandbox, then runCode reading a variable set before the pause",
}

func run(ctx context.Context, c config) (string, error) {
	script, err := filepath.Abs(filepath.Join(c.Repo, "testdata", "e2b-code-interpreter", "bench.mjs"))
	if err != nil {
		return "", err
	}
	var pkg struct{ Version string }
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(script), "node_modules", "@e2b", "code-interpreter", "package.json")); err != nil || json.Unmarshal(b, &pkg) != nil {
		return "", fmt.Errorf("the code interpreter SDK is not installed: npm ci --prefix testdata/e2b-code-interpreter")
	}
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/interpreter", Title: "E2B's code interpreter SDK against sandstormd: runCode, charts, pooled create, pause and connect",
		Out: c.Out, Repo: c.Repo, Prefix: "interpreter-", Runsc: c.runsc, Demo: "code-interpreter", Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer br.Close()
	res, dir, d := br.Results, br.Dir, br.Demo
	sd, err := bench.StartSDKDaemon(ctx, br, c.subnet, c.gwPorts)
	if err != nil {
		return "", err
	}
	defer sd.Stop()
	res.Params = map[string]any{"n": c.n, "sandstormd_args": sd.Args, "sandstormd": br.Binary, "code_interpreter_sdk": pkg.Version}
	if _, err := sd.Client.CreateTemplate(ctx, api.TemplateRequest{Name: "code-interpreter-v1", RootfsDir: br.Rootfs,
		Process: api.Process{Args: d.Args, Env: d.Env, Envd: d.Envd}, Ports: d.Ports, Warm: d.Warm}); err != nil {
		return "", fmt.Errorf("register code-interpreter-v1: %w", err)
	}
	key, err := sd.Client.CreateAPIKey(ctx, "bench")
	if err != nil {
		return "", err
	}
	env := append(sd.SDKEnv(key.Key), "N="+strconv.Itoa(c.n))
	fmt.Fprintf(os.Stderr, "machine: %s\nrunning @e2b/code-interpreter %s, n=%d…\n", res.Machine, pkg.Version, c.n)
	cmd := exec.CommandContext(ctx, c.nodeBin, script)
	cmd.Dir, cmd.Env, cmd.Stderr = filepath.Dir(script), env, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("node %s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var samples map[string][]float64
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &samples); err != nil {
		return "", fmt.Errorf("the script's report: %w", err)
	}
	names := make([]string, 0, len(samples))
	for n := range samples {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := res.AddSeries(n, descriptions[n], "")
		for _, ms := range samples[n] {
			s.Add(ms)
		}
	}
	if s, err := bench.Summarize(samples["create-pooled→first-result"]); err == nil {
		verdict := "meets"
		if s.P50Ms > 150 {
			verdict = "misses"
		}
		res.Note("pooled create → first runCode result: %.1f ms at p50, %.1f at p99; %s the goal of ≤ 150 ms at p50", s.P50Ms, s.P99Ms, verdict)
	}
	return dir.Done(res)
}
