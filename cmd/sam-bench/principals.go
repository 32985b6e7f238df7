package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench/sambench"
	"sandstorm/internal/cli"
)

// everythingServer is the test MCP server make deps installs.
const everythingServer = "testdata/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

func principalsCmd() *cobra.Command {
	var (
		cfg    sambench.PrincipalsConfig
		out    resultsDir
		mcpCmd []string
	)
	cmd := &cobra.Command{
		Use:   "principals --node-bin BIN --box-bin BIN [flags]",
		Short: "Measure sam-node's and sam-box's memory with many principals that each made a call",
		Long: `sam-bench principals starts a sam-node (--node-bin) whose MCP server is --mcp-command
(default: the test server make deps installs under testdata/mcp, run with node),
a sam-box (--box-bin) with one boundary to read what one costs, then a sam-box
with --principals boundaries in one Set (agent-1, agent-2, …), and has every
principal, through its own boundary, GET /v1/models and open an MCP session
with the go-sdk client (initialize, tools/list), sessions kept open. sam-node's
RSS (/proc/PID/status) and Go heap (its /metrics) and sam-box's RSS are read
every --every principals, after all of them, and after every session is closed.
Results (machine, commit, raw samples) go to --out/principals-<date>-<commit>.`,
		Example: `  go build -o /tmp/sam/sam-node ./cmd/sam-node && go build -o /tmp/sam/sam-box ./cmd/sam-box
  sam-bench principals --node-bin /tmp/sam/sam-node --box-bin /tmp/sam/sam-box --principals 1000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.NodeBin == "" || cfg.BoxBin == "" {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--node-bin and --box-bin are required")}
			}
			if cfg.Principals < 2 || cfg.Concurrency < 1 || cfg.Every < 0 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("want --principals ≥ 2, --concurrency ≥ 1, --every ≥ 0")}
			}
			cfg.MCPCommand = mcpCmd
			if len(cfg.MCPCommand) == 0 {
				js, err := filepath.Abs(filepath.Join(out.repo, everythingServer))
				if err != nil {
					return err
				}
				if _, err := os.Stat(js); err != nil {
					return fmt.Errorf("no MCP server: %s is missing (npm ci --prefix testdata/mcp, or give --mcp-command)", js)
				}
				cfg.MCPCommand = []string{"node", js, "stdio"}
			}
			return record(cmd.Context(), out, "principals",
				fmt.Sprintf("Memory of sam-node and sam-box with %d principals", cfg.Principals), nil, sambench.Principals, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeBin, "node-bin", "", "the sam-node binary to start (required)")
	f.StringVar(&cfg.BoxBin, "box-bin", "", "the sam-box binary to start (required)")
	f.IntVar(&cfg.Principals, "principals", 1000, "distinct principals, each with a boundary of its own")
	f.IntVar(&cfg.Concurrency, "concurrency", 8, "principals calling at once")
	f.IntVar(&cfg.Every, "every", 250, "principals between two memory readings (0: only at the end)")
	f.StringArrayVar(&mcpCmd, "mcp-command", nil, "the stdio MCP server sam-node runs, one argument per flag (default: node "+everythingServer+" stdio)")
	out.flags(f, "the commit, and the default MCP server")
	return cmd
}
