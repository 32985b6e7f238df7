package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"sandstorm/internal/cli"
	"sandstorm/internal/client"
	"sandstorm/internal/execcli"
)

// sandboxExecCmd is "sandbox exec".
func sandboxExecCmd() *cobra.Command {
	var o execcli.Options
	var env []string
	exec := &cobra.Command{
		Use:   "exec ID|NAME [flags] -- CMD [ARG…]",
		Short: "Run a command in a sandbox (woken from any tier), streaming its output",
		Long: `Run a command inside a sandbox, confined as its template's process is: the
same gVisor sandbox, its boundary its only way out. The sandbox is woken
from whatever tier it is in first. Output is streamed; the command's exit
status is sandstormd's. With -i, sandstormd's stdin is the command's (EOF
closes it). Without --user the command runs as the sandbox's default user
(root for a template that names none).

The command runs in the sandbox's envd (the E2B API), started in it on
first use; it outlives a broken connection, and a command left running is
in the sandbox's memory through a freeze or a snapshot.`,
		Example: `  sandstormd sandbox exec web -- ls -l /
  echo hello | sandstormd sandbox exec web -i -- cat
  sandstormd sandbox exec web --env DEBUG=1 --cwd /tmp --user nobody -- sh -c 'id; pwd'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return fmt.Errorf("want a sandbox and a command (exec NAME -- CMD…), got %d argument(s)", len(args))
			}
			return nil
		},
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			o.Env = map[string]string{}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--env %q: want KEY=VALUE", kv)}
				}
				o.Env[k] = v
			}
			// A sandbox that is not there is the API's 404, said plainly
			// (envd's streams would see only a status).
			if _, err := c.Sandbox(cmd.Context(), args[0]); err != nil {
				return err
			}
			o.Cmd, o.Args = args[1], args[2:]
			if o.Stdin {
				o.In = os.Stdin
			}
			code, err := execcli.Run(cmd.Context(), c.Envd(args[0], o.User), o, os.Stdout, os.Stderr)
			if err != nil {
				return execError(err)
			}
			if code != 0 {
				return cli.ExitStatus(code)
			}
			return nil
		}),
	}
	f := exec.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE in the command's environment; repeatable")
	f.StringVarP(&o.Cwd, "cwd", "w", "", "the command's directory (default: the user's home)")
	f.StringVarP(&o.User, "user", "u", "", "run as this user of the sandbox (default: the sandbox's default user)")
	f.BoolVarP(&o.Stdin, "interactive", "i", false, "send stdin to the command")
	return exec
}

// sandboxCpCmd is "sandbox cp".
func sandboxCpCmd() *cobra.Command {
	var user string
	cp := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox (NAME:PATH on one side)",
		Long: `Copy a file between this machine and a sandbox. The sandbox's side is
NAME:PATH (a relative PATH is from the user's home); "-" is stdin or
stdout. The file is streamed, never held whole in memory; a file written
into a sandbox appears whole or not at all, with its parent directories
made. The sandbox is woken from whatever tier it is in first.`,
		Example: `  sandstormd sandbox cp ./data.csv web:/tmp/data.csv
  sandstormd sandbox cp web:/etc/os-release -
  tar c dir | sandstormd sandbox cp - web:/tmp/dir.tar`,
		Args: cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			srcBox, srcPath, srcIn := splitRemote(args[0])
			dstBox, dstPath, dstIn := splitRemote(args[1])
			switch {
			case srcIn == dstIn:
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: errors.New("exactly one of SRC and DST must be NAME:PATH, a path in a sandbox")}
			case srcIn:
				rc, err := c.Envd(srcBox, user).Download(cmd.Context(), srcPath)
				if err != nil {
					return err
				}
				defer rc.Close()
				return writeLocal(dstPath, path.Base(srcPath), rc)
			default:
				in, err := openLocal(srcPath)
				if err != nil {
					return err
				}
				defer in.Close()
				if strings.HasSuffix(dstPath, "/") && srcPath != "-" {
					dstPath += path.Base(srcPath)
				}
				return c.Envd(dstBox, user).Upload(cmd.Context(), dstPath, in)
			}
		}),
	}
	cp.Flags().StringVarP(&user, "user", "u", "", "the sandbox's user whose files these are (default: the sandbox's default user)")
	return cp
}

// splitRemote splits NAME:PATH; a local path has no colon before its
// first slash.
func splitRemote(s string) (box, p string, remote bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.Contains(s[:i], "/") {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

func openLocal(p string) (io.ReadCloser, error) {
	if p == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err == nil && st.IsDir() {
		f.Close()
		return nil, fmt.Errorf("%s is a directory: copy a file (tar a directory and copy the tarball: tar c DIR | sandstormd sandbox cp - NAME:PATH)", p)
	}
	return f, nil
}

func writeLocal(p, name string, r io.Reader) error {
	if p == "-" {
		_, err := io.Copy(os.Stdout, r)
		return err
	}
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		p = path.Join(p, name)
	}
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// execError says what a Connect error from envd means for a person.
func execError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return fmt.Errorf("%s: %s", ce.Code(), ce.Message())
	}
	return err
}
