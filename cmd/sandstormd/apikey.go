package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/client"
)

// apiKeyCmd is "api-key": teams' API keys (internal/apikey).
func apiKeyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "api-key",
		Short: "Manage teams' API keys (for the API and the E2B SDK)",
		Long: `An API key belongs to a team: with it a client sees and touches only that
team's sandboxes (another team's answer 404), and uses the operator's
templates. Keys are shaped as E2B's (e2b_ and 40 hex digits), so the E2B
SDK takes them as E2B_API_KEY. A key is shown once, when made; the master
keeps only its SHA-256. These commands need the operator's token.`,
	}
	addAPIFlag(cmd)
	create := &cobra.Command{
		Use: "create TEAM", Short: "Make an API key for TEAM and print it (shown this once)", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			k, err := c.CreateAPIKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(k)
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			fmt.Fprintf(cmd.ErrOrStderr(), "API key %s for team %s: keep it now, it is not shown again (revoke: sandstormd api-key rm %s)\n", k.ID, k.Team, k.ID)
			return nil
		}),
	}
	ls := &cobra.Command{
		Use: "ls", Short: "List API keys (their IDs, teams and last four characters)", Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, _ []string) error {
			keys, err := c.APIKeys(cmd.Context())
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(keys)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEAM\tKEY\tCREATED")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%s\te2b_…%s\t%s\n", k.ID, k.Team, k.Last4, k.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		}),
	}
	rm := &cobra.Command{
		Use: "rm ID…", Short: "Revoke API keys (at once: the next call with one is refused)", Args: cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			for _, id := range args {
				if err := c.DeleteAPIKey(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "revoked", id)
			}
			return nil
		}),
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}
