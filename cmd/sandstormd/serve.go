package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"sandstorm/internal/cli"
	"sandstorm/internal/daemon"
	"sandstorm/internal/logging"
	"sandstorm/internal/node"
	"sandstorm/internal/sandbox/gvisor"
	"sandstorm/internal/templates"
)

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "sandstormd",
		Short: "Sandstorm: a fleet of gVisor sandboxes that sleep in tiers and wake on traffic",
		Long: `Sandstorm runs many more sandboxes than a machine could keep awake. Idle
sandboxes drop a tier at a time — hot → frozen (paused in place) → snapshot
(checkpointed to disk) → detached (only the volume is left) — and any request
to one of their ports brings them straight back to hot.

Start the daemon with 'sandstormd serve --master --node', then use the
template and sandbox commands (or the HTTP API, docs/API.md).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("data-dir", envOr("SANDSTORM_DATA_DIR", "/var/lib/sandstorm"), "where sandstormd keeps its state, API token and sandboxes (env SANDSTORM_DATA_DIR)")
	root.AddCommand(serveCmd(), doctorCmd(), templateCmd(), sandboxCmd(), snapshotCmd(), apiKeyCmd(), secretCmd(), nodeCmd(), fleetCmd())
	root.AddCommand(reloadCmd(), handoffVersionCmd(), storeCmd())
	return root
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func serveCmd() *cobra.Command {
	var o daemon.Options
	var reserve int64
	var logFlags logging.Flags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the master, a node, or both (one process)",
		Long: `Run sandstormd. --master --node runs both in one process: the HTTPS API and
console on --listen, desired state in SQLite under --data-dir (or PostgreSQL:
--store), sandboxes on this machine.
--node alone runs a node apart from its master: it listens on --node-listen,
writes a pairing code to <data-dir>/pki/node/pairing-code, and once a master
has paired with it (POST /v1/nodes {"address", "pairing_code"}) serves that
master only, over mutual TLS; a node the master cannot reach dials it
instead (--join, --ca-fingerprint, --join-token). --master alone places
sandboxes on the nodes it paired with.

On first start the master makes its CA (<data-dir>/pki/ca.pem; the API's
certificate is from it) and the API token (<data-dir>/pki/api-token, mode
0600); every API call needs "Authorization: Bearer <token>".

Stopping or killing sandstormd leaves sandboxes as they are; the next start
adopts running ones, keeps snapshots restorable and finishes or rolls back
transitions that were cut short.

