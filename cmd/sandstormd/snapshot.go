package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/client"
)

// snapshotCmd is "snapshot": E2B's snapshots on our own API.
func snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Keep a sandbox's memory and files, and start sandboxes from them",
		Long: "A snapshot is a copy of a sandbox — its memory and files — kept on its node's disk, costing no memory; " +
			"'snapshot start' makes a sandbox from it with that memory, as many times as asked. (Not 'sandbox snapshot', " +
			"which drops one sandbox to the snapshot tier until a call wakes it.)",
	}
	addAPIFlag(cmd)
	var name, of string
	create := &cobra.Command{
		Use: "create SANDBOX", Short: "Take a snapshot of a sandbox (it runs on)", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			s, err := c.TakeSnapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(s)
			}
			fmt.Printf("%s: a snapshot of %s; 'sandstormd snapshot start %s' makes a sandbox from it\n", s.ID, s.Of, s.ID)
			return nil
		}),
	}
	create.Flags().StringVar(&name, "name", "", "a name to find it by (snapshot ls --name)")
	ls := &cobra.Command{
		Use: "ls", Short: "List snapshots", Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, _ []string) error {
			ss, err := c.Snapshots(cmd.Context(), of, name)
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(ss)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tOF\tTAKEN")
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.ID, s.Name, s.Of, s.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().StringVar(&of, "of", "", "only the snapshots of this sandbox (ID)")
	ls.Flags().StringVar(&name, "name", "", "only the snapshots of this name")
	var sbName string
	start := &cobra.Command{
		Use: "start SNAPSHOT", Short: "Make a sandbox from a snapshot, with its memory", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			sb, err := c.FromSnapshot(cmd.Context(), args[0], api.SandboxRequest{Name: sbName})
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(sb)
			}
			fmt.Printf("%s (%s): %s, from snapshot %s\n", sb.Name, sb.ID, tierText(sb), args[0])
			return nil
		}),
	}
	start.Flags().StringVar(&sbName, "name", "", "the new sandbox's name (default: the node's)")
	rm := &cobra.Command{
		Use: "rm SNAPSHOT", Short: "Delete a snapshot (sandboxes made from it stay)", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			return c.DeleteSnapshot(cmd.Context(), args[0])
		}),
	}
	cmd.AddCommand(create, ls, start, rm)
	return cmd
}
