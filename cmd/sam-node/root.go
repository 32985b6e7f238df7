package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"

	"sandstorm/internal/logging"
	"sandstorm/internal/sam/membership"
	"sandstorm/internal/sam/meshnode"
	"sandstorm/internal/sam/meshpeer"
)

const defaultMeshDir = "/var/lib/sam-node/mesh"

type options struct {
	config          string
	policy          string
	listen          string
	adminAddr       string
	socketMode      string
	policyInterval  time.Duration
	shutdownTimeout time.Duration
	maxBodyBytes    int64
	log             logging.Flags
	mesh            meshOptions
}

const longHelp = `sam-node serves the agents of this machine, through their boundaries:

  GET  /v1/models             the models the agent's policy grants
  POST /v1/chat/completions   routed by model to an upstream provider (streaming too)
  POST /v1/completions        likewise
  /mcp                        one MCP endpoint (Streamable HTTP) aggregating the
                              configured MCP servers; tools are named <server>__<tool>
  /mcp/<server>               one MCP server's tools under their own names

Only boundaries connect to --listen. Each request must carry X-Sam-Principal,
set by the boundary from who the sandbox is; without it the answer is 403.
What a principal sees and may call is decided by --policy, reloaded when the
file changes (a bad file is rejected and the policy in force stays). Without
--policy nothing is granted to anyone.

Health (/healthz), readiness (/readyz: every MCP server connected) and
Prometheus metrics (/metrics) are served on --admin-addr only, a TCP address
sandboxes cannot reach; the agent listener answers those paths with 404.
With --router it also serves GET /mesh (each router joined or not and since
when, the member's names published there; the control plane reachable or
not, and the keys and policy in use) and GET /mesh/providers?name=NAME (the
members serving NAME, the routers asked now).

Config file (--config, YAML or JSON):

  providers:                          # upstream OpenAI-compatible APIs
    - name: local-vllm
      url: http://127.0.0.1:8000/v1   # base URL; /chat/completions etc. appended
      models: [google/gemma-2-2b-it]
      rank: 0                         # lower is tried first; on a connection
    - name: cloud                     # error or a 5xx the next one is tried
      url: https://llm.example.net/v1
      models: [google/gemma-2-2b-it]
      rank: 10
      api_key_file: /etc/sam/cloud.key   # mode 0600 or stricter, else sam-node
                                         # refuses to start; sent as a bearer
                                         # token, never logged
  mcp_servers:
    - name: everything                # a DNS label: a-z, 0-9, '-'
      command: [node, /opt/mcp/server-everything/dist/index.js, stdio]
    - name: calc
      url: http://127.0.0.1:3001/mcp  # Streamable HTTP

Policy file (--policy): roles and bindings, e.g.

  roles:
    - name: coder
      services: ["inference://*", "mcp://everything/echo", "mcp://calc"]
  bindings:
    - principal: agent-a
      roles: [coder]

The mesh beyond this machine: with --router (after "sam-node join"), the
node joins the mesh's routers as the member enrolled in --mesh-dir,
publishes the models and MCP servers it serves, and uses those that other
members serve, by name, over authenticated libp2p streams: /v1/models and
tools/list show what the principal may use anywhere in the mesh. Give every
router (--router repeated): the node joins, publishes to and holds a relay
slot on each, and a call goes through any that is up; a router that
restarts is joined again as soon as it answers, and the node's names
published there again. The policy
is decided here on the agent's principal and again on the member that
serves the call; without --policy it is the mesh's one policy, from the
control plane. Calls from other members are served with this node's own
providers and servers only. The agent listener stays for boundaries only.
What the node and the boundaries of its machine (sandstormd, sam-box,
which report on the agent listener) refuse its agents is counted by
principal, target and reason and sent to the control plane every 5 s,
for sam-one's console.

SIGTERM or SIGINT stops accepting, lets requests in flight finish (up to
--shutdown-timeout), stops the stdio MCP servers and exits 0.`

