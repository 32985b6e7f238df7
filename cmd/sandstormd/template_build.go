package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/client"
	"sandstorm/internal/rootfs"
)

// templateBuildCmd is "template build".
func templateBuildCmd() *cobra.Command {
	var (
		file, target string
		buildArgs    []string
		env          []string
		ports        []int
		memMiB       int
		warmProbe    string
		warmSignal   string
		warmCommand  []string
		warmPool     int
	)
	build := &cobra.Command{
		Use:   "build NAME [-f Dockerfile] [--build-arg K=V]... DIR",
		Short: "Build a template from a Dockerfile, each RUN in a gVisor sandbox of a node",
		Long: `Build a template from a Dockerfile over the build context DIR (its
.dockerignore is honoured) and register it. FROM takes an image (as
"template create --image" does), scratch or a template's name; RUN runs in
a sandbox whose only way out is its boundary, as the master's build
principal (--build-principal of serve; the operator's policy says which
mirrors it reaches); COPY and ADD read DIR only. Each step is cached by
its parent and its content: a rebuild after a one-line change reruns that
step and those after it. Output streams as the steps run; a failing step
names its line, and nothing of the build is registered.`,
		Example: `  sandstormd template build app -f Dockerfile --build-arg VERSION=2 ./app
  sandstormd template build web --port 8000 --warm-probe / --reseed-signal SIGUSR1 .`,
		// Checked before the API is reached: a usage error exits 2
		// whether or not a daemon runs.
		Args: cobra.MatchAll(cobra.ExactArgs(2), func(_ *cobra.Command, args []string) error {
			if _, err := keyValues("--build-arg", buildArgs); err != nil {
				return err
			}
			if fi, err := os.Stat(args[1]); err != nil || !fi.IsDir() {
				return fmt.Errorf("build context %s is not a directory", args[1])
			}
			return nil
		}),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			name, dir := args[0], args[1]
			req := api.BuildRequest{Target: target, Template: api.TemplateRequest{Process: api.Process{Env: env}, Ports: ports, MemoryMiB: memMiB}}
			var err error
			if req.BuildArgs, err = keyValues("--build-arg", buildArgs); err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			if warmProbe != "" || warmSignal != "" || len(warmCommand) > 0 || cmd.Flags().Changed("warm-pool") {
				if req.Template.Warm, err = warmFlags(warmProbe, warmSignal, warmCommand, warmPool); err != nil {
					return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
				}
			}
			if file == "" {
				file = filepath.Join(dir, "Dockerfile")
			}
			df, err := os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("the Dockerfile: %w (say which with -f)", err)
			}
			req.Dockerfile = string(df)
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(rootfs.Pack(dir, pw)) }()
			defer pr.Close()
			fmt.Fprintf(os.Stderr, "sending the build context %s and building %s…\n", dir, name)
			t, err := c.BuildTemplate(cmd.Context(), name, req, pr, func(s string) { fmt.Fprint(os.Stdout, s) })
			if err != nil {
				return err
			}
			fmt.Printf("template %s built and registered: %s\n", t.Name, strings.Join(t.Process.Args, " "))
			return nil
		}),
	}
	f := build.Flags()
	f.StringVarP(&file, "file", "f", "", "the Dockerfile (default DIR/Dockerfile)")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "a build argument K=V (repeatable)")
	f.StringVar(&target, "target", "", "the stage to build (default the last)")
	f.StringArrayVar(&env, "env", nil, "environment KEY=VALUE added to the image's (repeatable)")
	f.IntSliceVar(&ports, "port", nil, "TCP port the process serves (repeatable; default the image's EXPOSE)")
	f.IntVar(&memMiB, "memory", 0, "memory limit of its sandboxes in MiB (0: the daemon's --sandbox-memory)")
	f.StringVar(&warmProbe, "warm-probe", "", "make the template warm (as template create --warm-probe)")
	f.StringVar(&warmSignal, "reseed-signal", "", "warm template: signal sent to each sandbox's process right after its restore")
	f.StringArrayVar(&warmCommand, "reseed-command", nil, "warm template: command run in each sandbox right after its restore")
	f.IntVar(&warmPool, "warm-pool", 1, "warm template: sandboxes each node keeps restored and paused ahead of demand (0 to 16)")
	return build
}
