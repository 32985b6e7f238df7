package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/bench/sambench"
)

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "sam-bench",
		Short: "Measure the mesh as an agent reaches it: through its boundary, or with no boundary for the baseline",
		Long: `sam-bench issues the same request many times, the way an agent does (through its
boundary's SOCKS5 Unix socket, the target's name resolved by the boundary), or
straight to the node's Unix socket for the baseline. It records every request,
the machine and the commit; percentiles are by nearest rank over the full
sample, failed requests are counted by kind and never enter the distribution,
and warmup requests are reported apart. "sam-bench report" renders many runs
as one Markdown table.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(runCmd(), reportCmd(), discoveryCmd(), meshCmd(), boundaryCmd(), principalsCmd(), agentsCmd(), healCmd(), floorServerCmd())
	return root
}

func runCmd() *cobra.Command {
	var (
		cfg      sambench.Config
		headers  []string
		labels   []string
		data     string
		out      string
		quiet    bool
		timeout  time.Duration
		repoDir  string
		warmup   int
		denyCode []int
	)
	cmd := &cobra.Command{
		Use:   "run --socket SOCK | --target-unix SOCK --target URL [flags]",
		Short: "Measure one route and write an observations file",
		Example: `  sam-bench run --socket /run/agent.sock --target http://mesh.sam.alt/v1/models \
      --requests 500 --concurrency 4 --scrape http://127.0.0.1:9600/metrics \
      --rss-process-name sam-box --label step=8 --out results/step8-reused.json
  sam-bench run --socket /run/agent.sock --target http://mesh.sam.alt/v1/models --new-flow --out results/step8-new.json
  sam-bench run --socket /run/agent.sock --target http://forbidden.example/ --expect-deny --out results/step8-deny.json
  sam-bench run --target-unix /run/node.sock --target http://localhost/v1/models \
      --header X-Sam-Principal=agent-a --out results/baseline.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Headers, err = parseHeaders(headers); err != nil {
				return err
			}
			if cfg.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			if cfg.Body, err = readData(data); err != nil {
				return err
			}
			cfg.Timeout = timeout
			cfg.Warmup = warmup
			cfg.DenyStatus = denyCode
			cfg.RepoDir = repoDir
			if out != "" && out != "-" {
				cfg.SourceIgnore = []string{absPath(out)}
			}
			logf := func(format string, args ...any) {
				if !quiet {
					fmt.Fprintf(cmd.ErrOrStderr(), "sam-bench: "+format+"\n", args...)
				}
			}
			obs, err := sambench.Run(cmd.Context(), cfg, logf)
			if err != nil {
				return err
			}
			if out == "" || out == "-" {
				if err := json.NewEncoder(cmd.OutOrStdout()).Encode(obs); err != nil {
					return err
				}
			} else if err := sambench.WriteFile(out, obs); err != nil {
				return err
			} else {
				logf("wrote %s", out)
			}
			if !quiet {
				summarize(cmd.ErrOrStderr(), obs)
			}
			return cmd.Context().Err()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Socket, "socket", "", "the boundary's SOCKS5 Unix socket (route: boundary)")
	f.StringVar(&cfg.TargetUnix, "target-unix", "", "the node's Unix socket, dialled directly (route: baseline, no boundary)")
	f.StringVar(&cfg.Target, "target", "", "URL to request; through a boundary its host name is resolved by the boundary (required)")
	f.StringVar(&cfg.Method, "method", "GET", "HTTP method")
	f.StringVar(&data, "data", "", "request body, or @FILE to read it from a file")
	f.StringArrayVar(&headers, "header", nil, "request header K=V (or 'K: V'), repeatable; Host=… sets the Host")
	f.IntVar(&cfg.Requests, "requests", 500, "requests in the main phase")
	f.IntVar(&cfg.Concurrency, "concurrency", 4, "requests in flight at once (and idle flows kept)")
	f.IntVar(&warmup, "warmup", 20, "requests issued first and reported apart from the main phase")
	f.BoolVar(&cfg.NewFlow, "new-flow", false, "a new connection (SOCKS5 handshake, policy decision) per request; default reuses flows")
	f.BoolVar(&cfg.ExpectDeny, "expect-deny", false, "enforcement run: success is a refused flow (SOCKS5 'not allowed' or a --deny-status); served requests are counted as leaked")
	f.IntSliceVar(&denyCode, "deny-status", nil, "with --expect-deny, HTTP statuses that count as a refusal (default 403)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "per-request timeout, body included")
	f.StringArrayVar(&cfg.Scrape, "scrape", nil, "Prometheus metrics URL read before and after the main phase (sam_* counters' deltas recorded); repeatable")
	f.StringVar(&cfg.AdmissionMetric, "admission-metric", sambench.DefaultAdmissionMetric, "histogram (seconds) whose Δsum/Δcount is the boundary's mean admission time")
	f.StringVar(&cfg.RefusalMetric, "refusal-metric", sambench.DefaultRefusalMetric, "counter, or name{label=\"value\"}, of flows the boundary refused")
	f.IntSliceVar(&cfg.RSSPids, "rss-pids", nil, "pids whose RSS, fds and threads are recorded (comma-separated)")
	f.StringVar(&cfg.RSSProcessName, "rss-process-name", "", "record RSS, fds and threads of every process of this name")
	f.StringArrayVar(&labels, "label", nil, "label K=V naming the run in reports, repeatable (e.g. step=8)")
	f.StringVar(&repoDir, "repo", ".", "git work tree whose commit and dirty state are recorded")
	f.StringVarP(&out, "out", "o", "", "observations file to write (default: JSON on stdout)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress or summary on stderr")
	return cmd
}

func reportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "report FILE.json...",
		Short: "Render observations files as one Markdown table (rows ordered by label)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := sambench.Report(args)
			if err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), md)
			return err
		},
	}
}

// parseHeaders accepts "K=V" and "K: V".
func parseHeaders(in []string) ([]sambench.Header, error) {
	var hs []sambench.Header
	for _, h := range in {
		i := strings.IndexAny(h, "=:")
		if i <= 0 {
			return nil, fmt.Errorf("--header %q: want K=V", h)
		}
		hs = append(hs, sambench.Header{Name: strings.TrimSpace(h[:i]), Value: strings.TrimSpace(h[i+1:])})
	}
	return hs, nil
}

func parseLabels(in []string) (map[string]string, error) {
	if len(in) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, l := range in {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			k, v = "run", l
		}
		if k == "" {
			return nil, fmt.Errorf("--label %q: want K=V", l)
		}
		m[k] = v
	}
	return m, nil
}

func readData(data string) (string, error) {
	if f, ok := strings.CutPrefix(data, "@"); ok {
		b, err := os.ReadFile(f)
		return string(b), err
	}
	return data, nil
}

func absPath(p string) string {
	wd, err := os.Getwd()
	if err != nil || strings.HasPrefix(p, "/") {
		return p
	}
	return wd + "/" + p
}

// summarize prints the run in a few lines.
func summarize(w io.Writer, obs *sambench.Observations) {
	line := func(name string, p *sambench.Phase) {
		if p == nil {
			return
		}
		fmt.Fprintf(w, "%s: %d requests, %d ok, %d failed in %.2fs (%.0f ok/s)", name, p.Requests, p.OK, p.Failed, p.WallSeconds, p.OKPerSecond)
		if l := p.LatencyUs; l != nil {
			fmt.Fprintf(w, "; µs min %.0f p50 %.0f p90 %.0f p99 %.0f max %.0f", l.Min, l.P50, l.P90, l.P99, l.Max)
		}
		fmt.Fprintln(w)
		for _, k := range slices.Sorted(maps.Keys(p.Failures)) {
			fmt.Fprintf(w, "  failed: %s ×%d\n", k, p.Failures[k])
		}
	}
	fmt.Fprintf(w, "%s route, %s flows, %s mode; %s; %s\n", obs.Route, obs.Flow, obs.Mode, obs.Source, obs.Machine)
	line("warmup", obs.Warmup)
	line("main", obs.Main)
	if d := obs.Derived.AdmissionMeanUs; d != nil {
		fmt.Fprintf(w, "boundary admission: mean %.1f µs over %.0f flows\n", *d, *obs.Derived.AdmissionCount)
	}
	if d := obs.Derived.BoundaryRefusals; d != nil {
		fmt.Fprintf(w, "boundary refused: %.0f\n", *d)
	}
	for _, p := range obs.Processes {
		fmt.Fprintf(w, "pid %d %s: RSS %.1f MiB, %d fds, %d threads\n", p.PID, p.Name, float64(p.RSSKiB)/1024, p.FDs, p.Threads)
	}
	for _, n := range obs.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}
