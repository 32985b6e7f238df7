package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/internal/bench"
)

// record runs one benchmark into a results directory of its own,
// <out>/<prefix>-<date>-<commit>: the machine, the source's commit, the
// load average before and after (this machine is shared and noisy), and
// whatever run recorded, written even when run stops early (the error is
// noted and returned).
func record(ctx context.Context, out, repoDir, prefix, title, description string, prepare func(*bench.Results),
	run func(context.Context, *bench.Results, func(string, ...any)) error) error {
	res := bench.NewResults(title, description)
	res.Machine = bench.CollectMachine(ctx)
	abs, _ := filepath.Abs(out)
	res.Source = bench.CollectSource(ctx, repoDir, abs)
	if prepare != nil {
		prepare(res)
	}
	noteLoad(res, "before")
	dir, err := bench.NewDir(out, prefix+"-"+res.DirName())
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "sam-bench: "+format+"\n", args...) }
	runErr := run(ctx, res, logf)
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
