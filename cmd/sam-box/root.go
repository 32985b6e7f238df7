package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"sandstorm/internal/logging"
	"sandstorm/internal/sam/boundary"
	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sam/refusals"
)

type options struct {
	principal       string
	policy          string
	socket          string
	socketMode      string
	mesh            string
	listen          string
	peer            string
	sandboxNets     []string
	resolver        string
	proxyPort       int
	dnsPort         int
	transparentPort int
	synthetic       string
	config          string
	metricsAddr     string
	policyInterval  time.Duration
	handshake       time.Duration
	dialTimeout     time.Duration
	log             logging.Flags

	// set: which flags were given on the command line.
	set func(name string) bool
	// ready, if set, is called once every boundary listens (tests).
	ready func(metricsAddr net.Addr)
}

const rootHelp = `sam-box runs the boundary of one agent (--principal), or of many agents
served by one process (--config), as a host process. A boundary is the only
way out of its sandbox; the principal is who the sandbox IS, and every flow
is decided for it by the policy, on the destination's name, before anything
is dialled.

Each boundary accepts flows as SOCKS5 (RFC 1928, CONNECT; RFC 1929
username/password when users are configured) and HTTP CONNECT on its Unix
--socket, and, with --listen (the host side of the sandbox's veth), on
--proxy-port, with DNS on --dns-port and the transparent listener (TCP the
node redirects from synthetic addresses with nftables) on --transparent-port.
Those listeners serve only the sandbox's own address (--peer): a connection
or DNS query from any other source is reset or dropped, and counted.

Destinations:
  mesh.sam.alt                 the mesh entrypoint: the boundary serves HTTP
                               itself and forwards only /v1/models,
                               /v1/chat/completions, /v1/completions and /mcp
                               to the local sam-node (--mesh), setting
                               X-Sam-Principal and removing every identity or
                               credential header the agent sent; other paths 403
  <svc>.mcp.sam.alt            one MCP server (forwarded to /mcp/<svc>)
  <svc>.inference.sam.alt      one model (X-Sam-Service: inference://<svc>)
  anything else                external: allowed only if the principal's
                               egress allowlist names it, then resolved by the
                               boundary (--resolver) and spliced — but only to
                               an address a sandbox may reach: never
                               loopback, link-local (169.254/16, metadata),
                               multicast, broadcast, reserved, this host's own
                               addresses, --sandbox-net, routes into sandbox
                               veths (ssv*), nor private ranges or networks
                               this host is attached to unless the policy's
                               egress_private names them. The address is
                               checked again on the socket that connects, so a
                               name that re-resolves elsewhere (DNS rebinding)
                               gains nothing

Names not granted are refused alike whether or not they exist (SOCKS5 reply
0x02, CONNECT 403, DNS NXDOMAIN). Without --policy nothing is granted. The
policy file is reloaded when it changes; a bad file is rejected, logged, and
the policy in force stays.

With --mesh, the boundaries' refusals are counted by principal, target and
reason (at most 1,024 rows; the rest only counted) and reported to that
sam-node every 2 s, which passes them on to the mesh's console.

Config file (--config, YAML or JSON), for many boundaries in one process:

  mesh: unix:///run/sam-node.sock    # default for every boundary
  policy: /etc/sam/policy.yaml       # default for every boundary
  boundaries:
    - principal: agent-a
      socket: /run/sam/agent-a.sock
    - principal: agent-b
      socket: /run/sam/agent-b.sock
      listen: 10.213.0.5             # optional, as --listen
      peer: 10.213.0.6               # with listen: the sandbox's address, as --peer
      proxy_port: 1080               # optional, as --proxy-port etc.
      dns_port: 53
      transparent_port: 15001
      policy: /etc/sam/other.yaml    # optional, overrides the default
      users: {agent: secret}         # optional RFC 1929 / Proxy-Authorization

--mesh and --policy given on the command line override the file's defaults.

Prometheus metrics (sam_box_*, plus process and Go runtime metrics) are
served on /metrics of --metrics-addr only when it is given: any listener
sam-box opens is one more thing reachable from wherever it is bound.

SIGTERM or SIGINT resets every flow, closes the listeners, removes the
sockets and exits 0.`

