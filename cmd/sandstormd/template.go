package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/client"
	"sandstorm/internal/demo"
	"sandstorm/internal/ociimage"
)

func templateCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage templates (a rootfs plus the process to run in it)"}
	addAPIFlag(cmd)
	cmd.AddCommand(templateCreateCmd(), templateBuildCmd(), templateDemoCmd(), templateLsCmd(), templateRmCmd(), templateExportCmd())
	return cmd
}

// templateCreateCmd is "template create".
func templateCreateCmd() *cobra.Command {
	var (
		rootfsDir, tarball string
		image, regAuth     string
		workdir, user      string
		env                []string
		ports              []int
		memMiB             int
		tmplPrincipal      string
		warmProbe          string
		warmSignal         string
		warmCommand        []string
		warmPool           int
		envdInit           bool
		envdUser, envdDir  string
	)
	create := &cobra.Command{
		Use:   "create NAME (--image REF | --rootfs-dir DIR | --tarball FILE) [-- ARGS...]",
		Short: "Register a template from an OCI image, a rootfs directory on the node or a tarball (plain or gzip)",
		Long: `Register a template. From an image (--image), the master pulls it and
the image's config gives what the flags leave unsaid: the process
(Entrypoint + Cmd; ARGS after -- replace both), the environment (--env adds or replaces by
key), the working directory, the user and the exposed ports. REF is a
registry reference (host[:port]/repo:tag or @sha256:…), oci:DIR (an OCI
image layout) or docker-archive:FILE (a docker save tarball); paths are on
the master's machine. A registry's credential comes from --registry-auth
(a file in Docker's config.json format) or the master's own Docker config;
it is sent for this pull only and never logged.
From a rootfs directory or tarball, ARGS say what to run.`,
		Example: `  sandstormd template create py --image registry.example.com/team/python:3.12 --port 8000 -- python3 -m http.server 8000
  sandstormd template create app --image docker-archive:/tmp/app.tar --registry-auth ~/.docker/config.json
  sandstormd template create web --rootfs-dir /srv/rootfs --port 8000 -- /usr/bin/python3 /srv/app.py
  sandstormd template create web --tarball rootfs.tar.gz --port 8000 -- /bin/busybox httpd -f -p 8000`,
		// Checked before the API is reached: a usage error exits 2
		// whether or not a daemon runs.
		Args: cobra.MatchAll(cobra.MinimumNArgs(1), func(cmd *cobra.Command, args []string) error {
			return checkSource(templateSource{dir: rootfsDir, tarball: tarball, image: image, auth: regAuth}, len(args) > 1)
		}),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			req := api.TemplateRequest{Name: args[0], Process: api.Process{Args: args[1:], Env: env, Cwd: workdir, User: user}, Ports: ports, MemoryMiB: memMiB, Principal: tmplPrincipal}
			if envdInit {
				req.Process.Envd = &api.Envd{User: envdUser, Workdir: envdDir}
			} else if envdUser != "" || envdDir != "" {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--envd-user and --envd-workdir go with --envd-init")}
			}
			if warmProbe != "" || warmSignal != "" || len(warmCommand) > 0 || cmd.Flags().Changed("warm-pool") {
				w, err := warmFlags(warmProbe, warmSignal, warmCommand, warmPool)
				if err != nil {
					return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
				}
				req.Warm = w
				fmt.Fprintf(os.Stderr, "starting %s once to make its warm image (it waits for the probe)…\n", req.Name)
			}
			t, err := createTemplate(cmd, c, req, templateSource{dir: rootfsDir, tarball: tarball, image: image, auth: regAuth})
			if err != nil {
				return err
			}
			fmt.Printf("template %s registered (rootfs %s)\n", t.Name, t.Rootfs)
			if t.Image != "" {
				fmt.Printf("from %s: %s\n", t.Image, strings.Join(t.Process.Args, " "))
			}
			if t.Warm != nil {
				fmt.Printf("its warm image is made; %d sandbox(es) kept ready (a create without --name takes one)\n", t.Warm.Pool)
			}
			return nil
		}),
	}
	create.Flags().StringVar(&image, "image", "", "OCI image: host[:port]/repo:tag, …@sha256:…, oci:DIR or docker-archive:FILE (on the master's machine)")
	create.Flags().StringVar(&regAuth, "registry-auth", "", "with --image: registry credentials, a file in Docker's config.json format (default: the master's ~/.docker/config.json)")
	create.Flags().StringVar(&workdir, "workdir", "", "working directory of the process (default: the image's, or /)")
	create.Flags().StringVar(&user, "user", "", "user of the process: UID:GID, or with --image a name or uid in the image's /etc/passwd (default: the image's, or root)")
	create.Flags().StringVar(&rootfsDir, "rootfs-dir", "", "rootfs directory already on the node")
	create.Flags().StringVar(&tarball, "tarball", "", "rootfs tarball to upload")
	create.Flags().StringArrayVar(&env, "env", nil, "environment KEY=VALUE (repeatable)")
	create.Flags().IntSliceVar(&ports, "port", nil, "TCP port the process serves (repeatable); each gets a gateway endpoint (default with --image: its exposed ports)")
	create.Flags().StringVar(&warmProbe, "warm-probe", "", "make the template warm: started once, checkpointed when this answers (/PATH: HTTP GET on the first port; :PORT/PATH or :PORT: another port, TCP connect without a path; cmd:COMMAND: a shell command run inside, as root, until it exits 0); needs --reseed-signal or --reseed-command")
	create.Flags().StringVar(&warmSignal, "reseed-signal", "", "warm template: signal sent to each sandbox's process right after its restore (SIGHUP, SIGUSR1, SIGUSR2)")
	create.Flags().IntVar(&warmPool, "warm-pool", 1, "warm template: sandboxes each node keeps restored and paused ahead of demand; a create without --name takes one and is ready in a resume and a reseed (0 to 16; each costs a frozen sandbox's memory)")
	create.Flags().StringArrayVar(&warmCommand, "reseed-command", nil, "warm template: command run inside each sandbox right after its restore: the absolute path, then each argument as another --reseed-command")
	create.Flags().IntVar(&memMiB, "memory", 0, "memory limit of its sandboxes in MiB (0: the daemon's --sandbox-memory)")
	create.Flags().StringVar(&tmplPrincipal, "principal", "", "principal of its sandboxes (default: each sandbox's name)")
	create.Flags().BoolVar(&envdInit, "envd-init", false, "run envd (commands and files, the E2B API) as its sandboxes' init, with ARGS under it, as E2B templates do; without it envd starts on a sandbox's first command")
	create.Flags().StringVar(&envdUser, "envd-user", "", "with --envd-init: the user commands run as and files belong to when a call names none (default root)")
	create.Flags().StringVar(&envdDir, "envd-workdir", "", "with --envd-init: a command's directory when it names none (default the user's home)")
	return create
}

