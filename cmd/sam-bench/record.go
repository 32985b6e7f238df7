package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"sandstorm/internal/bench"
)

// resultsDir is a benchmark's --out (where its results directory goes)
// and --repo (the source tree it measures).
type resultsDir struct{ out, repo string }

// flags registers --out and --repo; the tree is read for repoFor.
func (r *resultsDir) flags(f *pflag.FlagSet, repoFor string) {
	f.StringVar(&r.out, "out", "bench/results", "where the results directory goes")
	f.StringVar(&r.repo, "repo", ".", "the source tree (for "+repoFor+")")
}

// record runs the benchmark "sam-bench <prefix>", run with cfg, into a
// results directory of its own, <out>/<prefix>-<date>-<commit>: the
// machine, the source's commit, the load average before and after (this
// machine is shared and noisy), and whatever run recorded, written even
// when run stops early (the error is noted and returned).
func record[C any](ctx context.Context, r resultsDir, prefix, description string, prepare func(*bench.Results),
	run func(context.Context, C, *bench.Results, func(string, ...any)) error, cfg C) error {
	res := bench.NewResults("sam-bench "+prefix, description)
	res.Machine = bench.CollectMachine(ctx)
	abs, _ := filepath.Abs(r.out)
	res.Source = bench.CollectSource(ctx, r.repo, abs)
	if prepare != nil {
		prepare(res)
	}
	noteLoad(res, "before")
	dir, err := bench.NewDir(r.out, prefix+"-"+res.DirName())
	if err != nil {
		return err
	}
	return finish(res, dir, run(ctx, cfg, res, progressf))
}

// progressf is the benchmarks' progress, on stderr.
func progressf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sam-bench: "+format+"\n", args...)
}

// finish notes how the run ended (runErr, and the load average after it)
// and writes res into dir, even when the run stopped early: runErr, if
// any, is returned before an error of writing.
func finish(res *bench.Results, dir *bench.Dir, runErr error) error {
	if runErr != nil {
		res.Note("stopped: %v", runErr)
	}
	noteLoad(res, "after")
	res.Finished = time.Now().UTC()
	if err := dir.Write(res); err != nil {
		return err
	}
	path, err := dir.Finish()
	fmt.Fprintln(os.Stderr, "results:", path)
	if runErr != nil {
		return runErr
	}
	return err
}

func noteLoad(res *bench.Results, when string) {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.Note("load average %s the run (/proc/loadavg): %s", when, strings.TrimSpace(string(b)))
	}
}
