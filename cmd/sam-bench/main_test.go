package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/cli"
)

// startNode serves /v1/models on a Unix socket to callers that name
// themselves agent-a, as the boundary would.
func startNode(t *testing.T) (socket string, hits *atomic.Int64) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket = filepath.Join(dir, "node.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	hits = new(atomic.Int64)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != "/v1/models" || r.Header.Get("X-Sam-Principal") != "agent-a" {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return socket, hits
}

func execute(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := rootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func TestRunAndReport(t *testing.T) {
	socket, hits := startNode(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "results", "step2.json")
	_, stderr, err := execute(t, "run", "--target-unix", socket, "--target", "http://localhost/v1/models",
		"--header", "X-Sam-Principal=agent-a", "--requests", "30", "--concurrency", "3", "--warmup", "4",
		"--label", "step=2", "--rss-pids", strconv.Itoa(os.Getpid()), "--out", a)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr)
	}
	for _, want := range []string{"baseline route, reused flows, allow mode", "main: 30 requests, 30 ok, 0 failed", "warmup: 4 requests, 4 ok"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("summary lacks %q:\n%s", want, stderr)
		}
	}
	if hits.Load() != 34 {
		t.Errorf("node hits %d, want 34", hits.Load())
	}
	obs, err := sambench.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	if obs.Main.OK != 30 || obs.Warmup.OK != 4 || obs.Label != "step=2" || len(obs.Processes) != 1 {
		t.Errorf("observations: main %+v warmup %+v label %q procs %+v", obs.Main.OK, obs.Warmup.OK, obs.Label, obs.Processes)
	}

	// No --out: the observations go to stdout; new flows; a 'K: V' header;
	// a path the node refuses, so every request fails and is counted by kind.
	stdout, stderr, err := execute(t, "run", "-q", "--target-unix", socket, "--target", "http://localhost/elsewhere",
		"--header", "X-Sam-Principal: agent-a", "--requests", "10", "--concurrency", "2", "--warmup", "0",
		"--new-flow", "--label", "step=16")
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr)
	}
	if stderr != "" {
		t.Errorf("-q printed %q", stderr)
	}
	var b sambench.Observations
	if err := json.Unmarshal([]byte(stdout), &b); err != nil {
		t.Fatalf("stdout is not observations: %v\n%.300s", err, stdout)
	}
	if b.Main.Failures["http 403"] != 10 || b.Main.OK != 0 || b.Flow != "new" || b.Warmup != nil {
		t.Errorf("stdout observations: %+v, flow %s", b.Main.Failures, b.Flow)
	}
	bPath := filepath.Join(dir, "results", "step16.json")
	if err := os.WriteFile(bPath, []byte(stdout), 0o644); err != nil {
		t.Fatal(err)
	}

	md, stderr, err := execute(t, "report", bPath, a)
	if err != nil {
		t.Fatalf("report: %v\n%s", err, stderr)
	}
	i2, i16 := strings.Index(md, "| step=2 | baseline | reused | allow | 30 | 0 |"), strings.Index(md, "| step=16 | baseline | new | allow | 0 | 10 | — | — |")
	if i2 < 0 || i16 < 0 || i16 < i2 {
		t.Errorf("report rows missing or out of order:\n%s", md)
	}
	if !strings.Contains(md, "- Machine: ") || !strings.Contains(md, "step=16 (step16.json), main: http 403 ×10") {
		t.Errorf("report:\n%s", md)
	}
}

func TestRunFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--target", "http://x/"},
		{"run", "--socket", "/nonexistent.sock", "--target-unix", "/x.sock", "--target", "http://x/"},
		{"run", "--socket", "/nonexistent.sock", "--target", "http://x/", "--header", "novalue"},
		{"run", "--socket", "/nonexistent.sock", "--target", "http://x/", "--label", "=v"},
		{"run", "--socket", "/nonexistent.sock", "--target", "http://x/", "--rss-process-name", "no-such-process-here"},
		{"report"},
		{"report", "/nonexistent/x.json"},
	} {
		if _, _, err := execute(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestAgentsUsageErrors: a bad shape is a usage error (exit status 2),
// found before anything is built or started.
func TestAgentsUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"agents", "--max", "3", "--pushers", "4"},
		{"agents", "--in-flight", "0"},
		{"agents", "--memory-mib", "8"},
		{"agents", "--fill-for", "0s"},
	} {
		_, _, err := execute(t, args...)
		var u cli.UsageError
		if !errors.As(err, &u) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