SIGHUP (sandstormd reload, systemctl reload sandstormd) re-executes the
binary at sandstormd's path in the same process and hands it every
listening socket: a connection that arrives meanwhile waits and is served
by the new binary instead of being refused (--reload-drain bounds the wait
for requests in flight).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.DataDir, _ = cmd.Flags().GetString("data-dir")
			o.MemReserve = reserve
			return runServe(cmd, o, logFlags)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.Master, "master", false, "run the master: API, store, placement")
	f.BoolVar(&o.Node, "node", false, "run a node: sandboxes, tiers, gateway")
	f.StringVar(&o.Store, "store", os.Getenv("SANDSTORM_STORE"), "where the master keeps desired state (env SANDSTORM_STORE): empty is SQLite at <data-dir>/state.db; a PostgreSQL URL (postgres://user:pass@host/db, or postgres:///db?host=/var/run/postgresql) lets several masters share it: one leads, the others stand by, answer 503 and take over within seconds when it stops")
	f.StringVar(&o.NodeListen, "node-listen", os.Getenv("SANDSTORM_NODE_LISTEN"), "with --node alone: where this node listens for its master (host:port; env SANDSTORM_NODE_LISTEN): pairing with the code in <data-dir>/pki/node/pairing-code, then the master's calls over mutual TLS. It serves no public API")
	ingressFlags(f, &o)
	f.StringVar(&o.Join, "join", "", "with --node alone: dial this master (https://host:port) and keep that connection, for a node the master cannot reach (behind NAT); its calls ride it")
	f.StringVar(&o.CAFingerprint, "ca-fingerprint", "", "with --join: the SHA-256 of the master's CA (POST /v1/nodes/join-tokens says it); the node refuses any other")
	f.StringVar(&o.JoinToken, "join-token", os.Getenv("SANDSTORM_JOIN_TOKEN"), "with --join, the first time: the master's join token (good once, for an hour; env SANDSTORM_JOIN_TOKEN)")
	f.StringVar(&o.NodeName, "node-name", "local", "this node's name in the store; nodes sharing a PostgreSQL store need names of their own")
	f.StringVar(&o.Listen, "listen", envOr("SANDSTORM_LISTEN", "127.0.0.1:8080"), "API address host:port (env SANDSTORM_LISTEN)")
	f.StringVar(&o.Backend, "backend", "gvisor", "sandbox backend: gvisor (runsc) or process (plain namespaces + cgroup v2; no snapshot tier here)")
	f.StringVar(&o.Runsc, "runsc", "", "runsc binary of the gvisor backend (default: the pinned one next to sandstormd, built by make runsc)")
	f.StringVar(&o.Platform, "platform", gvisor.DefaultPlatform, "runsc platform: systrap or ptrace (systrap starts, wakes and serves faster here; see docs/OPERATING.md, \"Platform\")")
	f.StringVar(&o.Compression, "snapshot-compression", "none", "compression of snapshot images: none (restores at the disk's speed; a Python server's image is ~9 MiB) or flate-best-speed (~4x smaller, slower to restore)")
	f.StringVar(&o.Subnet, "subnet", "10.213.0.0/16", "private IPv4 subnet for sandbox veths, split into one /30 per sandbox")
	f.StringVar(&o.GatewayBind, "gateway-listen", "127.0.0.1", "address the gateway's per-sandbox-port listeners bind")
	f.StringVar(&o.HostListen, "gateway-host-listen", "", "also serve every sandbox's HTTP ports on this one address, routed by Host: http://<port>-<sandbox>.<gateway-domain>:<its port>/ (off unless set; e.g. 127.0.0.1:8090)")
	f.StringVar(&o.HostDomain, "gateway-domain", "sandbox.localhost", "domain of the Host-routed listener's names (under .localhost every name resolves to loopback with no DNS, RFC 6761)")
	f.StringVar(&o.Envd, "envd", "", "the static envd binary mounted in every sandbox for sandbox exec/cp and the E2B API (default: sandstorm-envd beside sandstormd when it is there; \"none\": off)")
	f.StringVar(&o.GatewayPorts, "gateway-ports", "20000-29999", "range of gateway ports, one per sandbox port")
	f.Int64Var(&reserve, "memory-reserve", 256, "MiB of MemAvailable to keep free: a create or wake is admitted only if what starting sandboxes are still to take leaves it; the least-used sandboxes go to disk as it is approached; what cannot fit in time gets 503 (0 disables)")
	f.Int64Var(&o.SandboxMemory, "sandbox-memory", 1024, "memory limit (MiB) of a sandbox whose template and request set none; every sandbox's limit is enforced by its cgroup, and a starting one counts at it (or at what its template's sandboxes settled at) until it has settled")
	f.Int64Var(&o.DiskReserve, "disk-reserve", 1024, "MiB of disk to keep free under --data-dir: below it creates and snapshots are refused (503), the node detaches instead of snapshotting, and snapshot sandboxes are detached least-used first (0 disables)")
	f.IntVar(&o.MaxWakes, "max-wakes", 2, "wakes (cold starts and restores) that may run at once; more wait")
	f.IntVar(&o.MaxStarts, "max-starts", node.DefaultMaxStarts, "creates and clones that may start their sandbox at once; more queue for as long as their caller waits (a pooled create never queues)")
	f.DurationVar(&o.Admission, "wake-admission", 2*time.Second, "a wake that cannot start within this is refused with 503 and Retry-After rather than queued")
	f.DurationVar(&o.Ready, "ready-timeout", 30*time.Second, "how long the gateway retries connecting to a sandbox whose process is still starting")
	f.DurationVar(&o.Timers.Freeze, "freeze-after", 30*time.Second, "idle time before a hot sandbox is frozen (0: never)")
	f.DurationVar(&o.Timers.Snapshot, "snapshot-after", 5*time.Minute, "further idle time before a frozen sandbox is snapshot to disk (0: never)")
	f.DurationVar(&o.Timers.Detach, "detach-after", time.Hour, "further idle time before a snapshot sandbox is detached (0: never)")
	f.BoolVar(&o.Zswap, "zswap", false, "after freezing a sandbox, squeeze its memory into swap (zswap is switched on); needs an active swap area")
	f.StringVar(&o.Policy, "policy", "", "SAM policy file (YAML/JSON roles and bindings) every sandbox's boundary decides by; reloaded on change. \"sam-node\": the mesh's policy, from the control plane through --sam-node (nothing is granted until it arrives; the last good one stays while sam-node cannot be reached). Without it every sandbox can reach nothing")
	f.StringVar(&o.SAMNode, "sam-node", "", "the local sam-node's agent socket, unix:///run/sam-node.sock: where flows to mesh.sam.alt go")
	f.StringVar(&o.SecretsCA, "secrets-ca", "", "PEM file of CAs that verify the HTTPS servers stored secrets are sent to, beside the system's roots (a private API's CA)")
	f.StringVar(&o.Resolver, "resolver", "", "DNS server (IP:port) the boundaries resolve allowed external names with (default: the system's resolver). Whatever it answers, an address on this node, in a sandbox, loopback, link-local or private (unless the policy's egress_private names it) is never dialled")
	f.StringVar(&o.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics on http://ADDR/metrics: the node's (tiers, transitions, wakes, refusals, headroom, runsc, gateway), the master's (its nodes, API requests), a node's ingress (sandstorm_ingress_*) and the boundaries' (sam_box_*); e.g. 127.0.0.1:9600. Off unless set; plain HTTP with no token, so give a loopback or management address (no sandbox reaches it on any address)")
	logFlags.Register(f)
	f.Int64Var(&o.MaxUpload, "max-upload", 4<<30, "largest rootfs tarball or build context upload, in bytes (413 beyond)")
	f.StringVar(&o.BuildPrincipal, "build-principal", templates.DefaultBuildPrincipal, "principal of template builds' RUN sandboxes: what --policy grants it (a package mirror) is all a build's RUN may reach")
	f.StringToStringVar(&o.RegistryMirrors, "registry-mirror", nil, "REGISTRY=HOST[:PORT]: pull the images of E2B's template builds that name REGISTRY (docker.io for Docker Hub's, e.g. ubuntu:22.04) from HOST instead, e.g. docker.io=mirror.internal:5000; repeat or comma-separate for more")
	f.DurationVar(&o.ReloadDrain, "reload-drain", daemon.DefaultReloadDrain, "how long a reload (SIGHUP) waits for requests in flight to be answered before it cuts them; new connections wait in the listeners' backlogs meanwhile")
	return cmd
}

