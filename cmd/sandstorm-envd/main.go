// Command sandstorm-envd is envd, the API the E2B SDK calls inside a
// sandbox (internal/envd). The node puts it in every sandbox read-only at
// /.sandstorm/sandstorm-envd and starts it with `runsc exec` on the first call that
// needs it; it is not meant to be run by hand, though it runs anywhere
// (as root, to run commands as other users).
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sandstorm/internal/cli"
	"sandstorm/internal/envd"
	"sandstorm/internal/interpreter"
	"sandstorm/internal/mcpgateway"
)

func main() {
	envd.RestoreEnv()
	// The node links mcp-gateway to this binary (the name E2B's SDK runs).
	if filepath.Base(os.Args[0]) == "mcp-gateway" {
		os.Args = append([]string{"sandstorm-envd", "mcp-gateway"}, os.Args[1:]...)
	}
	var cfg envd.Config
	var addr string
	var detach, initMode bool
	var env []string
	cmd := &cobra.Command{
		Use:   "sandstorm-envd [--init -- CMD…]",
		Short: "The E2B envd API inside a sandbox: processes, files, /files, /health",
		Long: `sandstorm-envd serves the E2B envd API (version ` + envd.Version + `) on --addr:
process.Process and filesystem.Filesystem over Connect RPC, GET/POST /files
and GET /health. It checks no token: run it only where the caller is
already checked (the master forwards to it only calls with the API token,
the owning team's key, or the sandbox's access token).`,
		Args: func(c *cobra.Command, args []string) error {
			if !initMode && len(args) > 0 {
				return fmt.Errorf("arguments %q: only --init runs a process (--init -- CMD…)", args)
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(c *cobra.Command, args []string) error {
			cfg.Env = map[string]string{}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--env %q: want KEY=VALUE", kv)
				}
				cfg.Env[k] = v
			}
			if detach {
				var args []string
				for _, a := range os.Args[1:] {
					if a != "--detach" {
						args = append(args, a)
					}
				}
				return envd.Detach(args)
			}
			if initMode {
				os.Exit(envd.Init(args, addr, envd.New(cfg)))
			}
			return envd.ListenAndServe(addr, envd.New(cfg))
		},
	}
	cmd.AddCommand(mcpGatewayCmd())
	f := cmd.Flags()
	f.StringVar(&addr, "addr", fmt.Sprintf(":%d", envd.Port), "where to listen (inside the sandbox)")
	f.StringVar(&cfg.DefaultUser, "user", "", "who commands run as and files belong to when a call names no user (default root)")
	f.StringVar(&cfg.DefaultWorkdir, "workdir", "", "a command's directory when it asks for none (default: the user's home)")
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE added to every command's environment; repeatable")
	f.BoolVar(&detach, "detach", false, "start in the background and return once listening")
	f.BoolVar(&initMode, "init", false, "be the sandbox's init: run the process after -- as a child, pass signals on, reap orphans, exit with its status")
	cmd.AddCommand(interpreterCommand())
	// envd idles in every sandbox that used it, and its heap is part of
	// the sandbox's memory and of its snapshot: collect early.
	debug.SetGCPercent(50)
	cli.Exit(context.Background(), "sandstorm-envd", cmd)
}

