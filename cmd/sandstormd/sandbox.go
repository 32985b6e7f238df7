package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/client"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/tier"
)

func sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sb"}, Short: "Manage sandboxes"}
	addAPIFlag(cmd)
	cmd.AddCommand(sandboxCreateCmd(), sandboxLsCmd(), sandboxGetCmd(), sandboxRmCmd(), sandboxLogsCmd(), sandboxUsageCmd(), sandboxExecCmd(), sandboxCpCmd(), sandboxCloneCmd(), sandboxMoveCmd(), sandboxNetworkCmd(), sandboxEgressCmd())
	cmd.AddCommand(transitionCmds()...)
	cmd.AddCommand(pauseCmd(), resumeCmd())
	return cmd
}

// sandboxCreateCmd is "sandbox create".
func sandboxCreateCmd() *cobra.Command {
	var name, principal, lifetime, onTimeout string
	var idle api.IdleTimers
	var env, labels, allowOut, denyOut, secretFlags []string
	var memory int
	create := &cobra.Command{
		Use: "create TEMPLATE", Short: "Start a sandbox from a template (returns when it runs)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("name") && name == "" {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: errors.New("--name is empty: give a name (1-63 of a-z, 0-9 and '-'), or leave --name out for sb-<id>")}
			}
			envs, err := keyValues("--env", env)
			if err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			labs, err := keyValues("--label", labels)
			if err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			eg, err := egressFlags(allowOut, denyOut)
			if err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			secs, err := keyValues("--secret", secretFlags)
			if err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			if err := createFlags(name, memory, lifetime, onTimeout, idle); err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			sb, err := c.CreateSandbox(cmd.Context(), api.SandboxRequest{Template: args[0], Name: name, Principal: principal,
				MemoryMiB: memory, Env: envs, Labels: labs, Lifetime: lifetime, OnTimeout: onTimeout, Idle: idleOf(idle), Egress: eg, Secrets: secs})
			if err != nil {
				return err
			}
			return printSandbox(cmd, sb)
		},
	}
	create.Flags().StringVar(&name, "name", "", "sandbox name (default sb-<id>)")
	create.Flags().StringVar(&principal, "principal", "", "who the sandbox is to its boundary and the mesh (default: the template's principal, else the sandbox name)")
	create.Flags().StringArrayVar(&allowOut, "allow-out", nil, "with --deny-out: a name (api.example.com, *.example.com), address or CIDR that still goes out; repeatable (only narrows the policy: a name it does not grant is refused)")
	create.Flags().StringArrayVar(&denyOut, "deny-out", nil, "an address or CIDR its boundary lets nothing out to (0.0.0.0/0: everything but --allow-out); repeatable")
	create.Flags().StringArrayVar(&secretFlags, "secret", nil, "VAR=SECRET: VAR holds a marker for the stored secret (sandstormd secret ls), which its boundary replaces with the secret only in HTTPS requests to the secret's hosts; repeatable")
	create.Flags().IntVar(&memory, "memory", 0, "memory limit in MiB (default: the template's, else the node's --sandbox-memory)")
	create.Flags().StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE in the environment of every command run in it (sandbox exec); repeatable")
	create.Flags().StringArrayVarP(&labels, "label", "l", nil, "a label key=value, listed and filtered by (sandbox ls --label); repeatable")
	create.Flags().StringVar(&lifetime, "lifetime", "", "end it this long after its create (e.g. 90s, 2h): deleted, or snapshotted with --on-timeout snapshot")
	create.Flags().StringVar(&onTimeout, "on-timeout", "", "what its lifetime's end does: delete (default) or snapshot")
	create.Flags().StringVar(&idle.FreezeAfter, "freeze-after", "", "its own idle time before it is frozen (e.g. 30s; 0: never; default: the node's)")
	create.Flags().StringVar(&idle.SnapshotAfter, "snapshot-after", "", "its own idle time, once frozen, before it is snapshotted (default: the node's)")
	create.Flags().StringVar(&idle.DetachAfter, "detach-after", "", "its own idle time, once snapshotted, before it is detached (default: the node's)")
	return create
}

