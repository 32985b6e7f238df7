package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/cli"
)

func meshCmd() *cobra.Command {
	var (
		cfg sambench.MeshConfig
		out resultsDir
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
			return record(cmd.Context(), out, "mesh",
				"A model served by another member against the same model served locally, on a loopback mesh", nil, sambench.Mesh, cfg)
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Requests, "requests", 1000, "requests per series")
	out.flags(f, "the commit")
	return cmd
}