func rootCmd() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "sam-box",
		Short: "SAM boundaries: each agent's only way out, deciding every flow by name",
		Long:  rootHelp,
		Example: `  sam-box --principal agent-a --policy /etc/sam/policy.yaml \
    --socket /run/agent.sock --mesh unix:///run/sam-node.sock

  # with the sandbox-facing listeners and metrics
  sam-box --principal agent-a --policy policy.yaml --socket /run/agent.sock \
    --mesh unix:///run/sam-node.sock --listen 10.213.0.1 --metrics-addr 127.0.0.1:9600

  # many boundaries, one process
  sam-box --config /etc/sam/boxes.yaml --metrics-addr 127.0.0.1:9600

  # what an agent does (curl 7.84 or later speaks SOCKS over a Unix socket)
  curl --proxy socks5h://localhost/run/agent.sock http://mesh.sam.alt/v1/models`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.set = func(name string) bool { return cmd.Flags().Changed(name) }
			return run(cmd.Context(), o, cmd.ErrOrStderr()) // ends at SIGINT or SIGTERM (cli.ExitOnSignal)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.principal, "principal", "", "who the sandbox is: every flow is decided for this principal (one boundary; or use --config)")
	f.StringVar(&o.policy, "policy", "", "policy file (YAML or JSON): roles and bindings; reloaded on change; none grants nothing")
	f.StringVar(&o.socket, "socket", "", "Unix socket accepting SOCKS5 and HTTP CONNECT, e.g. /run/agent.sock")
	f.StringVar(&o.socketMode, "socket-mode", "0660", "file mode of the Unix sockets (octal)")
	f.StringVar(&o.mesh, "mesh", "", "the local sam-node's agent listener: unix:///path or tcp://host:port; none: mesh names are unreachable")
	f.StringVar(&o.listen, "listen", "", "sandbox-facing address (host side of the sandbox's veth) for the proxy, DNS and transparent listeners")
	f.StringVar(&o.peer, "peer", "", "the sandbox's own address: the only source the --listen listeners serve (required with --listen)")
	f.StringSliceVar(&o.sandboxNets, "sandbox-net", nil, "a sandbox subnet (CIDR) no allowed name may resolve into; repeatable")
	f.StringVar(&o.resolver, "resolver", "", "DNS server (IP:port) allowed external names are resolved with (default: the system's resolver)")
	f.IntVar(&o.proxyPort, "proxy-port", boundary.DefaultProxyPort, "SOCKS5 and CONNECT port on --listen")
	f.IntVar(&o.dnsPort, "dns-port", boundary.DefaultDNSPort, "DNS port (UDP and TCP) on --listen")
	f.IntVar(&o.transparentPort, "transparent-port", boundary.DefaultTransparentPort, "transparent listener port on --listen")
	f.StringVar(&o.synthetic, "synthetic", boundary.DefaultSynthetic.String(), "IPv4 pool DNS answers synthetic addresses from")
	f.StringVar(&o.config, "config", "", "file listing many boundaries served by this process (see above)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on host:port/metrics (off unless given)")
	f.DurationVar(&o.policyInterval, "policy-interval", 2*time.Second, "how often policy files are checked for changes")
	f.DurationVar(&o.handshake, "handshake-timeout", boundary.DefaultHandshakeTimeout, "longest a SOCKS5 or CONNECT handshake may take")
	f.DurationVar(&o.dialTimeout, "dial-timeout", boundary.DefaultDialTimeout, "longest resolving and opening an upstream may take")
	o.log.Register(f)
	return cmd
}