// sandboxNetworkCmd is "sandbox network".
func sandboxNetworkCmd() *cobra.Command {
	var allowOut, denyOut []string
	cmd := &cobra.Command{
		Use:   "network SANDBOX",
		Short: "Replace a running sandbox's egress rules (neither flag: clear them)",
		Long: `Replaces the sandbox's egress rules whole, as E2B's updateNetwork does: its
boundary applies them to every new flow at once; flows already open go on.
The rules only narrow what the policy grants the sandbox's principal.`,
		Example: "  sandstormd sandbox network web-1 --deny-out 0.0.0.0/0 --allow-out api.example.com\n  sandstormd sandbox network web-1   # no rules: the policy alone",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			eg, err := egressFlags(allowOut, denyOut)
			if err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			if eg == nil {
				eg = &api.Egress{}
			}
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			sb, err := c.SetNetwork(cmd.Context(), args[0], *eg)
			if err != nil {
				return err
			}
			return printSandbox(cmd, sb)
		},
	}
	cmd.Flags().StringArrayVar(&allowOut, "allow-out", nil, "with --deny-out: a name (api.example.com, *.example.com), address or CIDR that still goes out; repeatable")
	cmd.Flags().StringArrayVar(&denyOut, "deny-out", nil, "an address or CIDR its boundary lets nothing out to (0.0.0.0/0: everything but --allow-out); repeatable")
	return cmd
}

// createFlags checks here what the master would refuse of create's
// flags, by the master's own checks, so that a mistake in them is a usage
// error (exit 2) like any other flag's, before anything is sent.
func createFlags(name string, memory int, lifetime, onTimeout string, idle api.IdleTimers) error {
	if name != "" && !api.ValidName(name) {
		return fmt.Errorf("--name %q: 1-63 of a-z, 0-9 and '-', not starting with '-'", name)
	}
	if memory < 0 {
		return fmt.Errorf("--memory %d: a limit in MiB, or 0 for the default", memory)
	}
	if _, _, err := sandboxes.CheckLifetime(lifetime, onTimeout); err != nil {
		return err
	}
	if _, err := (tier.Timers{}).With(idleOf(idle)); err != nil {
		return err
	}
	return nil
}

func idleOf(t api.IdleTimers) *api.IdleTimers {
	if t == (api.IdleTimers{}) {
		return nil
	}
	return &t
}

// keyValues parses repeated KEY=VALUE flags.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// sandboxLsCmd is "sandbox ls".
func sandboxLsCmd() *cobra.Command {
	var labels []string
	ls := &cobra.Command{
		Use: "ls", Short: "List sandboxes with their tier and endpoints", Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := keyValues("--label", labels); err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			return nil
		},
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, _ []string) error {
			sbs, err := c.Sandboxes(cmd.Context(), labels...)
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(sbs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tTEMPLATE\tNODE\tTIER\tADDRESS\tENDPOINTS\tLAST ACTIVE")
			for _, sb := range sbs {
				active := "-"
				if !sb.LastActive.IsZero() {
					active = time.Since(sb.LastActive).Round(time.Second).String() + " ago"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Name, sb.Template, sb.Node, tierText(sb), sb.Address,
					endpoints(sb), active)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			// Warm pools' sandboxes run (restored, paused) and hold a netns
			// each, but have no name until a create takes one: counted here
			// so that what runs adds up.
			var nodes api.List[api.NodeStatus]
			if c.Do(cmd.Context(), http.MethodGet, "/v1/nodes", nil, &nodes) == nil {
				printPooled(os.Stdout, nodes.Items, templateNames(cmd.Context(), c))
			}
			return nil
		}),
	}
	ls.Flags().StringArrayVarP(&labels, "label", "l", nil, "only those with this label (key=value); repeatable, all must match")
	return ls
}

// sandboxGetCmd is "sandbox get".
func sandboxGetCmd() *cobra.Command {
	get := &cobra.Command{
		Use: "get ID|NAME", Short: "Show one sandbox as JSON", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			sb, err := c.Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(sb)
		}),
	}
	return get
}

