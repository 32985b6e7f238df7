// Command sandstormd is Sandstorm's one binary: master, node and their CLI.
//
//	sandstormd serve --master --node      run the daemon
//	sandstormd doctor                     what this machine supports
//	sandstormd template …                 manage templates
//	sandstormd sandbox …                  manage sandboxes
//
// Exit status: 0 on success, 2 on a usage error (unknown command or flag,
// wrong arguments), 1 on any other error.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := rootCmd()
	strictUsage(root)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "sandstormd:", err)
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintf(os.Stderr, "Run '%s --help' for usage.\n", u.cmd)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a mistake in how a command was called.
type usageError struct {
	cmd string
	err error
}

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// strictUsage makes every usage mistake below c an error cobra returns as a
// usageError: bad flags, wrong arguments, and an unknown subcommand of a
// command group — which cobra would otherwise answer with its help and
// exit status 0.
func strictUsage(c *cobra.Command) {
	c.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{cmd.CommandPath(), err}
	})
	if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{cmd.CommandPath(), fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			return cmd.Help()
		}
	} else if orig := c.Args; orig != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := orig(cmd, args); err != nil {
				return usageError{cmd.CommandPath(), err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		strictUsage(sub)
	}
}