// fileConfig is the --config file.
type fileConfig struct {
	Mesh       string             `json:"mesh,omitempty"`
	Policy     string             `json:"policy,omitempty"`
	Boundaries []boundary.SetSpec `json:"boundaries"`
}

func loadFileConfig(path string) (fileConfig, error) {
	var fc fileConfig
	data, err := os.ReadFile(path)
	if err != nil {
		return fc, fmt.Errorf("--config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &fc); err != nil {
		return fc, fmt.Errorf("--config %s: %w", path, err)
	}
	if len(fc.Boundaries) == 0 {
		return fc, fmt.Errorf("--config %s: no boundaries", path)
	}
	return fc, nil
}

func newLogger(o options, w io.Writer) (*slog.Logger, error) {
	return o.log.New(w)
}

// meshDialer turns --mesh into a dial function; "" is nil (unreachable).
func meshDialer(spec string) (func(ctx context.Context) (net.Conn, error), error) {
	if spec == "" {
		return nil, nil
	}
	u, err := url.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("--mesh %q: %w", spec, err)
	}
	var network, addr string
	switch u.Scheme {
	case "unix":
		if u.Host != "" || u.Path == "" {
			return nil, fmt.Errorf("--mesh %q: want unix:///absolute/path", spec)
		}
		network, addr = "unix", u.Path
	case "tcp":
		if u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("--mesh %q: want tcp://host:port", spec)
		}
		network, addr = "tcp", u.Host
	case "":
		if u.Path == "" || u.Path[0] != '/' {
			return nil, fmt.Errorf("--mesh %q: want unix:///path or tcp://host:port", spec)
		}
		network, addr = "unix", u.Path
	default:
		return nil, fmt.Errorf("--mesh %q: want unix:///path or tcp://host:port", spec)
	}
	var d net.Dialer
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, network, addr) }, nil
}

func run(ctx context.Context, o options, stderr io.Writer) error {
	log, err := newLogger(o, stderr)
	if err != nil {
		return err
	}
	cfg, fc, err := setConfig(o, log)
	if err != nil {
		return err
	}
	var reg *prometheus.Registry
	if o.metricsAddr != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
		cfg.Metrics = boundary.NewMetrics(reg)
	}
	if cfg.Mesh != nil {
		// The boundaries' refusals, itemised and reported to sam-node on
		// --mesh as sandstormd's node does (internal/sam/refusals).
		cfg.Refusals = refusals.NewTable(refusals.MaxRows)
		rctx, stopReports := context.WithCancel(ctx)
		reported := make(chan struct{})
		go func() {
			defer close(reported)
			refusals.Forward(rctx, cfg.Refusals, refusals.BoundaryEvery, refusals.ToSAMNode(refusals.DialClient(cfg.Mesh), "http://sam-node"), "sam-node", log)
		}()
		defer func() { stopReports(); <-reported }()
	}
	set, err := boundary.StartSet(cfg)
	if err != nil {
		return err
	}
	defer set.Close()

	// Metrics, only when asked.
	var msrv *http.Server
	var maddr net.Addr
	errc := make(chan error, 1)
	if o.metricsAddr != "" {
		if msrv, maddr, err = serveMetrics(o.metricsAddr, reg, set, log, errc); err != nil {
			return err
		}
	}
	attrs := []any{"boundaries", set.Len(), "mesh", fc.Mesh, "policy", fc.Policy}
	if set.Len() <= 8 {
		attrs = append(attrs, "principals", set.Principals())
	}
	if maddr != nil {
		attrs = append(attrs, "metrics", maddr.String())
	}
	log.Info("sam-box: ready", attrs...)
	if o.ready != nil {
		o.ready(maddr)
	}

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("sam-box: stopping")
	case serveErr = <-errc:
		log.Error("sam-box: the metrics listener failed; stopping", "err", serveErr)
	}
	flows := set.CloseFlows()
	set.Close()
	if msrv != nil {
		msrv.Close()
	}
	log.Info("sam-box: stopped", "flows_reset", flows)
	return serveErr
}