// sandboxUsageCmd is "sandbox usage".
func sandboxUsageCmd() *cobra.Command {
	var asJSON bool
	usage := &cobra.Command{
		Use:   "usage ID|NAME",
		Short: "Show what a sandbox uses now: CPU, memory, disk",
		Long: `Show what a sandbox uses now, as its node measures it from outside: the
share of its cores it used since the last reading (or over 200 ms), the
memory it takes from the node (its cgroup's charge less page cache) and
what it wrote to its filesystem. Reading it does not wake the sandbox and
does not count as activity: a sandbox in the snapshot or detached tier
uses no CPU and no memory.`,
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			u, err := c.Usage(cmd.Context(), args[0])
			if err != nil || asJSON {
				if err == nil {
					err = printJSON(u)
				}
				return err
			}
			fmt.Printf("tier    %s\ncpu     %.1f%% of %d cores\nmemory  %s of %s (page cache %s)\ndisk    %s written, %s free\n",
				u.Tier, u.CPUPct, u.CPUCount, mib(u.MemBytes), mib(u.MemLimitBytes), mib(u.MemCacheBytes), mib(u.DiskBytes), mib(u.DiskLimitBytes-u.DiskBytes))
			return nil
		}),
	}
	usage.Flags().BoolVar(&asJSON, "json", false, "print it as JSON")
	return usage
}

// mib is n bytes in MiB, for a person.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// sandboxRmCmd is "sandbox rm".
func sandboxRmCmd() *cobra.Command {
	rm := &cobra.Command{
		Use: "rm ID|NAME...", Short: "Remove sandboxes and everything they had", Args: cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			for _, a := range args {
				if err := c.DeleteSandbox(cmd.Context(), a); err != nil {
					return err
				}
				fmt.Println("removed", a)
			}
			return nil
		}),
	}
	return rm
}

// sandboxLogsCmd is "sandbox logs".
func sandboxLogsCmd() *cobra.Command {
	var follow, stamps bool
	logs := &cobra.Command{
		Use:   "logs ID|NAME",
		Short: "Print a sandbox's console output (last 64 KiB; -f to follow)",
		Long: `Print a sandbox's console output: what its process wrote to stdout and
stderr (the last 64 KiB), with a "--- <time> sandstorm: …" line wherever the
node started, restored, checkpointed or stopped it — so a restart (a cold
start after detach, whose memory is new) shows. --follow goes on printing
what is appended until interrupted or the sandbox is deleted. --timestamps
starts every line with the time it was written.`,
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			return c.Logs(cmd.Context(), args[0], follow, stamps, os.Stdout)
		}),
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing what the sandbox writes")
	logs.Flags().BoolVarP(&stamps, "timestamps", "t", false, "start every line with the time it was written (\"-\" for lines written while sandstormd was not running)")
	return logs
}

// templateNames is the names of the templates registered now (nil if
// they cannot be read: then every pool is taken for a registered one's).
func templateNames(ctx context.Context, c *client.Client) map[string]bool {
	ts, err := c.Templates(ctx)
	if err != nil {
		return nil
	}
	out := make(map[string]bool, len(ts))
	for _, t := range ts {
		out[t.Name] = true
	}
	return out
}

// printPooled prints the warm pools' sandboxes the nodes report: a pool's
// of a registered template are ready for a create; one's whose template
// was removed are being stopped (its node drains the pool within a
// couple of seconds), said apart so that a removed template does not
// look as if it were still served.
func printPooled(w io.Writer, nodes []api.NodeStatus, registered map[string]bool) {
	var ready, stopping []string
	nReady, nStopping := 0, 0
	for _, n := range nodes {
		for tmpl, k := range n.WarmPool {
			switch part := fmt.Sprintf("%d of %s on %s", k, tmpl, n.Name); {
			case k <= 0:
			case registered != nil && !registered[tmpl]:
				stopping, nStopping = append(stopping, part), nStopping+k
			default:
				ready, nReady = append(ready, part), nReady+k
			}
		}
	}
	slices.Sort(ready)
	slices.Sort(stopping)
	if nReady > 0 {
		fmt.Fprintf(w, "plus %d pooled (paused, ready for a create without --name; not listed): %s\n", nReady, strings.Join(ready, ", "))
	}
	if nStopping > 0 {
		fmt.Fprintf(w, "plus %d pooled of removed templates, being stopped: %s\n", nStopping, strings.Join(stopping, ", "))
	}
}

