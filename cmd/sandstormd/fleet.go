package main

import (
	"os"

	"github.com/spf13/cobra"

	"sandstorm/internal/fleetup"
)

func fleetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Bring a fleet up on this machine (a master and nodes in network namespaces) and down again",
		Long: `fleet up starts a master and --nodes nodes on this machine, each node in a
network namespace of its own (its own address 10.186.<k>.2, nftables table,
routes and ports, joined to this namespace by a veth), pairs every node with
the master, seeds a demo template and checks that a sandbox answers on every
node. What it made is recorded in <root>/fleet.json; fleet down reads it,
deletes the fleet's sandboxes, stops its processes by PID and removes its
namespaces and links.

Over ssh for real machines, start 'sandstormd serve --node --node-listen
ADDR:7443' on each and pair it (README "Nodes apart from the master"); a
--hosts mode that does this for you is not there yet.`,
	}
	var cfg fleetup.Config
	up := &cobra.Command{
		Use: "up", Short: "Start a master and --nodes nodes, pair, seed and verify", Args: cobra.NoArgs,
		Example: `  sudo sandstormd fleet up --nodes 3
  SANDSTORM_API=https://127.0.0.1:8079 SANDSTORM_DATA_DIR=/var/lib/sandstorm-fleet/master sandstormd sandbox ls
  sudo sandstormd fleet down`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Bin, cfg.Out = exe, os.Stdout
			_, err = fleetup.Up(cmd.Context(), cfg)
			return err
		},
	}
	up.Flags().IntVar(&cfg.Nodes, "nodes", 3, "how many nodes (1 to 9)")
	up.Flags().StringVar(&cfg.Root, "root", "/var/lib/sandstorm-fleet", "where the fleet's data dirs, logs and fleet.json go")
	up.Flags().StringVar(&cfg.Listen, "listen", "127.0.0.1:8079", "the master's API address")
	up.Flags().StringVar(&cfg.Template, "template", "web", "demo template to seed and verify with (web or app64; empty: none)")
	up.Flags().StringArrayVar(&cfg.NodeArgs, "node-arg", nil, "a flag for every node's serve (repeatable), e.g. --node-arg=--freeze-after=2s")
	var root string
	var purge bool
	down := &cobra.Command{
		Use: "down", Short: "Delete the fleet's sandboxes and stop and remove everything fleet up made", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fleetup.Down(root, purge, os.Stdout)
		},
	}
	down.Flags().StringVar(&root, "root", "/var/lib/sandstorm-fleet", "the fleet's root (as given to fleet up)")
	down.Flags().BoolVar(&purge, "purge", false, "also remove the data dirs")
	cmd.AddCommand(up, down)
	return cmd
}
