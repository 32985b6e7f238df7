// Package cli is what every command of this project does the same way:
// exit status 0 on success, 2 on a usage error (unknown command or flag,
// wrong arguments) with a pointer to --help, 1 on any other error.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
)

// UsageError is a mistake in how a command was called.
type UsageError struct {
	Cmd string
	Err error
}

func (u UsageError) Error() string { return u.Err.Error() }
func (u UsageError) Unwrap() error { return u.Err }

// Strict makes every usage mistake below c an error cobra returns as a
// UsageError: bad flags, wrong arguments, and an unknown or missing
// subcommand of a command group — which cobra would otherwise answer with
// its help and exit status 0. A group named alone prints its help on
// stderr, as `go` does with no command, and exits 2: a script that left
// out the command should not read as a success.
func Strict(c *cobra.Command) {
	c.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return UsageError{cmd.CommandPath(), err}
	})
	if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return UsageError{cmd.CommandPath(), fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			cmd.SetOut(cmd.ErrOrStderr())
			cmd.Help()
			what := cmd.CommandPath() + " needs"
			if !cmd.HasParent() {
				what = "give" // "sandstormd: give a command", not "sandstormd: sandstormd needs"
			}
			return UsageError{cmd.CommandPath(), fmt.Errorf("%s a command: one of those above", what)}
		}
	} else if orig := c.Args; orig != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := orig(cmd, args); err != nil {
				// cobra's "accepts 1 arg(s), received 0" does not say which:
				// the usage line names them.
				return UsageError{cmd.CommandPath(), fmt.Errorf("%w: usage: %s", err, cmd.UseLine())}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		Strict(sub)
	}
}

// commit is what `make build` stamps (-X): git describe's name of the
// commit it was built from, "-dirty" when its tree had changes.
var commit string

// Version is this binary's build: the commit it was built from, as make
// stamped it or else as the Go toolchain did (-buildvcs), and the Go
// that built it.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if commit != "" {
		return "commit " + commit + ", " + bi.GoVersion
	}
	v := map[string]string{}
	for _, s := range bi.Settings {
		v[s.Key] = s.Value
	}
	rev := v["vcs.revision"]
	if rev == "" {
		return bi.Main.Version + ", " + bi.GoVersion
	}
	if v["vcs.modified"] == "true" {
		rev += "+changes"
	}
	return fmt.Sprintf("commit %s (%s), %s", rev, v["vcs.time"], bi.GoVersion)
}

// Main runs root with ctx and returns the exit status, printing an error
// as "<name>: <error>" on stderr. root answers --version (Version) unless
// it has a version of its own.
func Main(ctx context.Context, name string, root *cobra.Command, stderr io.Writer) int {
	if root.Version == "" {
		root.Version = Version()
	}
	Strict(root)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var st ExitStatus
	if errors.As(err, &st) {
		return int(st)
	}
	fmt.Fprintln(stderr, name+":", err)
	var u UsageError
	if errors.As(err, &u) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", u.Cmd)
		return 2
	}
	return 1
}

// ExitStatus is a command's own exit status passed through as the CLI's
// (sandbox exec), printing nothing.
type ExitStatus int

func (e ExitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Exit is Main for a main function.
func Exit(ctx context.Context, name string, root *cobra.Command) {
	os.Exit(Main(ctx, name, root, os.Stderr))
}

// ExitOnSignal is Exit for a long-running command: its context ends at
// SIGINT or SIGTERM, so a server shuts down cleanly instead of dying.
func ExitOnSignal(name string, root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, name, root, os.Stderr)
	stop()
	os.Exit(code)
}