// sandboxEgressCmd is "sandbox egress".
func sandboxEgressCmd() *cobra.Command {
	var follow bool
	var after int64
	var limit int
	cmd := &cobra.Command{
		Use:   "egress ID|NAME",
		Short: "Print the flows a sandbox's boundary allowed or refused (-f to follow)",
		Long: `Print a sandbox's egress log: every flow its boundary allowed or refused —
when, where to (the name it asked for, the address reached), what it carried
each way, and the rule that decided. The node keeps the newest 1000 of each
sandbox, across its tiers, until it is deleted. --follow goes on printing new
flows until interrupted or the sandbox is deleted; --json prints the pages.`,
		Example: "  sandstormd sandbox egress web-1\n  sandstormd sandbox egress web-1 -f --after 120",
		Args:    cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			if after < 0 || limit < 0 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--after %d, --limit %d: neither may be negative", after, limit)}
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return c.EgressLog(cmd.Context(), args[0], after, limit, follow, os.Stdout)
			}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(c.EgressLog(cmd.Context(), args[0], after, limit, follow, pw)) }()
			last, err := printEgress(os.Stdout, pr)
			if err != nil || !follow || cmd.Context().Err() != nil {
				return err
			}
			return followEnded(os.Stderr, args[0], last)
		}),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing flows as they come")
	cmd.Flags().Int64Var(&after, "after", 0, "only flows after this SEQ")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many flows (0: all the node keeps)")
	return cmd
}

// followEnded is how a followed egress log that stopped ends, from its
// last page: a sandbox that left its node ends it (said on w, exit 0); a
// stream that stopped without saying so was cut, an error that gives the
// command to go on where it was.
func followEnded(w io.Writer, ref string, last api.EgressPage) error {
	if last.End == api.EgressEndGone {
		fmt.Fprintln(w, "(the sandbox is gone from its node: deleted, or moved, whose log starts again on its new node)")
		return nil
	}
	return fmt.Errorf("the egress log's stream was cut (sandstormd stopped or reloaded?); go on with: sandstormd sandbox egress %s -f --after %d", ref, last.Next)
}

// printEgress prints the egress log's pages read from r to w as a table,
// a line a flow, as they come. The header waits for the first page, so
// that a refusal (a sandbox not found) is all a person sees. Columns are
// as wide as the widest cell so far, so that a followed log's lines, a
// page each, stay under their header. It returns the last page read.
func printEgress(w io.Writer, r io.Reader) (api.EgressPage, error) {
	dec := json.NewDecoder(r)
	var t egressTable
	var last api.EgressPage
	for header := true; ; header = false {
		var p api.EgressPage
		if err := dec.Decode(&p); err == io.EOF {
			return last, nil
		} else if err != nil {
			return last, err
		}
		last = p
		var rows [][]string
		if header {
			rows = append(rows, []string{"SEQ", "TIME", "OUTCOME", "DESTINATION", "ADDRESS", "OUT", "IN", "SECRETS", "RULE"})
		}
		if p.Missed > 0 {
			rows = append(rows, []string{"…", "", fmt.Sprintf("%d older flows no longer kept", p.Missed)})
		}
		for _, f := range p.Items {
			// A name the boundary's DNS refused has no port: no flow followed.
			dest := f.Name
			if f.Port != 0 {
				dest = net.JoinHostPort(f.Name, strconv.Itoa(f.Port))
			}
			rows = append(rows, []string{strconv.FormatInt(f.Seq, 10), f.Time.Local().Format("15:04:05.000"), f.Outcome,
				dest, cmp.Or(f.Addr, "-"), strconv.FormatInt(f.BytesOut, 10), strconv.FormatInt(f.BytesIn, 10),
				cmp.Or(strings.Join(f.Secrets, ","), "-"), f.Rule})
		}
		t.print(w, rows)
	}
}

// egressTable prints rows in columns that only grow: each as wide as the
// widest cell it has had (the "…" row's long cell spans the rest).
type egressTable struct{ widths []int }

