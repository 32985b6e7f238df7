package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/daemon"
)

func reloadCmd() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Replace the running sandstormd with the binary at its path, refusing no connection",
		Long: `Ask the sandstormd serving --data-dir (its PID is in <data-dir>/sandstormd.pid)
to reload, and wait until it serves again. A reload is SIGHUP: the daemon
stops accepting but keeps every listening socket open (connections wait in
the kernel's accept backlog), answers the requests in flight, and executes
the binary at its path — the new one after an upgrade — in the same
process, handing it the sockets. The new binary adopts every sandbox as a
restart does and serves the connections that waited.

The binary at the path must speak this handoff protocol (sandstormd
handoff-version); if it does not, the daemon refuses and serves on, and
this command says why. systemctl reload sandstormd runs this command
(ExecReload in the unit). Exit status 0 once the new binary serves.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dd, _ := cmd.Flags().GetString("data-dir")
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			start := time.Now()
			before, after, err := daemon.Reload(ctx, dd)
			if err != nil {
				return err
			}
			fmt.Printf("sandstormd (PID %d) reloaded in %.2f s: %s serves now, with %d sockets handed over (was %s, since %s)\n",
				after.PID, time.Since(start).Seconds(), after.Binary, after.HandedOver, before.Binary, before.Since.Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "timeout", 2*time.Minute, "how long to wait for the new binary to serve")
	return cmd
}

// handoffVersionCmd prints the handoff protocol this binary speaks; a
// daemon asks the binary at its path before it hands its sockets to it.
func handoffVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "handoff-version",
		Short:  "Print the socket handoff protocol this binary speaks (for sandstormd reload)",
		Hidden: true,
		Args:   cobra.NoArgs,
		Run:    func(*cobra.Command, []string) { fmt.Println(daemon.HandoffVersion) },
	}
}
