package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench"
	"sandstorm/internal/bench/sambench/agents"
	"sandstorm/internal/cli"
)

const agentsHelp = `sam-bench agents is the SAM seed's "A thousand agents on one host" → "What they can
push", scaled to this machine. It starts a sam-node (--node-bin, else built from
--repo) and a sandstormd (serve --master --node, built from --repo unless
--sandstormd; idle timers off, the boundaries' policy granting every agent
inference://*, --sam-node the sam-node's socket, --metrics-addr on loopback),
registers the web demo (built from Debian packages) with memory_mib --memory-mib,
and creates real runsc sandboxes agent-0001, agent-0002, … --parallel at a time
until there are --max, or the node shows it is full: a create refused (503), or a
sandbox pushed off memory to make room. It also stops when the host's tasks
come within --task-margin of the kernel's limit (pid_max): the machine is shared.

Then, --rounds times: --pushers of the sandboxes (spread over the population)
push at once, each its own principal, --requests GET http://mesh.sam.alt/v1/models
each, --in-flight at a time on kept-alive flows, over SOCKS5 into its own
boundary's agent.sock; and the same push straight to sam-node's socket (the
baseline, no boundary), the two in alternating order. Before and after every
push it scrapes sam-node's and sandstormd's metrics and checks that their
counters agree with the client's count. Results (machine, commit, every request
as gzip'd CSV, memory with the population resident, where the CPU went) go to
--out/agents-<date>-<commit>. Everything it started is removed at the end,
Ctrl-C included (sandboxes deleted, daemons stopped by PID, data removed).
Needs root.`

func agentsCmd() *cobra.Command {
	cfg := agents.AgentsConfig{}
	var out resultsDir
	var sandstormd, runsc string
	cmd := &cobra.Command{
		Use:   "agents [flags]",
		Short: "The seed's thousand-agent run on this machine: as many real sandboxes as fit, 200 of them pushing through their own boundaries",
		Long:  agentsHelp,
		Example: `  sam-bench agents                              # fill up to 2,000, 200 pushing, 2 rounds
  sam-bench agents --max 3 --pushers 2 --requests 20 --rounds 1   # a smoke run`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			check := cfg
			if check.NodeBin == "" {
				check.NodeBin = "(built from --repo)"
			}
			if err := check.Validate(); err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("needs root: sandstormd creates network namespaces, mounts and runsc sandboxes")
			}
			ctx := cmd.Context()
			if runsc == "" {
				runsc = filepath.Join(out.repo, "bin", "runsc")
			}
			br, err := bench.Begin(ctx, bench.Plan{Tool: "sam-bench agents",
				Title: fmt.Sprintf("Many agents on one node: up to %d sandboxes, %d pushing through their own boundaries", cfg.Max, cfg.Pushers),
				Out:   out.out, Repo: out.repo, Prefix: "agents-", Runsc: runsc, Demo: "web", Sandstormd: sandstormd})
			if err != nil {
				return err
			}
			if cfg.NodeBin == "" {
				if cfg.NodeBin, err = buildSamNode(ctx, out.repo, br.Work); err != nil {
					br.Close()
					return err
				}
				br.Results.Params["sam_node_built_from_tree"] = true
			}
			noteLoad(br.Results, "before")
			return finish(br.Results, br.Dir, agents.Agents(ctx, cfg, br, progressf)) // Agents removes br.Work
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeBin, "node-bin", "", "the sam-node binary to start (default: built from --repo)")
	f.StringVar(&sandstormd, "sandstormd", "", "the sandstormd binary to start (default: built from --repo)")
	f.StringVar(&runsc, "runsc", "", "the runsc binary (default: bin/runsc under --repo, from make runsc)")
	f.IntVar(&cfg.Max, "max", 2000, "create at most this many sandboxes")
	f.IntVar(&cfg.Pushers, "pushers", 200, "sandboxes that push at once, each through its own boundary")
	f.IntVar(&cfg.Requests, "requests", 200, "requests per pushing agent in a push")
	f.IntVar(&cfg.InFlight, "in-flight", 2, "requests each agent has in flight (and flows it keeps)")
	f.IntVar(&cfg.Rounds, "rounds", 2, "rounds of a push through the boundaries and one straight to sam-node (the baseline)")
	f.IntVar(&cfg.MemoryMiB, "memory-mib", 64, "the template's memory limit (MiB): what a starting sandbox is admitted at until its template's sandboxes have settled (a web sandbox holds about 25 MiB)")
	f.IntVar(&cfg.MemoryReserveMiB, "memory-reserve", 2048, "sandstormd --memory-reserve (MiB of MemAvailable the node keeps free; the machine is shared)")
	f.IntVar(&cfg.Parallel, "parallel", 4, "creates at a time")
	f.DurationVar(&cfg.FillFor, "fill-for", 30*time.Minute, "stop creating after this long")
	f.StringVar(&cfg.Subnet, "subnet", "10.153.0.0/16", "sandstormd --subnet: must be unused on this host")
	f.StringVar(&cfg.GatewayPorts, "gateway-ports", "27000-29999", "sandstormd --gateway-ports: one per sandbox, below the ephemeral range, unused")
	f.IntVar(&cfg.TaskMargin, "task-margin", 4096, "stop the fill when the host's tasks come within this many of pid_max")
	f.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "per-request timeout, body included")
	f.DurationVar(&cfg.Quiet, "settle-quiet", 15*time.Second, "after the fill, wait until no sandbox has left memory for this long before choosing the pushers")
	f.DurationVar(&cfg.IdleFor, "idle-cpu", 10*time.Second, "how long the machine's CPU is read with no push, before the fill and with the population resident")
	out.flags(f, "the commit, and the binaries built from it")
	return cmd
}

// buildSamNode builds ./cmd/sam-node of repo into dir: a results file
// that names a commit measures that commit's code.
func buildSamNode(ctx context.Context, repo, dir string) (string, error) {
	bin := filepath.Join(dir, "sam-node")
	fmt.Fprintf(os.Stderr, "building sam-node from %s\n", repo)
	c := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/sam-node")
	c.Dir = repo
	if b, err := c.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/sam-node in %s: %v\n%s", repo, err, strings.TrimSpace(string(b)))
	}
	return bin, nil
}
