package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench/sambench/heal"
	"sandstorm/internal/cli"
	"sandstorm/internal/sam/meshlab"
	"sandstorm/internal/sam/meshpeer"
)

func healCmd() *cobra.Command {
	cfg := heal.Config{Runs: 20, Sparse: time.Second, Dense: 100 * time.Millisecond, DenseFor: 15 * time.Second,
		Watch: time.Minute, Spread: meshpeer.CheckInterval, Stride: meshpeer.CheckInterval, RouterDown: time.Minute, MemberCut: 30 * time.Second,
		ControlPlaneDown: 5 * time.Minute, Net: 202, Scenarios: heal.Scenarios}
	var out resultsDir
	var binDir string
	cmd := &cobra.Command{
		Use:   "heal [flags]",
		Short: "Measure how fast the mesh heals from each fault: a router restarted or down, a member cut off or restarted, the control plane down, one of two routers gone",
		Long: `sam-bench heal builds --runs labs, each a mesh of machines on this one:
every machine a network namespace on a LAN of its own, a control plane, a
router (two for the last scenario) and two members running the real
sam-control-plane, sam-router and sam-node from --bin-dir, each member
serving a model from an OpenAI-protocol server on its own loopback and able
to reach only the control plane and the routers, so members reach each
other through the router's relay only.

Each scenario runs once in every lab, all labs at once; lab k's fault falls
k × (--stride + --spread/--runs) after the first, so the faults fall at
--runs points spread over the members' check interval (2 s), yet apart:

  router-restart        the router killed -9 and started again at once
  router-down           killed -9, started again after --router-down
  member-cut            one member's traffic to the router dropped (nftables)
                        for --member-cut
  control-plane-down    killed -9, started again after --control-plane-down
  member-restart        one member killed -9 and started again at once
  two-routers-one-gone  two routers, one killed -9 for good

Throughout, each lab is probed each way between its members: a chat
completion through one member's agent socket of the model the other
serves, and a lookup of that model past the cache (sam-node's admin
/mesh/providers); every --sparse, and every --dense for --dense-for around
each fault. A run heals when, after the fault's end, every probe succeeds
and goes on succeeding to the end of --watch; its time is from the fault's
end to the last kind's first lasting success. Results (machine, commit,
every run's time, what failed meanwhile, what the members said) go to
--out/heal-<date>-<commit>; the labs' logs stay in --dir. Needs root.`,
		Example: `  sam-bench heal                                   # every scenario, 20 runs each (≈ 20 min)
  sam-bench heal --scenario router-restart --runs 5 --watch 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Runs < 1 || cfg.Runs > 200 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--runs: 1 to 200")}
			}
			if binDir == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				binDir = filepath.Dir(exe)
			}
			cfg.Bins = meshlab.BinsIn(binDir)
			for _, b := range []string{cfg.Bins.ControlPlane, cfg.Bins.Router, cfg.Bins.Node} {
				if _, err := os.Stat(b); err != nil {
					return fmt.Errorf("%w (make build puts it in bin/; or give --bin-dir)", err)
				}
			}
			if cfg.Dir == "" {
				cfg.Dir = filepath.Join(os.TempDir(), fmt.Sprintf("sam-bench-heal-%d", os.Getpid()))
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "sam-bench: the labs' logs and data go to", cfg.Dir)
			return record(cmd.Context(), out, "heal",
				fmt.Sprintf("How fast the mesh heals: %s, %d runs each", strings.Join(cfg.Scenarios, ", "), cfg.Runs), nil, heal.Run, cfg)
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Runs, "runs", cfg.Runs, "labs, each running every scenario once")
	f.StringSliceVar(&cfg.Scenarios, "scenario", cfg.Scenarios, "scenarios to run (repeatable or comma-separated)")
	f.DurationVar(&cfg.Sparse, "sparse", cfg.Sparse, "probe interval away from faults")
	f.DurationVar(&cfg.Dense, "dense", cfg.Dense, "probe interval around a fault")
	f.DurationVar(&cfg.DenseFor, "dense-for", cfg.DenseFor, "how long after a fault's start and end probes are dense")
	f.DurationVar(&cfg.Watch, "watch", cfg.Watch, "how long after a fault's end the probes must keep succeeding")
	f.DurationVar(&cfg.Spread, "spread", cfg.Spread, "the span of the members' check interval the labs' faults are spread over")
	f.DurationVar(&cfg.Stride, "stride", cfg.Stride, "the whole intervals between two labs' faults (so that not all probe densely at once)")
	f.DurationVar(&cfg.RouterDown, "router-down", cfg.RouterDown, "router-down: how long the router stays down")
	f.DurationVar(&cfg.MemberCut, "member-cut", cfg.MemberCut, "member-cut: how long the member is cut off")
	f.DurationVar(&cfg.ControlPlaneDown, "control-plane-down", cfg.ControlPlaneDown, "control-plane-down: how long it stays down")
	f.StringVar(&cfg.LogLevel, "log-level", "info", "the mesh processes' log level (debug, info, warn, error)")
	f.StringVar(&binDir, "bin-dir", "", "where sam-control-plane, sam-router and sam-node are (default: beside sam-bench)")
	f.StringVar(&cfg.Dir, "dir", "", "the labs' data dirs and logs (default: a new directory in $TMPDIR)")
	out.flags(f, "the commit")
	return cmd
}