func rootCmd() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "sam-node",
		Short: "The mesh node next to the agents: models and MCP tools, per principal",
		Long:  longHelp,
		Example: `  sam-node --config /etc/sam/node.yaml --policy /etc/sam/policy.yaml \
    --listen unix:///run/sam-node.sock --admin-addr 127.0.0.1:9601

  # what an agent's boundary sends:
  curl --unix-socket /run/sam-node.sock -H 'X-Sam-Principal: agent-a' http://mesh.sam.alt/v1/models`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), o, cmd.ErrOrStderr()) // ends at SIGINT or SIGTERM (cli.ExitOnSignal)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.config, "config", "", "node config file (YAML or JSON): providers and mcp_servers; none serves nothing")
	f.StringVar(&o.policy, "policy", "", "policy file (YAML or JSON): roles and bindings; reloaded on change; none grants nothing")
	f.StringVar(&o.listen, "listen", "unix:///run/sam-node.sock", "agent listener, for boundaries only: unix:///path or tcp://127.0.0.1:port")
	f.StringVar(&o.socketMode, "socket-mode", "0660", "file mode of a unix --listen socket (octal)")
	f.StringVar(&o.adminAddr, "admin-addr", "127.0.0.1:9601", "admin listener host:port for /healthz, /readyz, /metrics (\"\" disables); keep it where sandboxes cannot reach")
	f.DurationVar(&o.policyInterval, "policy-interval", 2*time.Second, "how often the policy file is checked for changes")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long requests in flight may take to finish")
	f.Int64Var(&o.maxBodyBytes, "max-body-bytes", meshnode.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	f.StringVar(&o.mesh.dir, "mesh-dir", defaultMeshDir, "the node's mesh identity, made by \"sam-node join\"; used with --router")
	f.StringArrayVar(&o.mesh.routers, "router", nil, "a router to join, as sam-router prints it: /ip4/…/tcp/…/p2p/<peer ID> (repeat it for every router of the mesh); none: this machine alone")
	f.StringArrayVar(&o.mesh.listen, "p2p-listen", []string{"/ip4/0.0.0.0/tcp/7701"}, "libp2p address other members call this node on (repeatable); a member that serves anything must listen")
	o.log.Register(f)
	cmd.AddCommand(membership.JoinCommand("sam-node", defaultMeshDir))
	return cmd
}

func newLogger(o options, w io.Writer) (*slog.Logger, error) {
	return o.log.New(w)
}

func run(ctx context.Context, o options, stderr io.Writer) error {
	log, err := newLogger(o, stderr)
	if err != nil {
		return err
	}
	mode, err := strconv.ParseUint(o.socketMode, 8, 32)
	if err != nil || mode > 0o777 {
		return fmt.Errorf("--socket-mode %q: want an octal file mode such as 0660", o.socketMode)
	}
	cfg, err := nodeConfig(o, log)
	if err != nil {
		return err
	}

	var member *membership.Member
	var routers []peer.AddrInfo
	mesh := &meshpeer.Deferred{}
	if o.mesh.on() {
		if member, routers, err = openMember(ctx, o.mesh, log); err != nil {
			return err
		}
		cfg.Mesh, cfg.Member = mesh, member.Name()
		if o.policy == "" {
			cfg.Policy = member.Policy() // the mesh's one policy, from the control plane
		}
	}

	node, err := meshnode.New(cfg)
	if err != nil {
		return err
	}
	defer node.Close()
	if o.mesh.on() {
		if err := serveMeshStatus(node, member, routers, mesh); err != nil {
			return err
		}
	}
	meshDone := make(chan struct{})
	mctx, leave := context.WithCancel(ctx)
	defer leave()
	if o.mesh.on() {
		go func() {
			defer close(meshDone)
			joinMesh(mctx, member, routers, o.mesh.listen, node, mesh, log)
		}()
		go reportRefusals(mctx, member, node, log)
	} else {
		close(meshDone)
	}

	servers, listeners, err := listen(o, node, os.FileMode(mode), log)
	if err != nil {
		return err
	}
	ln := listeners[0]
	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() {
			if err := s.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	attrs := []any{"listen", ln.Addr().Network() + "://" + ln.Addr().String(), "policy", o.policy, "config", o.config}
	if o.adminAddr != "" {
		attrs = append(attrs, "admin", listeners[1].Addr().String())
	}
	log.Info("sam-node: serving", attrs...)

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("sam-node: stopping")
	case serveErr = <-errc:
		log.Error("sam-node: a listener failed; stopping", "err", serveErr)
	}
	shutdown(servers, node, o.shutdownTimeout, log)
	leave()
	<-meshDone // the peer leaves the mesh
	node.Close()
	log.Info("sam-node: stopped")
	return serveErr
}

