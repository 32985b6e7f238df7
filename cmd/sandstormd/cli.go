package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/client"
	"sandstorm/internal/demo"
)

// apiClient builds a client from --api and the token (SANDSTORM_TOKEN, or
// <data-dir>/pki/api-token).
func apiClient(cmd *cobra.Command) (*client.Client, error) {
	base, _ := cmd.Flags().GetString("api")
	tok, from := os.Getenv("SANDSTORM_TOKEN"), "SANDSTORM_TOKEN"
	if tok == "" {
		dd, _ := cmd.Flags().GetString("data-dir")
		var err error
		if tok, err = client.ReadToken(dd); err != nil {
			return nil, err
		}
		from = filepath.Join(dd, "pki", "api-token")
	}
	c := client.New(base, tok)
	c.TokenFrom = from
	if strings.HasPrefix(base, "https://") {
		ca, _ := cmd.Flags().GetString("ca")
		if ca == "" {
			dd, _ := cmd.Flags().GetString("data-dir")
			ca = client.CAFile(dd)
		}
		if err := c.TrustCA(ca); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func addAPIFlag(cmd *cobra.Command) {
	cmd.PersistentFlags().String("api", envOr("SANDSTORM_API", "https://127.0.0.1:8080"), "sandstormd API URL (env SANDSTORM_API); the token comes from SANDSTORM_TOKEN or <data-dir>/pki/api-token")
	cmd.PersistentFlags().String("ca", os.Getenv("SANDSTORM_CA"), "CA certificate the API's HTTPS is checked against (env SANDSTORM_CA; default <data-dir>/pki/ca.pem, the master's own CA)")
	cmd.PersistentFlags().Bool("json", false, "print JSON instead of a table")
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func templateCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage templates (a rootfs plus the process to run in it)"}
	addAPIFlag(cmd)
	var (
		rootfsDir, tarball string
		env                []string
		ports              []int
		memMiB             int
		tmplPrincipal      string
		warmProbe          string
		warmSignal         string
		warmCommand        []string
		warmPool           int
	)
	create := &cobra.Command{
		Use:   "create NAME --rootfs-dir DIR|--tarball FILE -- ARGS...",
		Short: "Register a template from a rootfs directory on the node or a tarball (plain or gzip)",
		Example: `  sandstormd template create web --rootfs-dir /srv/rootfs --port 8000 -- /usr/bin/python3 /srv/app.py
  sandstormd template create web --tarball rootfs.tar.gz --port 8000 -- /bin/busybox httpd -f -p 8000`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			req := api.TemplateRequest{Name: args[0], Process: api.Process{Args: args[1:], Env: env}, Ports: ports, MemoryMiB: memMiB, Principal: tmplPrincipal}
			if warmProbe != "" || warmSignal != "" || len(warmCommand) > 0 || cmd.Flags().Changed("warm-pool") {
				probe, err := parseProbe(warmProbe)
				if err == nil {
					err = checkReseed(warmSignal, warmCommand, "a warm template")
				}
				if err == nil && (warmPool < 0 || warmPool > api.MaxWarmPool) {
					err = fmt.Errorf("--warm-pool %d: keep 0 to %d sandboxes ready", warmPool, api.MaxWarmPool)
				}
				if err != nil {
					return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
				}
				req.Warm = &api.Warm{Probe: probe, Reseed: api.Reseed{Signal: warmSignal, Command: warmCommand}, Pool: warmPool}
				fmt.Fprintf(os.Stderr, "starting %s once to make its warm image (it waits for the probe)…\n", req.Name)
			}
			var t api.Template
			switch {
			case rootfsDir != "" && tarball == "":
				if req.RootfsDir, err = filepath.Abs(rootfsDir); err != nil {
					return err
				}
				t, err = c.CreateTemplate(cmd.Context(), req)
			case tarball != "" && rootfsDir == "":
				f, ferr := os.Open(tarball)
				if ferr != nil {
					return ferr
				}
				defer f.Close()
				t, err = c.UploadTemplate(cmd.Context(), req, f)
			default:
				return fmt.Errorf("give exactly one of --rootfs-dir and --tarball")
			}
			if err != nil {
				return err
			}
			fmt.Printf("template %s registered (rootfs %s)\n", t.Name, t.Rootfs)
			if t.Warm != nil {
				fmt.Printf("its warm image is made; %d sandbox(es) kept ready (a create without --name takes one)\n", t.Warm.Pool)
			}
			return nil
		},
	}
	create.Flags().StringVar(&rootfsDir, "rootfs-dir", "", "rootfs directory already on the node")
	create.Flags().StringVar(&tarball, "tarball", "", "rootfs tarball to upload")
	create.Flags().StringArrayVar(&env, "env", nil, "environment KEY=VALUE (repeatable)")
	create.Flags().IntSliceVar(&ports, "port", nil, "TCP port the process serves (repeatable); each gets a gateway endpoint")
	create.Flags().StringVar(&warmProbe, "warm-probe", "", "make the template warm: started once, checkpointed when this answers (/PATH: HTTP GET on the first port; :PORT/PATH or :PORT: another port, TCP connect without a path); needs --reseed-signal or --reseed-command")
	create.Flags().StringVar(&warmSignal, "reseed-signal", "", "warm template: signal sent to each sandbox's process right after its restore (SIGHUP, SIGUSR1, SIGUSR2)")
	create.Flags().IntVar(&warmPool, "warm-pool", 1, "warm template: sandboxes each node keeps restored and paused ahead of demand; a create without --name takes one and is ready in a resume and a reseed (0 to 16; each costs a frozen sandbox's memory)")
	create.Flags().StringArrayVar(&warmCommand, "reseed-command", nil, "warm template: command run inside each sandbox right after its restore: the absolute path, then each argument as another --reseed-command")
	create.Flags().IntVar(&memMiB, "memory", 0, "memory limit of its sandboxes in MiB (0: the daemon's --sandbox-memory)")
	create.Flags().StringVar(&tmplPrincipal, "principal", "", "principal of its sandboxes (default: each sandbox's name)")

	var demoDir string
	demoC := &cobra.Command{
		Use:   "demo NAME",
		Short: "Build a demo rootfs from this machine's Debian packages and register it (" + strings.Join(demo.Names(), ", ") + ")",
		Long: `Build a demo template from Debian packages only, then register it.
  web    a Python HTTP server on port 8000 that counts requests in memory
  app64  the same server after importing numpy and filling a 64 MiB heap
  node   the same counting server in Node.js (only /usr/bin/node is copied)
  nginx  nginx answering "count=<connection number>" on port 8000
The rootfs goes to <data-dir>/demo/NAME unless --dir says otherwise. Needed
packages: apt-get install -y ` + strings.Join(demoPackages(), " "),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			name := args[0]
			if ts, err := c.Templates(cmd.Context()); err == nil {
				for _, t := range ts {
					if t.Name == name {
						fmt.Printf("template %s is already registered (rootfs %s); 'sandstormd template rm %s' first to rebuild it\n", name, t.Rootfs, name)
						return nil
					}
				}
			}
			dir := demoDir
			if dir == "" {
				dd, _ := cmd.Flags().GetString("data-dir")
				dir = filepath.Join(dd, "demo", name)
			}
			if _, err := os.Stat(dir); err == nil {
				fmt.Fprintf(os.Stderr, "rebuilding %s\n", dir)
				if err := os.RemoveAll(dir); err != nil {
					return err
				}
			}
			start := time.Now()
			d, err := demo.Build(name, dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "built %s rootfs in %s (%.1fs)\n", name, dir, time.Since(start).Seconds())
			t, err := c.CreateTemplate(cmd.Context(), api.TemplateRequest{Name: name, RootfsDir: dir, Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports})
			if err != nil {
				return err
			}
			fmt.Printf("template %s registered (rootfs %s, port %v)\n", t.Name, t.Rootfs, t.Ports)
			return nil
		},
	}
	demoC.Flags().StringVar(&demoDir, "dir", "", "where to build the rootfs (default <data-dir>/demo/NAME)")

	ls := &cobra.Command{
		Use: "ls", Short: "List templates", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			ts, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(ts)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPORTS\tPROCESS\tROOTFS\tWARM")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\n", t.Name, t.Ports, strings.Join(t.Process.Args, " "), t.Rootfs, warmText(t.Warm))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use: "rm NAME...", Short: "Remove templates no sandbox uses", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			for _, a := range args {
				if err := c.DeleteTemplate(cmd.Context(), a); err != nil {
					return err
				}
				fmt.Println("removed", a)
			}
			return nil
		},
	}
	cmd.AddCommand(create, demoC, ls, rm)
	return cmd
}

func sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sb"}, Short: "Manage sandboxes"}
	addAPIFlag(cmd)
	var name, principal string
	create := &cobra.Command{
		Use: "create TEMPLATE", Short: "Start a sandbox from a template (returns when it runs)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("name") && name == "" {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: errors.New("--name is empty: give a name (1-63 of a-z, 0-9 and '-'), or leave --name out for sb-<id>")}
			}
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			sb, err := c.CreateSandbox(cmd.Context(), api.SandboxRequest{Template: args[0], Name: name, Principal: principal})
			if err != nil {
				return err
			}
			return printSandbox(cmd, sb)
		},
	}
	create.Flags().StringVar(&name, "name", "", "sandbox name (default sb-<id>)")
	create.Flags().StringVar(&principal, "principal", "", "who the sandbox is to its boundary and the mesh (default: the template's principal, else the sandbox name)")
	ls := &cobra.Command{
		Use: "ls", Short: "List sandboxes with their tier and endpoints", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			sbs, err := c.Sandboxes(cmd.Context())
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
				var parts []string
				total := 0
				for _, n := range nodes.Items {
					for tmpl, k := range n.WarmPool {
						if k > 0 {
							parts = append(parts, fmt.Sprintf("%d of %s on %s", k, tmpl, n.Name))
							total += k
						}
					}
				}
				if total > 0 {
					slices.Sort(parts)
					fmt.Printf("plus %d pooled (paused, ready for a create without --name; not listed): %s\n", total, strings.Join(parts, ", "))
				}
			}
			return nil
		},
	}
	get := &cobra.Command{
		Use: "get ID|NAME", Short: "Show one sandbox as JSON", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			sb, err := c.Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(sb)
		},
	}
	rm := &cobra.Command{
		Use: "rm ID|NAME...", Short: "Remove sandboxes and everything they had", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			for _, a := range args {
				if err := c.DeleteSandbox(cmd.Context(), a); err != nil {
					return err
				}
				fmt.Println("removed", a)
			}
			return nil
		},
	}
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
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			return c.Logs(cmd.Context(), args[0], follow, stamps, os.Stdout)
		},
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing what the sandbox writes")
	logs.Flags().BoolVarP(&stamps, "timestamps", "t", false, "start every line with the time it was written (\"-\" for lines written while sandstormd was not running)")
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
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
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
		},
	}
	clone.Flags().IntVarP(&count, "count", "n", 1, "how many children (1-100)")
	clone.Flags().StringVar(&clonePrincipal, "principal", "", "the children's principal (default <parent's principal>.<n>)")
	clone.Flags().StringVar(&reseedSignal, "reseed-signal", "", "signal sent to each child's process after its restore: SIGHUP, SIGUSR1 or SIGUSR2")
	clone.Flags().StringArrayVar(&reseedCommand, "reseed-command", nil, "command run inside each child after its restore: the absolute path, then each argument as another --reseed-command")
	move := &cobra.Command{
		Use:   "move ID|NAME",
		Short: "Start a sandbox whose node is lost again, cold, on another node",
		Long: `Start a sandbox whose node is lost (it does not report to the master)
again on another node: same name, template, principal and memory limit, a
new ID, a cold start. Its memory and its volume stay on the lost node.

A move while the node is lost is a risk: the old copy may still be running
there and answering whoever can reach it, as the same principal, until
the node hears the master again. From that moment it is stopped and never
runs again (kept detached, with a principal that is no one's, only if its
volume holds files; delete it by its ID). A sandbox whose node answers is
not moved.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			sb, err := c.Move(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := printSandbox(cmd, sb); err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); !j {
				fmt.Println("note:", sb.Note)
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, get, rm, logs, clone, move)
	for _, op := range []struct{ name, short string }{
		{"freeze", "Pause a hot sandbox in place"},
		{"snapshot", "Checkpoint a sandbox to the node's disk and release its memory and network namespace"},
		{"detach", "Drop a sandbox to its volume only (the next wake is a cold start)"},
		{"wake", "Bring a sandbox back to hot from any tier"},
	} {
		op := op
		cmd.AddCommand(&cobra.Command{
			Use: op.name + " ID|NAME", Short: op.short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := apiClient(cmd)
				if err != nil {
					return err
				}
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
			},
		})
	}
	return cmd
}

func tierText(sb api.Sandbox) string {
	if sb.LeftBehind {
		return string(sb.Tier) + " (left behind)"
	}
	if sb.Transition != "" {
		return string(sb.Tier) + "→" + string(sb.Transition)
	}
	return string(sb.Tier)
}

func endpoints(sb api.Sandbox) string {
	keys := make([]string, 0, len(sb.Endpoints))
	for k := range sb.Endpoints {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"→"+sb.Endpoints[k])
	}
	return strings.Join(parts, " ")
}

func printSandbox(cmd *cobra.Command, sb api.Sandbox) error {
	if j, _ := cmd.Flags().GetBool("json"); j {
		return printJSON(sb)
	}
	fmt.Printf("%s (%s) %s, address %s\n", sb.Name, sb.ID, tierText(sb), sb.Address)
	for _, e := range strings.Fields(endpoints(sb)) {
		fmt.Println("  ", e)
	}
	ports := make([]string, 0, len(sb.HostEndpoints))
	for p := range sb.HostEndpoints {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	for _, p := range ports {
		fmt.Printf("   %s→%s (by Host, HTTP only)\n", p, sb.HostEndpoints[p])
	}
	if sb.Boundary != "" {
		fmt.Printf("   boundary (principal %s): %s\n", sb.Principal, sb.Boundary)
	}
	return nil
}

// demoPackages is every Debian package the demos need, once each.
func demoPackages() []string {
	var out []string
	for _, name := range demo.Names() {
		for _, p := range demo.Packages(name) {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// parseProbe reads --warm-probe: "/healthz" (HTTP on the first port),
// ":8080/healthz", ":8080" (TCP connect), or "" (TCP connect to the first
// port).
func parseProbe(s string) (api.Probe, error) {
	var p api.Probe
	if s == "" || strings.HasPrefix(s, "/") {
		p.Path = s
		return p, nil
	}
	rest, ok := strings.CutPrefix(s, ":")
	if !ok {
		return p, fmt.Errorf("--warm-probe %q: want /PATH, :PORT or :PORT/PATH", s)
	}
	port, path, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return p, fmt.Errorf("--warm-probe %q: bad port %q", s, port)
	}
	p.Port = n
	if path != "" {
		p.Path = "/" + path
	}
	return p, nil
}

// checkReseed is the CLI's own check of a reseed (the node checks again):
// a signal it takes or an absolute command, exactly one, for what.
func checkReseed(signal string, command []string, what string) error {
	switch {
	case signal == "" && len(command) == 0:
		return fmt.Errorf("%s needs --reseed-signal (e.g. SIGUSR1) or --reseed-command: each of its sandboxes starts from the same memory, random state included", what)
	case signal != "" && len(command) > 0:
		return errors.New("give --reseed-signal or --reseed-command, not both")
	case signal != "":
		if _, ok := api.ReseedSignal(signal); !ok {
			return fmt.Errorf("--reseed-signal %q: use one of %s", signal, strings.Join(api.ReseedSignals(), ", "))
		}
	case !strings.HasPrefix(command[0], "/"):
		return fmt.Errorf("--reseed-command %q: give the absolute path of the command inside the rootfs", command[0])
	}
	return nil
}

// warmText says how a template is warm, for template ls ("-": it is not).
func warmText(w *api.Warm) string {
	if w == nil {
		return "-"
	}
	probe := "tcp"
	if w.Probe.Path != "" {
		probe = w.Probe.Path
	}
	if w.Probe.Port != 0 {
		probe = ":" + strconv.Itoa(w.Probe.Port) + probe
	}
	reseed := w.Reseed.Signal
	if reseed == "" {
		reseed = strings.Join(w.Reseed.Command, " ")
	}
	return "probe " + probe + ", reseed " + reseed + ", pool " + strconv.Itoa(w.Pool)
}