// runServe checks serve's flags, then runs the daemon until SIGINT or
// SIGTERM, SIGHUP asking it to reload.
func runServe(cmd *cobra.Command, o daemon.Options, logFlags logging.Flags) error {
	// The flags' own checks are usage errors (exit 2), before anything
	// starts; Serve checks again for its other callers.
	usage := func(err error) error { return cli.UsageError{Cmd: cmd.CommandPath(), Err: err} }
	if err := daemon.Check(o); err != nil {
		return usage(err)
	}
	if cmd.Flags().Changed("ingress-dns-rate") && o.IngressDNS == "" {
		return usage(errors.New("--ingress-dns-rate limits the DNS of --ingress-dns HOST:PORT: give that too, or leave the rate out"))
	}
	log, err := logFlags.New(os.Stderr)
	if err != nil {
		return usage(err)
	}
	o.Log = log
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP is a reload (without this it would end the process).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reload := make(chan struct{})
	go func() {
		for range hup {
			reload <- struct{}{}
		}
	}()
	o.Reload = reload
	return daemon.Serve(ctx, o)
}

// ingressFlags are a node's ingress's (serve --ingress-listen).
func ingressFlags(f *pflag.FlagSet, o *daemon.Options) {
	f.StringVar(&o.IngressListen, "ingress-listen", "", "with --node --node-listen: also serve E2B's traffic to every sandbox of the fleet here (envd, code interpreter, ports at <port>-<id>.<gateway-domain>): this node's own directly, another node's connection passed unread to that node's own ingress (see --ingress-requests-only); tokens checked there, the master off the path")
	f.StringVar(&o.IngressCert, "ingress-cert", "", "with --ingress-listen: its TLS certificate (PEM, for *.<gateway-domain>); without it the ingress is plain HTTP, for a TLS proxy in front")
	f.StringVar(&o.IngressKey, "ingress-key", "", "with --ingress-cert: its key (PEM)")
	f.StringVar(&o.IngressPublic, "ingress-public", "", "with --ingress-listen: the IP address clients reach this node's ingress at (on its port); the fleet's DNS (--ingress-dns, on any node) answers it for this node's sandboxes, so their clients come here straight (default with --ingress-dns: --ingress-listen's host)")
	f.StringVar(&o.IngressDNS, "ingress-dns", "", "with --ingress-listen: answer DNS for <gateway-domain> on HOST:PORT (UDP and TCP; delegate the domain to the nodes): each sandbox's names give the node that holds it (its --ingress-public), else this one; never recursive")
	f.StringArrayVar(&o.IngressDNSRecords, "ingress-dns-record", nil, "with --ingress-dns: a fixed name in the domain, NAME=IP (repeatable): api=IP for the master's API, as E2B's SDK calls api.<domain>; @=IP for the domain itself")
	f.StringArrayVar(&o.IngressDNSNS, "ingress-dns-ns", nil, "with --ingress-dns: a name server of the domain, as its parent delegates it (repeatable; the first is the SOA's primary): a host name, or a label under the domain (ns1), whose address --ingress-dns-record ns1=IP then gives")
	f.Float64Var(&o.IngressDNSRate, "ingress-dns-rate", 20, "with --ingress-dns: answers a second over UDP to one client network (IPv4 /24, IPv6 /56) for one name, or for errors together; past it every second answer is sent empty and truncated (a real client asks again over TCP, never limited) and the rest dropped, so forged questions cannot turn the DNS on a victim (0: no limit)")
	f.BoolVar(&o.IngressRequests, "ingress-requests-only", false, "with --ingress-listen: forward another node's sandbox traffic request by request over the nodes' mutual TLS, instead of passing each connection unread to the holder's own ingress (by its TLS server name, or its first request's target in plain HTTP)")
}
