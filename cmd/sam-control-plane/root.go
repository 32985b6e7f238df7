package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/logging"
	"sandstorm/internal/pki"
	"sandstorm/internal/sam/controlplane"
	"sandstorm/internal/sam/policy"
)

func rootCmd() *cobra.Command {
	var dataDir, apiURL string
	root := &cobra.Command{
		Use:   "sam-control-plane",
		Short: "The mesh's control plane: enrols nodes and issues the credentials members check offline",
		Long: `sam-control-plane enrols nodes into the mesh (serve runs it; the other
commands talk to a running one at --api). A node proves it holds its
Ed25519 key by signing a fresh single-use challenge, and presents a bootstrap
token the operator made (max uses, expiry; the control plane keeps only its
SHA-256). It gets a credential (a JWT signed with Ed25519, bound to its key,
10 minutes) that every other member verifies offline against the keys and
revocations of GET /v1/keys. It serves the mesh's policy to its members
(policy set, policy get) and rotates its signing key with a grace (keys
rotate). A node may enrol with an OpenID Connect ID token instead of a
bootstrap token (serve --oidc-issuer). The operator's commands (token,
members, revoke, policy, keys) use the admin token in <data-dir>/admin-token and trust <data-dir>/pki/ca.pem.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&dataDir, "data-dir", envOr("SAM_CONTROL_PLANE_DATA_DIR", "/var/lib/sam-control-plane"), "the control plane's state, keys and admin token (env SAM_CONTROL_PLANE_DATA_DIR)")
	root.PersistentFlags().StringVar(&apiURL, "api", envOr("SAM_CONTROL_PLANE_API", "https://127.0.0.1:7600"), "the control plane's URL, for the operator's commands (env SAM_CONTROL_PLANE_API)")
	client := func() (*controlplane.Client, error) {
		caPEM, err := os.ReadFile(filepath.Join(dataDir, "pki", pki.CAFile))
		if err != nil {
			return nil, fmt.Errorf("the control plane's CA: %w (is --data-dir the control plane's?)", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		tok, err := os.ReadFile(filepath.Join(dataDir, controlplane.AdminTokenFile))
		if err != nil {
			return nil, fmt.Errorf("the admin token: %w (is --data-dir the control plane's?)", err)
		}
		return &controlplane.Client{Base: apiURL, AdminToken: strings.TrimSpace(string(tok)),
			HTTP: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}}, nil
	}
	root.AddCommand(serveCmd(&dataDir), tokenCmd(client), membersCmd(client), revokeCmd(client), policyCmd(client), keysCmd(client))
	return root
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func serveCmd(dataDir *string) *cobra.Command {
	var o controlplane.Options
	var listen []string
	var log logging.Flags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane's API (HTTPS) until SIGINT or SIGTERM",
		Example: "  sam-control-plane serve --listen 10.0.0.1:7600\n" +
			"  sam-control-plane serve --oidc-issuer https://id.example.com --oidc-client-id sam-mesh --oidc-allow-email @example.com",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.OIDC.Issuer == "" && (o.OIDC.ClientID != "" || o.OIDCCAFile != "" || len(o.OIDC.AllowEmails)+len(o.OIDC.AllowSubjects) > 0) {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--oidc-client-id, --oidc-ca and --oidc-allow-* need --oidc-issuer")}
			}
			if o.OIDC.Issuer != "" && o.OIDC.ClientID == "" {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--oidc-issuer needs --oidc-client-id")}
			}
			l, err := log.New(os.Stderr)
			if err != nil {
				return err
			}
			if len(listen) == 0 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--listen: give at least one address")}
			}
			o.Listen, o.AlsoListen = listen[0], listen[1:]
			o.DataDir, o.Log = *dataDir, l
			return controlplane.Serve(cmd.Context(), o, nil)
		},
	}
	cmd.Flags().StringArrayVar(&listen, "listen", []string{"127.0.0.1:7600"}, "the API's address (HTTPS, a certificate from <data-dir>/pki's CA naming it); repeat it to serve on several, e.g. one per network members reach this machine from")
	cmd.Flags().StringVar(&o.Store, "store", "", "a postgres:// URL for the rows (default: SQLite in --data-dir)")
	cmd.Flags().StringVar(&o.Name, "name", "sam", "the control plane's name: its credentials' issuer, the audience of the challenges members sign")
	cmd.Flags().StringVar(&o.OIDC.Issuer, "oidc-issuer", "", "let nodes enrol with an OpenID Connect ID token of this issuer (https URL, as its tokens' \"iss\") instead of a bootstrap token")
	cmd.Flags().StringVar(&o.OIDC.ClientID, "oidc-client-id", "", "the client ID the ID tokens must be issued to (their \"aud\"); needed with --oidc-issuer")
	cmd.Flags().StringVar(&o.OIDCCAFile, "oidc-ca", "", "a PEM file of the CA the issuer's HTTPS is checked against (default: the system's roots)")
	cmd.Flags().StringSliceVar(&o.OIDC.AllowEmails, "oidc-allow-email", nil, "who may enrol by OIDC: a verified address (ops@example.com) or a domain's (@example.com); repeat or comma-separate")
	cmd.Flags().StringSliceVar(&o.OIDC.AllowSubjects, "oidc-allow-subject", nil, "who may enrol by OIDC: the issuer's subject (\"sub\"), exactly; with no --oidc-allow-* nobody enrols by OIDC")
	log.Register(cmd.Flags())
	return cmd
}

func tokenCmd(client func() (*controlplane.Client, error)) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Bootstrap tokens, which enrol nodes"}
	var uses int
	var ttl time.Duration
	var asJSON bool
	create := &cobra.Command{
		Use:   "create",
		Short: "Make a bootstrap token and print it (shown this once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if uses < 1 || uses > 10000 || ttl < time.Second || ttl > controlplane.MaxTokenTTL {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--max-uses 1 to 10000 and --ttl 1s to %v, please", controlplane.MaxTokenTTL)}
			}
			c, err := client()
			if err != nil {
				return err
			}
			t, err := c.CreateToken(cmd.Context(), api.MeshTokenRequest{MaxUses: uses, TTLSeconds: int(ttl / time.Second)})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(t)
			}
			fmt.Println(t.Token)
			fmt.Fprintf(os.Stderr, "good for %d enrolment(s) until %s; only its hash is kept\n", t.MaxUses, t.Expires.Format(time.RFC3339))
			return nil
		},
	}
	create.Flags().IntVar(&uses, "max-uses", 1, "enrolments the token is good for")
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long it is good for (at most a week)")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(create)
	return cmd
}

func membersCmd(client func() (*controlplane.Client, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "members",
		Short: "List the mesh's members (revoked ones too)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			ms, err := c.Members(cmd.Context())
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tENROLLED\tREVOKED")
			for _, m := range ms {
				rev := "-"
				if !m.RevokedAt.IsZero() {
					rev = m.RevokedAt.Format(time.RFC3339)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", m.Name, m.EnrolledAt.Format(time.RFC3339), rev)
			}
			return w.Flush()
		},
	}
}

func revokeCmd(client func() (*controlplane.Client, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a member: the others refuse its credential from their next fetch of the keys (seconds)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			if err := c.Revoke(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Printf("revoked %s\n", args[0])
			return nil
		},
	}
}

func policyCmd(client func() (*controlplane.Client, error)) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "The mesh's policy (roles, bindings, egress), served to every member"}
	set := &cobra.Command{
		Use:   "set FILE",
		Short: "Set the mesh's policy from FILE (YAML or JSON; - for stdin): validated first, a bad one changes nothing",
		Long: `policy set sends FILE to the control plane, which validates it as every
member will parse it (internal/sam/policy: roles, bindings, egress) and, if it
is good, stores it as the next version. Members take it within seconds
(they poll every 2 s). A policy refused is reported with what is wrong,
and the one in force stays.`,
		Example: "  sam-control-plane policy set /etc/sam/policy.yaml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var doc []byte
			var err error
			if args[0] == "-" {
				doc, err = io.ReadAll(io.LimitReader(os.Stdin, controlplane.MaxPolicyBytes+1))
			} else {
				doc, err = os.ReadFile(args[0])
			}
			if err != nil {
				return err
			}
			// Checked here too, so a typo is named without a round trip;
			// the control plane checks it again, the same way.
			if _, err := policy.Parse(doc); err != nil {
				return fmt.Errorf("%s: %w (nothing changed)", args[0], err)
			}
			c, err := client()
			if err != nil {
				return err
			}
			p, err := c.SetPolicy(cmd.Context(), doc)
			if err != nil {
				return err
			}
			fmt.Printf("policy version %d set; members take it within seconds\n", p.Version)
			return nil
		},
	}
	var asJSON bool
	get := &cobra.Command{
		Use:   "get",
		Short: "Print the mesh's policy in force (its version on stderr)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			p, _, err := c.Policy(cmd.Context(), "", 0)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(p)
			}
			if p.Version == 0 {
				fmt.Fprintln(os.Stderr, "no policy set yet: members grant nothing (sam-control-plane policy set FILE)")
				return nil
			}
			fmt.Fprintf(os.Stderr, "policy version %d, set %s\n", p.Version, p.SetAt.Format(time.RFC3339))
			fmt.Print(p.Document)
			if !strings.HasSuffix(p.Document, "\n") {
				fmt.Println()
			}
			return nil
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON ({version, document, set_at})")
	cmd.AddCommand(set, get)
	return cmd
}

func keysCmd(client func() (*controlplane.Client, error)) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "The control plane's signing keys"}
	var grace time.Duration
	rotate := &cobra.Command{
		Use:   "rotate [--grace D]",
		Short: "Make a new signing key; the old one still verifies for --grace (default: twice a credential's life)",
		Long: `keys rotate makes a new signing key and keeps it (with the others still
in their grace) in <data-dir>/issuer-keys.json, mode 0600. New credentials
are signed with it from now; members fetch the new key set within seconds.
The key it replaces still verifies until the grace ends: by default twice
a credential's life (20 min), so no credential signed before is refused
early. --grace 0 retires it at once, for a key that leaked: every member's
credential is then refused until it renews.`,
		Example: "  sam-control-plane keys rotate\n  sam-control-plane keys rotate --grace 0   # the old key leaked",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var g *time.Duration
			if cmd.Flags().Changed("grace") {
				if grace < 0 || grace > controlplane.MaxGrace {
					return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--grace 0 to %v, please", controlplane.MaxGrace)}
				}
				g = &grace
			}
			c, err := client()
			if err != nil {
				return err
			}
			r, err := c.RotateKeys(cmd.Context(), g)
			if err != nil {
				return err
			}
			fmt.Printf("signing with key %s; key %s verifies until %s\n", r.Current, r.RetiredKey, r.RetiresAt.Format(time.RFC3339))
			return nil
		},
	}
	rotate.Flags().DurationVar(&grace, "grace", 0, "how long the replaced key still verifies (default: the control plane's, twice a credential's life)")
	cmd.AddCommand(rotate)
	return cmd
}
