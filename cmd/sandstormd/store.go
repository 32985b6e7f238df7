package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/daemon"
)

func storeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Back up and restore the store of desired state",
		Long: `The store holds the desired state of --data-dir's daemon: templates,
sandboxes, placements, paired nodes, API keys (as hashes). It is SQLite in
<data-dir>/state.db unless --store names a PostgreSQL database, which
pg_dump backs up instead (backup says what that covers).`,
	}
	cmd.PersistentFlags().String("store", os.Getenv("SANDSTORM_STORE"), "the daemon's --store (env SANDSTORM_STORE): empty is SQLite at <data-dir>/state.db")
	cmd.AddCommand(storeBackupCmd(), storeRestoreCmd())
	return cmd
}

func storeBackupCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "backup FILE",
		Short: "Write an online, consistent copy of the SQLite store to FILE (mode 0600)",
		Long: `Write a consistent copy of the store (SQLite's VACUUM INTO: one read
transaction, so the copy is of one moment however much the running daemon
writes meanwhile) to FILE, mode 0600 from its first byte — the store holds
token and key hashes. FILE is written whole or not at all (beside it, then
renamed over it), then opened and checked. The daemon may be running.

What a master is besides its store: <data-dir>/pki (its CA and key, the
API token; written once at first start). Copy it once, and keep it as you
keep the backups: whoever has ca.key can pose as the master to its nodes.
Restore with: sandstormd store restore FILE (the daemon stopped).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dd, _ := cmd.Flags().GetString("data-dir")
			where, _ := cmd.Flags().GetString("store")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			sum, err := daemon.BackupStore(ctx, dd, where, args[0])
			if err != nil {
				return err
			}
			fmt.Printf("backed up the store of %s to %s (mode 0600): %s\n", dd, args[0], sum)
			return nil
		},
	}
}

func storeRestoreCmd() *cobra.Command {
	var discard bool
	cmd := &cobra.Command{
		Use:   "restore FILE",
		Short: "Put a backup in place of the SQLite store (the daemon stopped)",
		Long: `Put FILE, a backup made by 'sandstormd store backup', in place of the store
of --data-dir. No daemon may run on the data dir (stop it first: its PID is
in <data-dir>/sandstormd.pid, or systemctl stop sandstormd). FILE is
checked first (SQLite's integrity check, the store's tables); the store as
it was — state.db with its -wal and -shm — is renamed to
state.db.before-restore-<time>, never deleted.

The next start takes the sandboxes in the backup over as a restart does:
running ones adopted, snapshots kept restorable; one whose directory is
gone comes back detached (cold). A sandbox on this node that the backup
does not know (made after it) would be removed by the next start, volume
included: the restore is refused and names them, unless --discard-newer.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dd, _ := cmd.Flags().GetString("data-dir")
			where, _ := cmd.Flags().GetString("store")
			res, err := daemon.RestoreStore(context.Background(), dd, where, args[0], discard)
			if err != nil {
				return err
			}
			fmt.Printf("restored %s into %s: %s\n", args[0], dd, res.Summary)
			if res.Kept != "" {
				fmt.Printf("the store as it was is at %s\n", res.Kept)
			}
			if len(res.Newer) > 0 {
				fmt.Printf("%d sandboxes not in the backup will be removed at the next start: %v\n", len(res.Newer), res.Newer)
			}
			if len(res.Lost) > 0 {
				fmt.Printf("%d sandboxes in the backup have no directory here and will come back detached: %v\n", len(res.Lost), res.Lost)
			}
			fmt.Printf("start sandstormd again to take them over (e.g. systemctl start sandstormd)\n")
			return nil
		},
	}
	cmd.Flags().BoolVar(&discard, "discard-newer", false, "restore even though sandboxes on this node are not in the backup (the next start removes them and their volumes)")
	return cmd
}
