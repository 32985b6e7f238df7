package membership

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/cli"
	"sandstorm/internal/sam/controlplane"
)

// JoinCommand is "<binary> join" (sam-node's, sam-router's): enrol this
// machine into the mesh once, its identity kept in --mesh-dir (defaultDir
// by default).
func JoinCommand(binary, defaultDir string) *cobra.Command {
	var dir, url, ca, cpName, name, token, tokenFile, oidcFile string
	cmd := &cobra.Command{
		Use:   "join --control-plane URL --ca FILE --name NAME (--token-file FILE|- | --token TOKEN | --oidc-token-file FILE) [--mesh-dir DIR]",
		Short: "Enrol this machine into the mesh with a bootstrap token or an OIDC ID token, once; its identity and credential stay in --mesh-dir (0600)",
		Long: binary + ` join makes this machine's Ed25519 key (or keeps the one in --mesh-dir),
proves it holds it by signing a fresh challenge of the control plane, and
presents the bootstrap token the operator made (sam-control-plane token
create; --token-file reads it from a file, or from stdin with "-", so that
it is never on a command line, which any user of the machine can read in
ps), or instead an OpenID Connect ID token from the issuer the control
plane trusts (--oidc-token-file: a file holding the raw ID token, e.g. from
your identity provider's CLI; the control plane decides which identities
may enrol, and an ID token enrols one machine once). The credential it
gets, bound to its key, is written to --mesh-dir with the key and the
control plane's keys, all mode 0600. A directory that holds a member
already is not joined again.`,
		Example: "  " + binary + " join --control-plane https://10.0.0.1:7600 --ca /etc/sam/cp-ca.pem --name " + exampleName(binary) + " --token samb_…\n" +
			"  " + binary + " join --control-plane https://10.0.0.1:7600 --ca /etc/sam/cp-ca.pem --name " + exampleName(binary) + " --token-file - < token\n" +
			"  " + binary + " join --control-plane https://10.0.0.1:7600 --ca /etc/sam/cp-ca.pem --name " + exampleName(binary) + " --oidc-token-file ~/.sam/id-token",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			given := 0
			for _, v := range []string{token, tokenFile, oidcFile} {
				if v != "" {
					given++
				}
			}
			if url == "" || ca == "" || name == "" || given != 1 {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf("join needs --control-plane, --ca, --name and one of --token-file, --token or --oidc-token-file")}
			}
			if tokenFile != "" {
				var err error
				if token, err = readToken(tokenFile, cmd.InOrStdin()); err != nil {
					return err
				}
			}
			var idToken string
			if oidcFile != "" {
				b, err := os.ReadFile(oidcFile)
				if err != nil {
					return fmt.Errorf("--oidc-token-file: %w", err)
				}
				if idToken = strings.TrimSpace(string(b)); idToken == "" {
					return fmt.Errorf("--oidc-token-file %s is empty", oidcFile)
				}
			}
			caPEM, err := os.ReadFile(ca)
			if err != nil {
				return fmt.Errorf("--ca: %w", err)
			}
			hc, err := httpsClient(caPEM)
			if err != nil {
				return fmt.Errorf("--ca %s: %w", ca, err)
			}
			cp := &controlplane.Client{Base: url, Name: cpName, HTTP: hc}
			cfg := Config{ControlPlane: cp, CAPEM: caPEM}
			var m *Member
			if idToken != "" {
				m, err = JoinOIDC(cmd.Context(), dir, name, idToken, cfg)
			} else {
				m, err = Join(cmd.Context(), dir, name, token, cfg)
			}
			if err != nil {
				return err
			}
			fmt.Printf("joined the mesh as %s; identity and credential in %s\n", m.Name(), dir)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "mesh-dir", defaultDir, "where this machine's mesh identity and credential are kept")
	f.StringVar(&url, "control-plane", "", "the control plane's URL (https://host:port)")
	f.StringVar(&ca, "ca", "", "the control plane's CA certificate (its <data-dir>/pki/ca.pem)")
	f.StringVar(&cpName, "control-plane-name", "sam", "the control plane's name (its serve --name)")
	f.StringVar(&name, "name", "", "this node's name in the mesh")
	f.StringVar(&token, "token", "", "a bootstrap token (sam-control-plane token create); on a command line any user here can read it (ps): prefer --token-file")
	f.StringVar(&tokenFile, "token-file", "", "a file holding the bootstrap token, or - to read it from stdin")
	f.StringVar(&oidcFile, "oidc-token-file", "", "instead of --token: a file holding an OpenID Connect ID token of the control plane's issuer (serve --oidc-issuer)")
	return cmd
}

// readToken reads a bootstrap token from path, or from stdin for "-":
// its first line, trimmed. A token is one line; what follows it is not
// read (stdin may be a script's, fed on).
func readToken(path string, stdin io.Reader) (string, error) {
	var b []byte
	var err error
	if path == "-" {
		// At most one line of a sane length: a token is ~50 bytes, and
		// stdin is read to its first newline only.
		b, err = readLine(stdin, 4096)
		if err != nil {
			return "", fmt.Errorf("--token-file -: reading the token from stdin: %w", err)
		}
	} else if b, err = os.ReadFile(path); err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if tok := strings.TrimSpace(line); tok != "" {
		return tok, nil
	}
	if path == "-" {
		return "", fmt.Errorf("--token-file -: stdin held no token (feed it the token sam-control-plane token create printed)")
	}
	return "", fmt.Errorf("--token-file %s holds no token (put the token sam-control-plane token create printed in it)", path)
}

// readLine reads r a byte at a time up to and including the first
// newline (or EOF), at most max bytes.
func readLine(r io.Reader, max int) ([]byte, error) {
	var out []byte
	b := make([]byte, 1)
	for len(out) < max {
		n, err := r.Read(b)
		if n == 1 {
			if b[0] == '\n' {
				return out, nil
			}
			out = append(out, b[0])
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("no newline within %d bytes: not a token", max)
}

// httpsClient trusts only the CA in caPEM.
func httpsClient(caPEM []byte) (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no PEM certificate")
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}, nil
}

// exampleName is a member name for binary's --help.
func exampleName(binary string) string {
	if binary == "sam-router" {
		return "router-1"
	}
	return "node-a"
}