func (t *egressTable) print(w io.Writer, rows [][]string) {
	for _, row := range rows {
		if row[0] == "…" {
			continue
		}
		for i, c := range row {
			if i == len(t.widths) {
				t.widths = append(t.widths, 0)
			}
			t.widths[i] = max(t.widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			if i == len(row)-1 || row[0] == "…" && i == 2 {
				b.WriteString(c)
				break
			}
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", t.widths[i]-utf8.RuneCountInString(c)+2))
		}
		fmt.Fprintln(w, b.String())
	}
}

// sandboxCloneCmd is "sandbox clone".
func sandboxCloneCmd() *cobra.Command {
	var count int
	var clonePrincipal, reseedSignal string
	var reseedCommand []string
	clone := &cobra.Command{
		Use:   "clone ID|NAME",
		Short: "Make children of a sandbox from its memory",
		Long: `Make -n children of a sandbox from its memory: the parent is woken if it is not
hot (a detached one is cold-started, so its memory is new), paused for one
checkpoint (it keeps running after), and each child is a restore of
that image with its own name (<parent>-<n>), address, boundary, principal
(<parent's principal>.<n> unless --principal) and a copy of the parent's volume.

Every child starts from the parent's memory, random state included, so each
is reseeded right after its restore: --reseed-signal (sent to its process)
or --reseed-command (run inside it), or else the template's warm reseed; the
node refuses a clone with none.`,
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			if count < 1 || count > api.MaxClone {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("-n %d: clone 1 to %d at a time", count, api.MaxClone)}
			}
			if reseedSignal != "" || len(reseedCommand) > 0 {
				if err := checkReseed(reseedSignal, reseedCommand, "clone"); err != nil {
					return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
				}
			}
			req := api.CloneRequest{Count: count, Principal: clonePrincipal}
			if reseedSignal != "" || len(reseedCommand) > 0 {
				req.Reseed = &api.Reseed{Signal: reseedSignal, Command: reseedCommand}
			}
			res, err := c.Clone(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(res)
			}
			fmt.Printf("%s was paused %.1f ms\n", res.Parent.Name, res.ParentPauseMs)
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tADDRESS\tPRINCIPAL\tENDPOINTS\tMS")
			for i, sb := range res.Children {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.1f\n", sb.ID, sb.Name, sb.Address, sb.Principal, endpoints(sb), res.ChildMs[i])
			}
			return tw.Flush()
		}),
	}
	clone.Flags().IntVarP(&count, "count", "n", 1, "how many children (1-100)")
	clone.Flags().StringVar(&clonePrincipal, "principal", "", "the children's principal (default <parent's principal>.<n>)")
	clone.Flags().StringVar(&reseedSignal, "reseed-signal", "", "signal sent to each child's process after its restore: SIGHUP, SIGUSR1 or SIGUSR2")
	clone.Flags().StringArrayVar(&reseedCommand, "reseed-command", nil, "command run inside each child after its restore: the absolute path, then each argument as another --reseed-command")
	return clone
}

// sandboxMoveCmd is "sandbox move".
func sandboxMoveCmd() *cobra.Command {
	var to string
	move := &cobra.Command{
		Use:   "move ID|NAME [--to NODE]",
		Short: "Move a sandbox to another node: with its memory while its node answers, cold when its node is lost",
		Long: `While its node answers, a sandbox moves to another node with what
it holds (a live move): a running or frozen one is checkpointed, its image
and volume streamed through the master to the other node (--to, or the one
with the most headroom), and restored there in its tier; a snapshotted one
is streamed as it is, a detached one's volume alone. It keeps its ID,
name, principal, labels and lifetime; its endpoint URLs are the new
node's. It is not served while it moves (about a checkpoint, a copy and a
restore), and a move that fails leaves it whole on its node.

When its node is lost (it does not report to the master), it is started
again on another node instead: same name, template, principal and memory
limit, a new ID, a cold start. Its memory and its volume stay on the lost
node. That is a risk: the old copy may still be running there and
answering whoever can reach it, as the same principal, until the node
hears the master again. From that moment it is stopped and never runs
again (kept detached, with a principal that is no one's, only if its
volume holds files; delete it by its ID).`,
		Example: "  sandstormd sandbox move web-1\n  sandstormd sandbox move web-1 --to node-3",
		Args:    cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			sb, err := c.MoveTo(cmd.Context(), args[0], to)
			if err != nil {
				return err
			}
			if err := printSandbox(cmd, sb); err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); !j && sb.Note != "" {
				fmt.Println("note:", sb.Note)
			}
			return nil
		}),
	}
	move.Flags().StringVar(&to, "to", "", "the node to move it to (a live move only; default: the one with the most headroom)")
	return move
}