// warmFlags is the Warm the --warm-* and --reseed-* flags say.
func warmFlags(probe, signal string, command []string, pool int) (*api.Warm, error) {
	p, err := parseProbe(probe)
	if err == nil {
		err = checkReseed(signal, command, "a warm template")
	}
	if err == nil && (pool < 0 || pool > api.MaxWarmPool) {
		err = fmt.Errorf("--warm-pool %d: keep 0 to %d sandboxes ready", pool, api.MaxWarmPool)
	}
	if err != nil {
		return nil, err
	}
	return &api.Warm{Probe: p, Reseed: api.Reseed{Signal: signal, Command: command}, Pool: pool}, nil
}

// templateSource is where "template create" takes the rootfs from.
type templateSource struct{ dir, tarball, image, auth string }

// checkSource refuses a create that names no source or two, or no
// process where there is no image to take it from.
func checkSource(src templateSource, hasArgs bool) error {
	given := 0
	for _, s := range []string{src.dir, src.tarball, src.image} {
		if s != "" {
			given++
		}
	}
	switch {
	case given != 1:
		return fmt.Errorf("give exactly one of --image, --rootfs-dir and --tarball")
	case src.auth != "" && src.image == "":
		return fmt.Errorf("--registry-auth goes with --image")
	case src.image == "" && !hasArgs:
		return fmt.Errorf("say what to run after -- (only an --image template takes its process from the image)")
	}
	return nil
}

