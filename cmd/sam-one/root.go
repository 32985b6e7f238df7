package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"sandstorm/internal/logging"
	"sandstorm/internal/sam/samone"
)

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "sam-one",
		Short: "The mesh's control plane, router and console in one process",
		Long: `sam-one runs the mesh's control plane (as sam-control-plane serve), its
router (as sam-router) and a web console in one process, for a laptop or a
first machine. The router is a member enrolled by sam-one itself (no token:
its credential is issued in-process for its key in <data-dir>/router/). The
data dir has sam-control-plane's layout, so its operator commands work
against sam-one (sam-control-plane --data-dir D --api https://ADDR token create,
policy set, members, revoke…). Nodes join with "sam-node join
--control-plane https://ADDR --ca D/pki/ca.pem" and run with --router and
the address sam-one prints.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd())
	return root
}

func serveCmd() *cobra.Command {
	var o samone.Options
	var log logging.Flags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane's API and the console (HTTPS), and the router, until SIGINT or SIGTERM",
		Long: `serve runs the control plane's API and the console at / on --listen (HTTPS,
a certificate from <data-dir>/pki's CA), and the router (the mesh's DHT in
server mode under /sam and a circuit relay v2, members only) on
--router-listen. It prints the router's addresses with its peer ID, one a
line, for nodes' --router. The console asks for the admin token
(<data-dir>/admin-token) and keeps a read-only session cookie.`,
		Example: "  sam-one serve --data-dir /var/lib/sam-one --listen 127.0.0.1:7600 --router-listen /ip4/0.0.0.0/tcp/7700",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := log.New(os.Stderr)
			if err != nil {
				return err
			}
			o.Log = l
			one, err := samone.Start(cmd.Context(), o)
			if err != nil {
				return err
			}
			for _, a := range one.RouterAddrs() {
				fmt.Println(a)
			}
			return one.Serve(cmd.Context(), func(addr string) {
				l.Info("sam-one serving", "console", "https://"+addr+"/", "router", one.Router.Host.ID().String(), "router_member", o.RouterName)
			})
		},
	}
	cmd.Flags().StringVar(&o.DataDir, "data-dir", envOr("SAM_ONE_DATA_DIR", "/var/lib/sam-one"), "the control plane's state, keys, admin token and CA, and the router's key (env SAM_ONE_DATA_DIR)")
	cmd.Flags().StringVar(&o.Listen, "listen", "127.0.0.1:7600", "the API's and the console's address (HTTPS)")
	cmd.Flags().StringArrayVar(&o.RouterListen, "router-listen", []string{"/ip4/0.0.0.0/tcp/7700"}, "the router's libp2p address (repeatable)")
	cmd.Flags().StringVar(&o.RouterName, "router-name", "router", "the router's member name")
	cmd.Flags().StringVar(&o.Store, "store", "", "a postgres:// URL for the rows (default: SQLite in --data-dir)")
	cmd.Flags().StringVar(&o.Name, "name", "sam", "the control plane's name: its credentials' issuer, the audience of the challenges members sign")
	log.Register(cmd.Flags())
	return cmd
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