// nodeConfig is the node's configuration from --config and the flags.
func nodeConfig(o options, log *slog.Logger) (meshnode.Config, error) {
	var cfg meshnode.Config
	if o.config != "" {
		var err error
		if cfg, err = meshnode.LoadConfig(o.config); err != nil {
			return cfg, err
		}
	} else {
		log.Warn("sam-node: no --config: no providers and no MCP servers")
	}
	cfg.PolicyFile = o.policy
	cfg.PolicyInterval = o.policyInterval
	cfg.Logger = log
	cfg.MaxBodyBytes = o.maxBodyBytes
	return cfg, nil
}

// listen opens the agent listener and, with --admin-addr, the admin one,
// and the servers for them, in that order.
func listen(o options, node *meshnode.Node, mode os.FileMode, log *slog.Logger) ([]*http.Server, []net.Listener, error) {
	ln, err := listenAgent(o.listen, mode)
	if err != nil {
		return nil, nil, err
	}
	server := func(h http.Handler) *http.Server {
		return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	}
	servers, listeners := []*http.Server{server(node.Handler())}, []net.Listener{ln}
	if o.adminAddr != "" {
		aln, err := net.Listen("tcp", o.adminAddr)
		if err != nil {
			ln.Close()
			return nil, nil, fmt.Errorf("--admin-addr: %w", err)
		}
		if ap, ok := aln.Addr().(*net.TCPAddr); ok && !ap.IP.IsLoopback() {
			log.Warn("sam-node: the admin listener is not on loopback; make sure no sandbox can reach it", "addr", aln.Addr().String())
		}
		servers, listeners = append(servers, server(node.AdminHandler())), append(listeners, aln)
	}
	return servers, listeners, nil
}

// shutdown stops accepting, lets requests in flight finish (up to
// timeout) and closes the servers.
func shutdown(servers []*http.Server, node *meshnode.Node, timeout time.Duration, log *slog.Logger) {
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan error, len(servers))
	for _, s := range servers {
		go func() { done <- s.Shutdown(sctx) }()
	}
	node.Drain()
	for range servers {
		if err := <-done; err != nil {
			log.Warn("sam-node: requests still in flight were cut off", "err", err)
		}
	}
	for _, s := range servers {
		s.Close()
	}
}

// listenAgent opens the agent listener: unix:///path (a stale socket left
// by a dead sam-node is replaced; a live one is an error) or
// tcp://host:port.
func listenAgent(spec string, mode os.FileMode) (net.Listener, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", spec, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if u.Host != "" || path == "" {
			return nil, fmt.Errorf("--listen %q: want unix:///absolute/path", spec)
		}
		if fi, err := os.Lstat(path); err == nil {
			if fi.Mode().Type() != os.ModeSocket {
				return nil, fmt.Errorf("--listen %q: %s exists and is not a socket", spec, path)
			}
			if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
				c.Close()
				return nil, fmt.Errorf("--listen %q: another process is serving on %s", spec, path)
			}
			if err := os.Remove(path); err != nil {
				return nil, fmt.Errorf("--listen %q: removing the stale socket: %w", spec, err)
			}
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("--listen: %w", err)
		}
		if err := os.Chmod(path, mode); err != nil {
			ln.Close()
			return nil, fmt.Errorf("--listen: %w", err)
		}
		return ln, nil
	case "tcp":
		if u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("--listen %q: want tcp://host:port", spec)
		}
		ln, err := net.Listen("tcp", u.Host)
		if err != nil {
			return nil, fmt.Errorf("--listen: %w", err)
		}
		return ln, nil
	}
	return nil, fmt.Errorf("--listen %q: want unix:///path or tcp://host:port", spec)
}