// setConfig is what the flags and the --config file ask for: the
// boundaries to run and what they share.
func setConfig(o options, log *slog.Logger) (boundary.SetConfig, fileConfig, error) {
	var cfg boundary.SetConfig
	if o.set == nil {
		o.set = func(string) bool { return false }
	}
	mode, err := strconv.ParseUint(o.socketMode, 8, 32)
	if err != nil || mode > 0o777 {
		return cfg, fileConfig{}, fmt.Errorf("--socket-mode %q: want an octal file mode such as 0660", o.socketMode)
	}
	synthetic, err := netip.ParsePrefix(o.synthetic)
	if err != nil {
		return cfg, fileConfig{}, fmt.Errorf("--synthetic: %w", err)
	}
	fc, err := boundaries(o)
	if err != nil {
		return cfg, fc, err
	}
	mesh, err := meshDialer(fc.Mesh)
	if err != nil {
		return cfg, fc, err
	}
	if mesh == nil {
		log.Warn("sam-box: no --mesh: flows to mesh names will fail as unreachable")
	}
	guard := &dialguard.Guard{SandboxIfPrefix: "ssv"}
	for _, n := range o.sandboxNets {
		p, err := netip.ParsePrefix(n)
		if err != nil {
			return cfg, fc, fmt.Errorf("--sandbox-net %q: want a CIDR such as 10.213.0.0/16", n)
		}
		guard.SandboxNets = append(guard.SandboxNets, p.Masked())
	}
	var resolve func(context.Context, string) ([]netip.Addr, error)
	if o.resolver != "" {
		if resolve, err = boundary.Resolver(o.resolver); err != nil {
			return cfg, fc, err
		}
	}
	return boundary.SetConfig{
		Boundaries: fc.Boundaries, Policy: fc.Policy, PolicyInterval: o.policyInterval,
		Mesh: mesh, Guard: guard, Resolve: resolve,
		ProxyPort: o.proxyPort, DNSPort: o.dnsPort, TransparentPort: o.transparentPort,
		Synthetic: synthetic, SocketMode: os.FileMode(mode),
		HandshakeTimeout: o.handshake, DialTimeout: o.dialTimeout, Log: log,
	}, fc, nil
}

// boundaries is the command line's one boundary, or the file's many, with
// the mesh and default policy the command line gives overriding the file's.
func boundaries(o options) (fileConfig, error) {
	var fc fileConfig
	var err error
	switch {
	case o.config != "" && o.principal != "":
		return fc, errors.New("--principal and --config are exclusive: list every boundary in the file")
	case o.config != "":
		if fc, err = loadFileConfig(o.config); err != nil {
			return fc, err
		}
		for _, name := range []string{"socket", "listen", "peer"} {
			if o.set(name) {
				return fc, fmt.Errorf("--%s is per boundary: give it in the --config file", name)
			}
		}
	case o.principal != "":
		fc.Boundaries = []boundary.SetSpec{{Principal: o.principal, Socket: o.socket, Listen: o.listen, Peer: o.peer,
			ProxyPort: o.proxyPort, DNSPort: o.dnsPort, TransparentPort: o.transparentPort}}
	default:
		return fc, errors.New("no boundary: give --principal (with --socket and/or --listen) or --config")
	}
	if o.set("mesh") || fc.Mesh == "" {
		fc.Mesh = o.mesh
	}
	if o.set("policy") || fc.Policy == "" {
		fc.Policy = o.policy
	}
	return fc, nil
}

// serveMetrics serves reg (and the set's size) on addr's /metrics; a
// failure to serve later is sent to errc.
func serveMetrics(addr string, reg *prometheus.Registry, set *boundary.Set, log *slog.Logger, errc chan<- error) (*http.Server, net.Addr, error) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sam_box_boundaries",
		Help: "Boundaries served by this process.",
	}, func() float64 { return float64(set.Len()) }))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := msrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	return msrv, ln.Addr(), nil
}