// pauseCmd is "sandbox pause": E2B's pause, on our own API.
func pauseCmd() *cobra.Command {
	var noMemory bool
	cmd := &cobra.Command{
		Use:   "pause ID|NAME",
		Short: "Pause a sandbox until 'sandbox resume' (traffic does not wake it, unlike an idle tier)",
		Long: "Pause a sandbox: it stays in the snapshot tier, processes and all (with --no-memory, the detached tier: its files only, " +
			"and the resume cold-boots it) until 'sandbox resume ID|NAME' or an E2B connect. Traffic through the master is answered 502 meanwhile. " +
			"'sandbox snapshot' instead is an idle tier: any call wakes it.",
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			sb, err := c.Pause(cmd.Context(), args[0], !noMemory)
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(sb)
			}
			fmt.Printf("%s: paused, %s; 'sandstormd sandbox resume %s' brings it back\n", sb.Name, tierText(sb), sb.Name)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&noMemory, "no-memory", false, "keep its files only (the detached tier); the resume cold-boots it")
	return cmd
}

// resumeCmd is "sandbox resume": the end of a pause.
func resumeCmd() *cobra.Command {
	return &cobra.Command{
		Use: "resume ID|NAME", Short: "Resume a paused sandbox (hot again)", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			start := time.Now()
			sb, err := c.Resume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(sb)
			}
			fmt.Printf("%s: %s (%.1f ms)\n", sb.Name, tierText(sb), float64(time.Since(start).Microseconds())/1000)
			return nil
		}),
	}
}

// transitionCmds are "sandbox freeze|snapshot|detach|wake".
func transitionCmds() []*cobra.Command {
	var cmds []*cobra.Command
	for _, op := range []struct{ name, short string }{
		{"freeze", "Pause a hot sandbox in place"},
		{"snapshot", "Checkpoint a sandbox to the node's disk and release its memory and network namespace"},
		{"detach", "Drop a sandbox to its volume only (the next wake is a cold start)"},
		{"wake", "Bring a sandbox back to hot from any tier"},
	} {
		op := op
		cmds = append(cmds, &cobra.Command{
			Use: op.name + " ID|NAME", Short: op.short, Args: cobra.ExactArgs(1),
			RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
				start := time.Now()
				sb, err := c.Transition(cmd.Context(), args[0], op.name)
				if err != nil {
					return err
				}
				if j, _ := cmd.Flags().GetBool("json"); j {
					return printJSON(sb)
				}
				fmt.Printf("%s: %s (%.1f ms)\n", sb.Name, tierText(sb), float64(time.Since(start).Microseconds())/1000)
				if sb.Note != "" {
					fmt.Println("note:", sb.Note)
				}
				return nil
			}),
		})
	}
	return cmds
}

var flagNames = strings.NewReplacer("allow_out", "--allow-out", "deny_out", "--deny-out")

// egressFlags are --allow-out and --deny-out as the API's rules (nil with
// neither), checked here first so that a typo exits 2 before the API.
func egressFlags(allow, deny []string) (*api.Egress, error) {
	if len(allow) == 0 && len(deny) == 0 {
		return nil, nil
	}
	if len(deny) == 0 {
		// As in E2B, allow_out only makes exceptions to deny_out: alone
		// it would be accepted and change nothing.
		return nil, errors.New("--allow-out makes exceptions to --deny-out and does nothing alone; add --deny-out 0.0.0.0/0 to let out only what --allow-out names")
	}
	if _, err := egress.Parse(allow, deny); err != nil {
		// Parse names the API's fields; here they are flags.
		return nil, errors.New(flagNames.Replace(err.Error()))
	}
	return &api.Egress{AllowOut: allow, DenyOut: deny}, nil
}
