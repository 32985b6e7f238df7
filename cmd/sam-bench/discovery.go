package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/cli"
)

func discoveryCmd() *cobra.Command {
	var (
		cfg sambench.DiscoveryConfig
		out resultsDir
	)
	cmd := &cobra.Command{
		Use:   "discovery [flags]",
		Short: "Measure provider discovery on a loopback DHT mesh: a cold lookup, a warm one, many callers on a cold cache",
		Long: `sam-bench discovery starts a mesh of --nodes libp2p DHT servers on 127.0.0.1
(the mesh's own protocol prefix) and, in --rounds rounds, has --providers of
them provide a new name, then times a cold lookup of it from another member,
the next lookup from its cache, and --callers callers at once on a third
member's empty cache (one shared lookup; the slowest caller within twice
its time is the goal). Results (machine, commit, raw samples) go to
--out/discovery-<date>-<commit>.`,
		Example: `  sam-bench discovery
  sam-bench discovery --nodes 50 --providers 4 --callers 500 --rounds 30`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Nodes < cfg.Providers+2 || cfg.Providers < 1 || cfg.Callers < 1 || cfg.Rounds < 1 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("want --nodes ≥ --providers + 2, and --providers, --callers, --rounds ≥ 1")}
			}
			return record(cmd.Context(), out, "discovery",
				fmt.Sprintf("Provider discovery on a loopback mesh of %d DHT servers, %d providers", cfg.Nodes, cfg.Providers), nil, sambench.Discovery, cfg)
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Nodes, "nodes", 20, "DHT servers in the mesh")
	f.IntVar(&cfg.Providers, "providers", 4, "nodes that provide each round's name")
	f.IntVar(&cfg.Callers, "callers", 200, "callers at once on a cold cache")
	f.IntVar(&cfg.Rounds, "rounds", 20, "rounds, each with a name of its own")
	out.flags(f, "the commit")
	return cmd
}