// createTemplate registers req from the one source given (checkSource).
func createTemplate(cmd *cobra.Command, c *client.Client, req api.TemplateRequest, src templateSource) (api.Template, error) {
	switch {
	case src.image != "":
		auth, err := registryAuth(src.image, src.auth)
		if err != nil {
			return api.Template{}, err
		}
		req.Image = &api.ImageSource{Ref: src.image, Auth: auth}
		return c.CreateTemplateEvents(cmd.Context(), req, func(l string) { fmt.Fprint(os.Stderr, l) })
	case src.dir != "":
		var err error
		if req.RootfsDir, err = filepath.Abs(src.dir); err != nil {
			return api.Template{}, err
		}
		return c.CreateTemplate(cmd.Context(), req)
	}
	f, err := os.Open(src.tarball)
	if err != nil {
		return api.Template{}, err
	}
	defer f.Close()
	return c.UploadTemplate(cmd.Context(), req, f)
}

// registryAuth is the credential file's entry for ref's registry (nil
// without a file: the master then reads its own Docker config).
func registryAuth(ref, file string) (*api.RegistryAuth, error) {
	if file == "" {
		return nil, nil
	}
	src, err := ociimage.ParseSource(ref)
	if err != nil {
		return nil, err
	}
	if src.Kind != ociimage.Registry {
		return nil, fmt.Errorf("--registry-auth: %s is not in a registry", ref)
	}
	kc, err := ociimage.Keychain(file)
	if err != nil {
		return nil, err
	}
	a, err := kc.Resolve(src.Ref.Context())
	if err != nil {
		return nil, err
	}
	cfg, err := a.Authorization()
	if err != nil {
		return nil, err
	}
	if cfg.Username == "" && cfg.Password == "" {
		return nil, fmt.Errorf("--registry-auth %s has no entry for %s", file, src.Ref.Context().RegistryStr())
	}
	return &api.RegistryAuth{Username: cfg.Username, Password: cfg.Password}, nil
}

