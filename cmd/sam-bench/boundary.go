package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench"
	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/cli"
)

func boundaryCmd() *cobra.Command {
	var (
		cfg   sambench.BoundaryConfig
		out   resultsDir
		notes []string
	)
	cmd := &cobra.Command{
		Use:   "boundary --node-bin BIN --box-bin BIN [flags]",
		Short: "Measure the boundary's own cost: refusals per second and per core, a new flow's overhead over the baseline, admission",
		Long: `sam-bench boundary starts a sam-node (--node-bin) and a sam-box (--box-bin) with
one boundary, pinned to --box-cpu with GOMAXPROCS=--box-gomaxprocs, and runs
--rounds rounds of:
  - refusals: --refusal-conns connections in parallel for --refusal-time, each
    a loop of raw SOCKS5 bytes (greeting and a CONNECT to a name the policy
    does not grant in one write, both replies read, close), timed by the wall
    clock and by sam-box's own CPU time (/proc), so the rate per core does
    not depend on the client keeping up; the boundary's refusal counter is
    read before and after;
  - names refused by DNS: --dns-sockets UDP sockets for --refusal-time, each
    with --dns-window queries in flight for a name the policy does not grant
    (the boundary's DNS, listening on loopback as on a sandbox's veth, answers
    NXDOMAIN), timed by sam-box's own CPU time as above;
  - latency: --pairs requests of GET /v1/models straight to the node's socket
    (kept connection: the baseline; and a new connection), and through the
    boundary with a new flow per request (golang.org/x/net/proxy's SOCKS5
    client, as an agent's), interleaved, one at a time; the boundary's own
    admission mean from its metrics.
Results (machine, commit, raw samples) go to --out/boundary-<date>-<commit>.
Run it under taskset (e.g. taskset -c 1) to keep the client off sam-box's CPU.`,
		Example: `  go build -o /tmp/sam/sam-node ./cmd/sam-node && go build -o /tmp/sam/sam-box ./cmd/sam-box
  taskset -c 1 sam-bench boundary --node-bin /tmp/sam/sam-node --box-bin /tmp/sam/sam-box`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.NodeBin == "" || cfg.BoxBin == "" {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--node-bin and --box-bin are required")}
			}
			if cfg.DNSSockets < 0 || (cfg.DNSSockets > 0 && cfg.DNSWindow < 1) {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--dns-sockets must be 0 or more, and --dns-window positive")}
			}
			if cfg.Rounds < 1 || cfg.RefusalConns < 1 || cfg.RefusalTime <= 0 || cfg.Pairs < 1 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--rounds, --refusal-conns, --refusal-time and --pairs must be positive")}
			}
			if self, err := os.Executable(); err == nil {
				cfg.FloorCmd = []string{self, "floor-server"}
			}
			return record(cmd.Context(), out, "boundary",
				"The boundary's own cost: refusals, a new flow over the baseline, admission",
				func(res *bench.Results) {
					for _, n := range notes {
						res.Note("%s", n)
					}
					for name, bin := range map[string]string{"sam-node": cfg.NodeBin, "sam-box": cfg.BoxBin} {
						if sum, err := bench.FileSHA256(bin); err == nil {
							res.Params[name+"_sha256"] = sum
						}
					}
				}, sambench.Boundary, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeBin, "node-bin", "", "the sam-node binary to start (required)")
	f.StringVar(&cfg.BoxBin, "box-bin", "", "the sam-box binary to start (required)")
	f.StringVar(&cfg.BoxCPU, "box-cpu", "0", `CPUs sam-box is pinned to (taskset -c); "" for none`)
	f.IntVar(&cfg.BoxProcs, "box-gomaxprocs", 1, "sam-box's GOMAXPROCS (0: Go's default)")
	f.IntVar(&cfg.Rounds, "rounds", 5, "rounds")
	f.IntVar(&cfg.RefusalConns, "refusal-conns", 32, "connections in parallel in a refusal phase")
	f.DurationVar(&cfg.RefusalTime, "refusal-time", 3*time.Second, "how long a refusal phase lasts")
	f.IntVar(&cfg.Pairs, "pairs", 300, "requests of each route per round")
	f.IntVar(&cfg.DNSSockets, "dns-sockets", 4, "UDP sockets asking the boundary's DNS for a name not granted, per round, for --refusal-time (0: no DNS phase)")
	f.IntVar(&cfg.DNSWindow, "dns-window", 32, "queries each DNS socket keeps in flight (sent and read in batches)")
	out.flags(f, "the commit")
	f.StringArrayVar(&notes, "note", nil, "a note recorded with the results (e.g. which commit --box-bin was built from), repeatable")
	return cmd
}

// floorServerCmd is the floor server sam-bench boundary starts (hidden).
func floorServerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "floor-server SOCKET",
		Short:  "Serve the least a refusal can be on SOCKET (for sam-bench boundary)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE:   func(_ *cobra.Command, args []string) error { return sambench.FloorServe(args[0]) },
	}
}
