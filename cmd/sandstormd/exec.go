package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/term"

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
status is sandstormd's (127 for a command not found, 126 for one that
cannot run, as a shell says). With -i, sandstormd's stdin is the command's (EOF
closes it); with -t (as -it) the command gets a terminal: a pty in the
sandbox, the size of this one and resized with it. Without --user the command runs as the sandbox's default user
(root for a template that names none).

The command runs in the sandbox's envd (the E2B API), started in it on
first use; it outlives a broken connection, and a command left running
survives a freeze — a snapshot too when the template runs envd as its
init (process.envd; the base demo does).`,
		Example: `  sandstormd sandbox create base --name b1      # base: template demo base
  sandstormd sandbox exec b1 -- ls -l /
  echo hello | sandstormd sandbox exec b1 -i -- cat
  sandstormd sandbox exec b1 -it -- bash
  sandstormd sandbox exec b1 --env DEBUG=1 --cwd /tmp --user root -- sh -c 'id; pwd'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return fmt.Errorf("want a sandbox and a command (exec NAME -- CMD…), got %d argument(s)", len(args))
			}
			return nil
		},
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			var err error
			if o.Env, err = keyValues("--env", env); err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			if o.TTY && !term.IsTerminal(int(os.Stdin.Fd())) {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: errors.New("-t needs a terminal on stdin: leave -t out when stdin is a pipe or a file")}
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
			if o.TTY {
				o.Term = os.Stdin
			}
			code, err := execcli.Run(cmd.Context(), c.Envd(args[0], o.User), o, os.Stdout, os.Stderr)
			if code, ok := execcli.StartStatus(err); ok {
				// As a shell says it, then its status (127, 126).
				fmt.Fprintf(os.Stderr, "%s: %v\n", cmd.Root().Name(), execError(err))
				return cli.ExitStatus(code)
			}
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
	f.BoolVarP(&o.TTY, "tty", "t", false, "run it on a terminal (a pty in the sandbox) the size of this one, which is raw meanwhile and whose resizes follow")
	return exec
}

// sandboxCpCmd is "sandbox cp".
func sandboxCpCmd() *cobra.Command {
	var user string
	cp := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories into or out of a sandbox (NAME:PATH on one side)",
		Long: `Copy a file or a directory between this machine and a sandbox. The
sandbox's side is NAME:PATH (a relative PATH is from the user's home); "-"
is stdin or stdout (a single file). Files are streamed, never held whole
in memory; a file written into a sandbox appears whole or not at all, with
its parent directories made. Symlinks are skipped (and said so). The
sandbox is woken from whatever tier it is in first.`,
		Example: `  sandstormd sandbox cp ./data.csv b1:/home/user/data.csv
  sandstormd sandbox cp b1:/etc/os-release -
  sandstormd sandbox cp ./src b1:/home/user/src
  sandstormd sandbox cp b1:/home/user/out ./out`,
		Args: cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			srcBox, srcPath, srcIn := splitRemote(args[0])
			dstBox, dstPath, dstIn := splitRemote(args[1])
			switch {
			case srcIn == dstIn:
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: errors.New("exactly one of SRC and DST must be NAME:PATH, a path in a sandbox")}
			case srcIn && dstPath == "-":
				rc, err := c.Envd(srcBox, user).Download(cmd.Context(), srcPath)
				if err != nil {
					return err
				}
				defer rc.Close()
				_, err = io.Copy(os.Stdout, rc)
				return err
			case srcIn:
				return execcli.CopyOut(cmd.Context(), c.Envd(srcBox, user), srcPath, dstPath, cmd.ErrOrStderr())
			case srcPath == "-":
				return c.Envd(dstBox, user).Upload(cmd.Context(), dstPath, os.Stdin)
			default:
				if strings.HasSuffix(dstPath, "/") {
					dstPath += filepath.Base(srcPath)
				}
				return execcli.CopyIn(cmd.Context(), c.Envd(dstBox, user), srcPath, dstPath, cmd.ErrOrStderr())
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

// execError says what a Connect error from envd means for a person.
func execError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return fmt.Errorf("%s: %s", ce.Code(), ce.Message())
	}
	return err
}