// mcpGatewayCmd is "mcp-gateway": E2B's MCP gateway, as the mesh's /mcp
// (internal/mcpgateway).
func mcpGatewayCmd() *cobra.Command {
	var config string
	var serve bool
	cmd := &cobra.Command{
		Use:   "mcp-gateway --config JSON",
		Short: "Serve the mesh's MCP tools on port 50005 (E2B's Sandbox.create({mcp}) runs it)",
		Long: `mcp-gateway checks that every MCP server --config names has tools this
sandbox's principal is granted in the mesh, writes the token from
GATEWAY_ACCESS_TOKEN to /etc/mcp-gateway/.token (0600), and starts serving
/mcp on port 50005 in the background, forwarding to the mesh's MCP endpoint
through the sandbox's boundary; it returns once the gateway listens. A call
needs Authorization: Bearer <token>. The servers' settings are the mesh
operator's (sam-node's config): the values in --config are not used.`,
		Example:      `  GATEWAY_ACCESS_TOKEN=$(uuidgen) mcp-gateway --config '{"github": {}}'`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(c *cobra.Command, _ []string) error {
			token := os.Getenv(mcpgateway.TokenEnv)
			if serve {
				return mcpgateway.Serve(token)
			}
			if config == "" {
				return cli.UsageError{Cmd: c.CommandPath(), Err: fmt.Errorf("--config is required: a JSON object naming MCP servers")}
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			return mcpgateway.Start(c.Context(), config, token, self)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "a JSON object whose keys name the MCP servers the agent needs")
	cmd.Flags().BoolVar(&serve, "serve", false, "serve in the foreground (what the background gateway runs)")
	cmd.Flags().MarkHidden("serve")
	return cmd
}

// interpreterCommand serves E2B's code interpreter API (internal/interpreter)
// instead of envd's: the same binary, because it is already in every
// sandbox that runs envd (/.sandstorm), so a template needs nothing of
// ours in its rootfs but Python and ipykernel.
func interpreterCommand() *cobra.Command {
	var cfg interpreter.Config
	var addr string
	var reseed bool
	cmd := &cobra.Command{
		Use:   "interpreter",
		Short: "The E2B code interpreter API: runs code in Jupyter kernels (Python, JavaScript, TypeScript, R, Java, bash)",
		Long: `sandstorm-envd interpreter serves the API @e2b/code-interpreter calls on
port ` + strconv.Itoa(interpreter.Port) + ` in a sandbox: POST /execute, /contexts. It listens at once and starts the
default Python kernel, and lists a default JavaScript context (where
Node.js is installed) whose kernel starts at its first cell; GET /health
answers 200 once the Python kernel answers (a warm template's probe), and
other calls wait for it. A JavaScript or TypeScript context needs
Node.js with TypeScript's compiler (Debian's nodejs and node-typescript)
and ipykernel; an R context, R with IRkernel (Debian's r-cran-irkernel);
a Java context, a JDK with JShell (Debian's openjdk-17-jdk-headless) and
ipykernel; a bash context, bash and ipykernel.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(c *cobra.Command, _ []string) error {
			if reseed {
				return askReseed(c.Context(), addr)
			}
			s, err := interpreter.Prepare(cfg)
			if err != nil {
				return err
			}
			defer s.Close()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			// Listening first, the kernel starting behind: a call that
			// comes meanwhile waits for it (a cold start's first).
			failed := make(chan error, 1)
			go func() {
				if err := s.Start(); err != nil {
					failed <- err
					ln.Close()
				}
			}()
			err = http.Serve(ln, s.Handler())
			select {
			case err = <-failed:
			default:
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", ":"+strconv.Itoa(interpreter.Port), "where to listen")
	f.StringVar(&cfg.Python, "python", "python3", "the Python with ipykernel installed (the bash kernel runs on it too)")
	f.StringVar(&cfg.R, "r", "R", "R with IRkernel installed, for R contexts")
	f.StringVar(&cfg.Bash, "bash", "bash", "the shell of bash contexts")
	f.StringVar(&cfg.Node, "node", "node", "the Node.js of JavaScript and TypeScript contexts")
	f.StringVar(&cfg.Java, "java", "java", "the JDK's java launcher of Java contexts (JShell)")
	f.StringVar(&cfg.Workdir, "workdir", "", "a context's working directory when it names none (default: the current directory)")
	f.StringVar(&cfg.User, "user", "", "the account kernels run as (default: this process's)")
	f.BoolVar(&reseed, "reseed", false, "serve nothing: ask the server on --addr to reseed its kernels' random generators (a warm template's reseed command)")
	return cmd
}

// askReseed asks the interpreter on addr (":port": this host) to reseed.
func askReseed(ctx context.Context, addr string) error {
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/reseed", nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(res.Body)
		return fmt.Errorf("reseed: %s: %s", res.Status, b)
	}
	return nil
}
