package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench"
	"sandstorm/internal/cli"
	"sandstorm/internal/sambench"
)

func meshCmd() *cobra.Command {
	var (
		cfg     sambench.MeshConfig
		out     string
		repoDir string
	)
	cmd := &cobra.Command{
		Use:   "mesh [flags]",
		Short: "Measure a cross-node call's overhead over a local one, on a loopback mesh",
		Long: `sam-bench mesh starts, in this process and on 127.0.0.1, a router and two
members: node B serving a model from a real OpenAI-protocol server, node A
serving nothing and using B's through the mesh (libp2p streams, credentials
checked on both ends). It then sends --requests chat completions each way,
interleaved: to the provider directly, through B (local), and through A
(cross-node). Results (machine, commit, raw samples) go to
--out/mesh-<date>-<commit>.`,
		Example: `  sam-bench mesh --requests 2000`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Requests < 1 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--requests: at least 1")}
			}
			ctx := cmd.Context()
			res := bench.NewResults("sam-bench mesh", "A model served by another member against the same model served locally, on a loopback mesh")
			res.Machine = bench.CollectMachine(ctx)
			abs, _ := filepath.Abs(out)
			res.Source = bench.CollectSource(ctx, repoDir, abs)
			dir, err := bench.NewDir(out, "mesh-"+res.DirName())
			if err != nil {
				return err
			}
			logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "sam-bench: "+format+"\n", args...) }
			runErr := sambench.Mesh(ctx, cfg, res, logf)
			if runErr != nil {
				res.Note("stopped: %v", runErr)
			}
			res.Summarize()
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
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Requests, "requests", 1000, "requests per series")
	f.StringVar(&out, "out", "bench/results", "where the results directory goes")
	f.StringVar(&repoDir, "repo", ".", "the source tree (for the commit)")
	return cmd
}
