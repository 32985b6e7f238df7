package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/demo"
)

// apiClient builds a client from --api and the token (SANDSTORM_TOKEN, or
// <data-dir>/pki/api-token).
func apiClient(cmd *cobra.Command) (*client.Client, error) {
	base, _ := cmd.Flags().GetString("api")
	tok, from := os.Getenv("SANDSTORM_TOKEN"), "SANDSTORM_TOKEN"
	if tok == "" {
		dd, _ := cmd.Flags().GetString("data-dir")
		var err error
		if tok, err = client.ReadToken(dd); err != nil {
			return nil, err
		}
		from = filepath.Join(dd, "pki", "api-token")
	}
	c := client.New(base, tok)
	c.TokenFrom = from
	if strings.HasPrefix(base, "https://") {
		ca, _ := cmd.Flags().GetString("ca")
		if ca == "" {
			dd, _ := cmd.Flags().GetString("data-dir")
			ca = client.CAFile(dd)
		}
		if err := c.TrustCA(ca); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func addAPIFlag(cmd *cobra.Command) {
	// SANDSTORM_LISTEN is what serve listens on when it is set (a daemon
	// started with it is found without also setting SANDSTORM_API).
	cmd.PersistentFlags().String("api", envOr("SANDSTORM_API", "https://"+envOr("SANDSTORM_LISTEN", "127.0.0.1:8080")), "sandstormd API URL (env SANDSTORM_API; else https:// and SANDSTORM_LISTEN, as serve listens); the token comes from SANDSTORM_TOKEN or <data-dir>/pki/api-token")
	cmd.PersistentFlags().String("ca", os.Getenv("SANDSTORM_CA"), "CA certificate the API's HTTPS is checked against (env SANDSTORM_CA; default <data-dir>/pki/ca.pem, the master's own CA)")
	cmd.PersistentFlags().Bool("json", false, "print JSON instead of a table")
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func tierText(sb api.Sandbox) string {
	if sb.LeftBehind {
		return string(sb.Tier) + " (left behind)"
	}
	if sb.Transition != "" {
		return string(sb.Tier) + "→" + string(sb.Transition)
	}
	if sb.Paused {
		return string(sb.Tier) + " (paused)"
	}
	return string(sb.Tier)
}

func endpoints(sb api.Sandbox) string {
	keys := make([]string, 0, len(sb.Endpoints))
	for k := range sb.Endpoints {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"→"+sb.Endpoints[k])
	}
	return strings.Join(parts, " ")
}

func printSandbox(cmd *cobra.Command, sb api.Sandbox) error {
	if j, _ := cmd.Flags().GetBool("json"); j {
		return printJSON(sb)
	}
	fmt.Printf("%s (%s) %s, address %s\n", sb.Name, sb.ID, tierText(sb), sb.Address)
	for _, e := range strings.Fields(endpoints(sb)) {
		fmt.Println("  ", e)
	}
	ports := make([]string, 0, len(sb.HostEndpoints))
	for p := range sb.HostEndpoints {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	for _, p := range ports {
		fmt.Printf("   %s→%s (by Host, HTTP only)\n", p, sb.HostEndpoints[p])
	}
	if sb.Boundary != "" {
		fmt.Printf("   boundary (principal %s): %s\n", sb.Principal, sb.Boundary)
	}
	if e := sb.Egress; e != nil && (len(e.AllowOut) > 0 || len(e.DenyOut) > 0) {
		fmt.Printf("   egress rules: deny out %s, except %s\n", cmp.Or(strings.Join(e.DenyOut, " "), "-"), cmp.Or(strings.Join(e.AllowOut, " "), "-"))
	}
	return nil
}

// demoPackages is every Debian package the demos need, once each.
func demoPackages() []string {
	var out []string
	for _, name := range demo.Names() {
		for _, p := range demo.Packages(name) {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// parseProbe reads --warm-probe: "/healthz" (HTTP on the first port),
// ":8080/healthz", ":8080" (TCP connect), "cmd:COMMAND" (a shell command
// run inside until it exits 0), or "" (TCP connect to the first port).
func parseProbe(s string) (api.Probe, error) {
	var p api.Probe
	if c, ok := strings.CutPrefix(s, "cmd:"); ok {
		if strings.TrimSpace(c) == "" {
			return p, fmt.Errorf("--warm-probe %q: say the command after cmd:", s)
		}
		p.Command = []string{"/bin/sh", "-c", c}
		return p, nil
	}
	if s == "" || strings.HasPrefix(s, "/") {
		p.Path = s
		return p, nil
	}
	rest, ok := strings.CutPrefix(s, ":")
	if !ok {
		return p, fmt.Errorf("--warm-probe %q: want /PATH, :PORT, :PORT/PATH or cmd:COMMAND", s)
	}
	port, path, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return p, fmt.Errorf("--warm-probe %q: bad port %q", s, port)
	}
	p.Port = n
	if path != "" {
		p.Path = "/" + path
	}
	return p, nil
}

// checkReseed is the CLI's own check of a reseed (the node checks again):
// a signal it takes or an absolute command, exactly one, for what.
func checkReseed(signal string, command []string, what string) error {
	switch {
	case signal == "" && len(command) == 0:
		return fmt.Errorf("%s needs --reseed-signal (e.g. SIGUSR1) or --reseed-command: each of its sandboxes starts from the same memory, random state included", what)
	case signal != "" && len(command) > 0:
		return errors.New("give --reseed-signal or --reseed-command, not both")
	case signal != "":
		if _, ok := api.ReseedSignal(signal); !ok {
			return fmt.Errorf("--reseed-signal %q: use one of %s", signal, strings.Join(api.ReseedSignals(), ", "))
		}
	case !strings.HasPrefix(command[0], "/"):
		return fmt.Errorf("--reseed-command %q: give the absolute path of the command inside the rootfs", command[0])
	}
	return nil
}

// warmText says how a template is warm, for template ls ("-": it is not).
func warmText(w *api.Warm) string {
	if w == nil {
		return "-"
	}
	probe := "tcp"
	if w.Probe.Path != "" {
		probe = w.Probe.Path
	}
	if w.Probe.Port != 0 {
		probe = ":" + strconv.Itoa(w.Probe.Port) + probe
	}
	reseed := w.Reseed.Signal
	if reseed == "" {
		reseed = strings.Join(w.Reseed.Command, " ")
	}
	return "probe " + probe + ", reseed " + reseed + ", pool " + strconv.Itoa(w.Pool)
}

// withClient is a command's RunE that needs the API: the client is made
// (apiClient) before run is called with it.
func withClient(run func(cmd *cobra.Command, c *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := apiClient(cmd)
		if err != nil {
			return err
		}
		return run(cmd, c, args)
	}
}
