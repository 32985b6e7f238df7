package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/client"
	"sandstorm/internal/sam/inject"
)

// secretCmd is "secret": stored secrets that sandboxes use and never hold
// (internal/secrets, docs/API.md "Secrets").
func secretCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage secrets that sandboxes send but never see",
		Long: `A secret is stored once (sealed at rest, never shown again) with the only
names it may be sent to. A sandbox created with --secret VAR=NAME gets a
marker in VAR, not the secret: its boundary puts the secret in place of the
marker only in HTTPS requests to those names (ending TLS with the
sandbox's own CA, which is in its trust store, and verifying the real
server), in headers, path and query (and bodies, with --body), and puts
the marker back wherever their answers quote the secret. Sent anywhere
else, the marker goes out as the marker. A team's key sees and uses only
its team's secrets.`,
	}
	addAPIFlag(cmd)
	var hosts []string
	var fromFile string
	var body bool
	create := &cobra.Command{
		Use:   "create NAME --host HOST [--host HOST…] [--from-file FILE] [--body]",
		Short: "Store a secret (its value from --from-file, else from stdin); storing NAME again replaces it",
		Example: "  printf %s \"$OPENAI_API_KEY\" | sandstormd secret create openai --host api.openai.com\n" +
			"  sandstormd secret create gh --host github.com --host '*.github.com' --from-file ~/.gh-token\n" +
			"  sandstormd sandbox create base --secret OPENAI_API_KEY=openai",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(hosts) == 0 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: errors.New("--host is required: the names the secret may be sent to (api.example.com, *.example.com)")}
			}
			for _, h := range hosts {
				if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
					return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("--host %s: an address; a secret goes to names only (the real server's certificate is checked for the name)", h)}
				}
			}
			value, err := readSecret(cmd.InOrStdin(), fromFile)
			if err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			if len(value) < inject.MinScrub {
				// Stored all the same (a short PIN is a secret too); said,
				// as a host that echoes it would hand it to the sandbox.
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: a value of %d bytes is not scrubbed from its hosts' answers (only %d bytes or more are: shorter would match bytes that are not it); a host that echoes it shows it to the sandbox\n", len(value), inject.MinScrub)
			}
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			s, err := c.PutSecret(cmd.Context(), api.SecretRequest{Name: args[0], Value: value, Hosts: hosts, Body: body})
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(s)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stored secret %s for %s (use: sandstormd sandbox create TEMPLATE --secret VAR=%s)\n", s.Name, strings.Join(s.Hosts, ", "), s.Name)
			return nil
		},
	}
	create.Flags().StringArrayVar(&hosts, "host", nil, "a name the secret may be sent to (api.example.com, or *.example.com for every name under it); repeatable")
	create.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file (one trailing newline is dropped); default: stdin")
	create.Flags().BoolVar(&body, "body", false, "replace the marker in request bodies too (a form's client_secret); off by default, as a service can store a body and show it back")
	ls := &cobra.Command{
		Use: "ls", Short: "List secrets (names and hosts; never values)", Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, _ []string) error {
			l, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(l)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOSTS\tIN BODIES\tSTORED")
			for _, s := range l {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, strings.Join(s.Hosts, ","), yesNo(s.Body), s.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		}),
	}
	rm := &cobra.Command{
		Use: "rm NAME…", Short: "Delete secrets (sandboxes already made with one keep it until deleted)", Args: cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			for _, n := range args {
				if err := c.DeleteSecret(cmd.Context(), n); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", n)
			}
			return nil
		}),
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}

// readSecret reads a value from file, or from in, dropping one trailing
// newline (what echo and editors add). Never from a flag: a flag's value
// is in the shell's history and in ps.
func readSecret(in io.Reader, file string) (string, error) {
	var b []byte
	var err error
	if file != "" {
		b, err = os.ReadFile(file)
	} else {
		if f, ok := in.(*os.File); ok {
			if fi, serr := f.Stat(); serr == nil && fi.Mode()&os.ModeCharDevice != 0 {
				fmt.Fprintln(os.Stderr, "reading the secret from stdin (end with Ctrl-D)…")
			}
		}
		b, err = io.ReadAll(io.LimitReader(in, 1<<20))
	}
	if err != nil {
		return "", err
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if len(b) == 0 {
		return "", errors.New("the secret is empty: pipe it in, or give --from-file")
	}
	return string(b), nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
