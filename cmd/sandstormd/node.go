package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/client"
)

// nodeCmd is the fleet's nodes, as GET/POST/DELETE /v1/nodes serve them.
func nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Aliases: []string{"nodes"}, Short: "Manage the master's nodes (pair, list, forget; join tokens for nodes behind NAT)"}
	addAPIFlag(cmd)
	cmd.AddCommand(nodeLsCmd(), nodePairCmd(), nodeRmCmd(), nodeJoinTokenCmd(), nodeDrainCmd(), nodeUndrainCmd())
	return cmd
}

func nodeLsCmd() *cobra.Command {
	return &cobra.Command{
		Use: "ls", Short: "List the nodes with their headroom and tier counts, or why one is lost", Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, _ []string) error {
			var l api.List[api.NodeStatus]
			if err := c.Do(cmd.Context(), "GET", "/v1/nodes", nil, &l); err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(l.Items)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tADDRESS\tHEADROOM MiB\tHOT\tFROZEN\tSNAPSHOT\tDETACHED\tNOTE")
			for _, n := range l.Items {
				state, addr, note := n.State, n.Address, n.Error
				if state == "" {
					state = "ready"
				}
				if n.Draining && state != "lost" {
					// Drained once the master has nothing of its own there.
					state = "draining"
					if n.Sandboxes[api.TierHot]+n.Sandboxes[api.TierFrozen]+n.Sandboxes[api.TierSnapshot]+n.Sandboxes[api.TierDetached] == 0 {
						state = "drained"
					}
				}
				if addr == "" {
					addr = "(in the master's process)"
				}
				head := "-"
				if state != "lost" {
					head = fmt.Sprint(n.MemAvailableMiB - n.MemReserveMiB - n.PromisedMiB)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", n.Name, state, addr, head,
					n.Sandboxes[api.TierHot], n.Sandboxes[api.TierFrozen], n.Sandboxes[api.TierSnapshot], n.Sandboxes[api.TierDetached], note)
			}
			return tw.Flush()
		}),
	}
}

func nodePairCmd() *cobra.Command {
	var codeFile string
	pair := &cobra.Command{
		Use:   "pair ADDRESS --code-file FILE",
		Short: "Pair the node listening at ADDRESS (its --node-listen) with this master",
		Long: "pair pairs a node started with 'sandstormd serve --node --node-listen ADDRESS'. The pairing code is\n" +
			"in the node's <data-dir>/pki/node/pairing-code; copy it to a file of mode 0600 here (it is read from\n" +
			"the file, never from the command line, where other users would see it in ps). Its value '-' reads\n" +
			"it from standard input.",
		Example: "  sandstormd node pair 10.0.0.5:7443 --code-file ./n1.code\n  ssh root@10.0.0.5 cat /var/lib/sandstorm/pki/node/pairing-code | sandstormd node pair 10.0.0.5:7443 --code-file -",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if codeFile == "" {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: errors.New("give --code-file: the file holding the node's pairing code (<its data-dir>/pki/node/pairing-code)")}
			}
			var b []byte
			var err error
			if codeFile == "-" {
				b, err = io.ReadAll(io.LimitReader(os.Stdin, 4<<10))
			} else {
				b, err = os.ReadFile(codeFile)
			}
			if err != nil {
				return err
			}
			code := strings.TrimSpace(string(b))
			if code == "" {
				return errors.New("the pairing code file is empty")
			}
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			var st api.NodeStatus
			if err := c.Do(cmd.Context(), "POST", "/v1/nodes", api.NodeRequest{Address: args[0], PairingCode: code}, &st); err != nil {
				return err
			}
			fmt.Printf("paired %s at %s: %d MiB available\n", st.Name, args[0], st.MemAvailableMiB)
			return nil
		},
	}
	pair.Flags().StringVar(&codeFile, "code-file", "", "file holding the node's pairing code ('-': standard input)")
	return pair
}

func nodeRmCmd() *cobra.Command {
	return &cobra.Command{
		Use: "rm NAME", Short: "Forget a node with no sandboxes left (its certificates are revoked)", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			if err := c.Do(cmd.Context(), "DELETE", "/v1/nodes/"+args[0], nil, nil); err != nil {
				return err
			}
			fmt.Println("forgot", args[0])
			return nil
		}),
	}
}

func nodeJoinTokenCmd() *cobra.Command {
	return &cobra.Command{
		Use: "join-token", Short: "Make a one-time token (good for an hour) for a node behind NAT to join with", Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, _ []string) error {
			var tok api.JoinToken
			if err := c.Do(cmd.Context(), "POST", "/v1/nodes/join-tokens", nil, &tok); err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(tok)
			}
			fmt.Printf("on the node, before %s:\n  %s\n", tok.ExpiresAt.Local().Format("15:04"), tok.Command)
			return nil
		}),
	}
}

func nodeDrainCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "drain NAME",
		Short: "Take a paired node out of service: it takes no new sandboxes, and each of its own moves to another node with its memory",
		Long: `drain stops the master placing new sandboxes (creates, clones) on node
NAME, then moves each sandbox it holds to another paired node with what it
holds: a running or frozen one is checkpointed, its image and volume are
streamed over the master's mutual-TLS connections to the node with the most
headroom, and it is restored there in its tier with that node's address,
boundary and gateway ports (its ID, name, principal, labels and lifetime
stay; its endpoint URLs change: 'sandbox ls' lists the new ones). A
snapshotted one is streamed as it is, a detached one's volume alone.

Two moves run at a time, and each line says where one went and how long it
took. A move that fails leaves its sandbox whole on NAME (as a snapshot, if
it was running: its next request wakes it there with its memory); drain
NAME again to retry what is left. The node stays draining until
'node undrain NAME'. The master's own node (serve --master --node) drains
as any other.`,
		Example: "  sandstormd node drain node-2\n  sandstormd node ls          # node-2 drained\n  sandstormd node undrain node-2",
		Args:    cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			asJSON, _ := cmd.Flags().GetBool("json")
			sum, err := c.Drain(cmd.Context(), args[0], func(ev api.DrainEvent) {
				if asJSON {
					printJSON(ev)
					return
				}
				if ev.Error != "" {
					fmt.Printf("%s (%s): not moved after %.0f ms: %s\n", ev.Sandbox, ev.ID, ev.Ms, ev.Error)
					return
				}
				fmt.Printf("%s (%s, %s): %s → %s in %.0f ms\n", ev.Sandbox, ev.ID, ev.Tier, ev.From, ev.To, ev.Ms)
			})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(sum)
			}
			fmt.Printf("%s draining: %d moved, %d not moved, %d left on it\n", args[0], sum.Moved, sum.Failed, sum.Left)
			if sum.Error != "" || sum.Left > 0 {
				return fmt.Errorf("%s is not drained yet (%d sandboxes left on it%s): run node drain %s again", args[0], sum.Left, map[bool]string{true: ": " + sum.Error}[sum.Error != ""], args[0])
			}
			return nil
		}),
	}
}

func nodeUndrainCmd() *cobra.Command {
	return &cobra.Command{
		Use: "undrain NAME", Short: "Let a drained node take new sandboxes again", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			if err := c.Undrain(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Println(args[0], "takes new sandboxes again")
			return nil
		}),
	}
}