// templateDemoCmd is "template demo".
func templateDemoCmd() *cobra.Command {
	var (
		demoDir   string
		cold      bool
		as        string
		principal string
	)
	demoC := &cobra.Command{
		Use:   "demo NAME",
		Short: "Build a demo rootfs (Debian 12, from Debian's packages) and register it (" + strings.Join(demo.Names(), ", ") + ")",
		Long: `Build a demo template, then register it. All but node are Debian 12
installed by mmdebstrap from deb.debian.org, as debian:bookworm-slim is, plus
the demo's packages (downloads kept in ` + demo.AptCacheDir + `; build as root).
  web    a Python HTTP server on port 8000 that counts requests in memory
  app64  the same server after importing numpy and filling a 64 MiB heap
  node   the same counting server in Node.js 20, which Debian 12 lacks: this
         machine's /usr/bin/node (NodeSource's) and its libraries are copied
  nginx  nginx answering "count=<connection number>" on port 8000
  base   the E2B SDK's default template: Debian with bash, coreutils, python3
         and pip, git, sudo, and a user "user" (uid 1000, home /home/user)
         who may sudo without a password; envd is its sandboxes' init and
         runs commands as user; no port; warm (probed on envd's /health, one
         sandbox kept ready per node) unless --cold.
  code-interpreter
         E2B's code interpreter: base with Python's ipykernel, numpy, pandas
         and matplotlib, R with IRkernel, Node.js with TypeScript's
         compiler and the JDK (JShell), serving @e2b/code-interpreter on
         port 49999 with a Python kernel running (warm; Python, R,
         JavaScript, TypeScript, Java and bash cells); 1.8 GB, about 5
         minutes to build on 2 cores; --name code-interpreter-v1
         registers it as the SDK's default template.
The rootfs goes to <data-dir>/demo/NAME unless --dir says otherwise. Needed
packages: apt-get install -y ` + strings.Join(demoPackages(), " "),
		Args: cobra.MatchAll(cobra.ExactArgs(1), func(_ *cobra.Command, args []string) error {
			if !slices.Contains(demo.Names(), args[0]) {
				return fmt.Errorf("no demo %q: one of %s", args[0], strings.Join(demo.Names(), ", "))
			}
			if principal != "" && !api.ValidPrincipal(principal) {
				return fmt.Errorf("--principal %q: use 1-128 of a-z, A-Z, 0-9 and '._-'", principal)
			}
			return nil
		}),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			name := args[0]
			if as != "" {
				name = as
			}
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
			fmt.Fprintf(os.Stderr, "building the %s demo's rootfs in %s (Debian 12 by mmdebstrap: a minute or more, code-interpreter about 5, longer while packages first download)…\n", args[0], dir)
			stop := stillGoing(os.Stderr, "still building", 15*time.Second)
			d, err := demo.Build(args[0], dir)
			stop()
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "built %s rootfs in %s (%.1fs)\n", name, dir, time.Since(start).Seconds())
			req := api.TemplateRequest{Name: name, RootfsDir: dir, Process: api.Process{Args: d.Args, Env: d.Env, Envd: d.Envd}, Ports: d.Ports, Principal: principal}
			if !cold {
				req.Warm = d.Warm
			}
			if req.Warm != nil {
				fmt.Fprintf(os.Stderr, "starting %s once to make its warm image (it waits for the probe)…\n", name)
			}
			t, err := c.CreateTemplate(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Printf("template %s registered (rootfs %s, port %v)\n", t.Name, t.Rootfs, t.Ports)
			if t.Warm != nil {
				fmt.Printf("its warm image is made; %d sandbox(es) kept ready (a create without --name takes one)\n", t.Warm.Pool)
			}
			return nil
		}),
	}
	demoC.Flags().StringVar(&demoDir, "dir", "", "where to build the rootfs (default <data-dir>/demo/NAME)")
	demoC.Flags().StringVar(&as, "name", "", "register it under this name (default the demo's)")
	demoC.Flags().StringVar(&principal, "principal", "", "principal of its sandboxes, which the mesh's policy grants to (default: each sandbox's name; an E2B SDK sandbox, which has none, is sb-<id>): e.g. base --name mcp-gateway --principal agent for E2B's MCP")
	demoC.Flags().BoolVar(&cold, "cold", false, "register a warm demo (base) without its warm image: each sandbox starts cold (needed where the backend cannot checkpoint)")
	return demoC
}

// stillGoing says what is under way on w every period, with how long it
// has taken, until the function it returns is called: long work shows it
// is not stuck.
func stillGoing(w io.Writer, what string, period time.Duration) (stop func()) {
	start, done := time.Now(), make(chan struct{})
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(w, "  %s (%.0fs)…\n", what, time.Since(start).Seconds())
			}
		}
	}()
	return func() { close(done) }
}

// templateLsCmd is "template ls".
func templateLsCmd() *cobra.Command {
	ls := &cobra.Command{
		Use: "ls", Short: "List templates", Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, _ []string) error {
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
		}),
	}
	return ls
}

// templateRmCmd is "template rm".
func templateRmCmd() *cobra.Command {
	rm := &cobra.Command{
		Use: "rm NAME...", Short: "Remove templates no sandbox uses", Args: cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			for _, a := range args {
				if err := c.DeleteTemplate(cmd.Context(), a); err != nil {
					return err
				}
				fmt.Println("removed", a)
			}
			return nil
		}),
	}
	return rm
}
