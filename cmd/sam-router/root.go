package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"sandstorm/internal/logging"
	"sandstorm/internal/sam/membership"
	"sandstorm/internal/sam/meshrouter"
)

const defaultMeshDir = "/var/lib/sam-router/mesh"

func rootCmd() *cobra.Command {
	var meshDir string
	var listen []string
	var log logging.Flags
	cmd := &cobra.Command{
		Use:   "sam-router [--mesh-dir DIR] [--listen MULTIADDR]…",
		Short: "The mesh's router: the DHT (server mode, prefix /sam) and a circuit relay, for members only",
		Long: `sam-router runs the mesh's DHT in server mode under the mesh's own protocol
prefix (/sam) and a circuit relay (v2) for members that cannot reach each
other. Only members may use either: a peer presents its credential on
/sam/credential/1.0.0, the router checks it against the control plane's
keys and revocations (fetched every 2 s) and that it is bound to the peer's
own libp2p key; a peer that has not within 5 s of connecting is
disconnected, and every reservation, relayed connection and routing-table
entry checks the credential again. The router is a member itself: enrol it
once with "sam-router join" (its key is its libp2p identity). It prints its
addresses, with its peer ID, for members to dial.

A router keeps the mesh's provider records in memory only. Each run has an
epoch of its own, which it gives every member in the credential exchange:
a member that finds it changed publishes its names again at once. A mesh
may have several routers; members join each (sam-node --router, repeated).`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := log.New(os.Stderr)
			if err != nil {
				return err
			}
			m, err := membership.OpenDir(meshDir, l)
			if err != nil {
				return err
			}
			key, err := meshrouter.Identity(m.PrivateKey())
			if err != nil {
				return err
			}
			r, err := meshrouter.New(key, listen, m.Verify, m.Credential)
			if err != nil {
				return err
			}
			defer r.Close()
			go m.Run(cmd.Context())
			for _, a := range r.Host.Addrs() {
				fmt.Printf("%s/p2p/%s\n", a, r.Host.ID())
			}
			l.Info("router serving", "member", m.Name(), "peer", r.Host.ID().String(), "epoch", r.Gate.Epoch())
			<-cmd.Context().Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&meshDir, "mesh-dir", defaultMeshDir, "the router's mesh identity (sam-router join)")
	cmd.Flags().StringArrayVar(&listen, "listen", []string{"/ip4/0.0.0.0/tcp/7700"}, "libp2p address to listen on (repeatable)")
	log.Register(cmd.Flags())
	cmd.AddCommand(membership.JoinCommand("sam-router", defaultMeshDir))
	return cmd
}
