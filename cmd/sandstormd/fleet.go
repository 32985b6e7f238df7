package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"sandstorm/internal/cli"
	"sandstorm/internal/fleetup"
)

func fleetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Bring a fleet up (nodes in network namespaces here, or on machines over ssh) and down again",
		Long: `fleet up starts a master on this machine and its nodes — in network
namespaces here (--nodes) or on other machines over ssh (--hosts) — pairs
them, seeds a demo template and checks a sandbox answers on every node;
fleet down takes down exactly what it made (<root>/fleet.json). See
'sandstormd fleet up --help' and 'sandstormd fleet down --help'.`,
	}
	cmd.AddCommand(fleetUpCmd(), fleetDownCmd())
	return cmd
}

func fleetUpCmd() *cobra.Command {
	var cfg fleetup.Config
	up := &cobra.Command{
		Use: "up", Short: "Start a master and its nodes (--nodes here, or --hosts over ssh), pair, seed and verify", Args: cobra.NoArgs,
		Long: fleetUpHelp,
		Example: `  sudo sandstormd fleet up --nodes 3
  SANDSTORM_API=https://127.0.0.1:8079 SANDSTORM_DATA_DIR=/var/lib/sandstorm-fleet/master sandstormd sandbox ls
  sudo sandstormd fleet down

  sudo sandstormd fleet up --hosts root@10.0.0.5,root@10.0.0.6 --mesh-policy policy.yaml --mesh-config sam-node.yaml
  sudo sandstormd fleet up --hosts admin@web1,admin@web2:2222 --sudo --ssh-identity ~/.ssh/fleet \
      --ssh-option StrictHostKeyChecking=accept-new --ssh-option ProxyJump=bastion
  sudo sandstormd fleet down --purge`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			usage := func(format string, a ...any) error {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: fmt.Errorf(format, a...)}
			}
			if len(cfg.Hosts) > 0 && f.Changed("nodes") {
				return usage("--nodes (namespaces on this machine) and --hosts (machines over ssh) exclude each other")
			}
			if len(cfg.Hosts) == 0 {
				for _, name := range []string{"ssh-option", "ssh-identity", "sudo", "remote-dir", "node-port", "node-subnet", "runsc", "remote-runsc", "mesh-address"} {
					if f.Changed(name) {
						return usage("--%s is for --hosts (machines over ssh)", name)
					}
				}
			}
			if f.Changed("hosts") && len(cfg.Hosts) == 0 {
				return usage("--hosts: name at least one host")
			}
			if err := cfg.Validate(); err != nil {
				return cli.UsageError{Cmd: cmd.CommandPath(), Err: err}
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Bin, cfg.Out = exe, os.Stdout
			_, err = fleetup.Up(cmd.Context(), cfg)
			return err
		},
	}
	uf := up.Flags()
	uf.IntVar(&cfg.Nodes, "nodes", 3, "how many nodes on this machine, each in a network namespace (1 to 9)")
	uf.StringVar(&cfg.Root, "root", "/var/lib/sandstorm-fleet", "where the fleet's master data dir, logs and fleet.json go (and the nodes' here, with --nodes)")
	uf.StringVar(&cfg.Listen, "listen", "127.0.0.1:8079", "the master's API address")
	uf.StringVar(&cfg.Template, "template", "web", "demo template to seed and verify with (web or app64; empty: none)")
	uf.StringArrayVar(&cfg.MasterArgs, "master-arg", nil, "a flag for the master's serve (repeatable), e.g. --master-arg=--metrics-addr=127.0.0.1:9700")
	uf.StringArrayVar(&cfg.NodeArgs, "node-arg", nil, "a flag for every node's serve (repeatable), e.g. --node-arg=--freeze-after=2s; {addr} in it is that node's own address (--node-arg=--ingress-public={addr})")
	uf.StringSliceVar(&cfg.Hosts, "hosts", nil, "machines to run one node each on, over ssh: [user@]host[:port],… ([IPv6]:port); each node is named after its host (10.0.0.5 → 10-0-0-5, web1.example.com → web1)")
	uf.StringArrayVar(&cfg.SSH.Options, "ssh-option", nil, "with --hosts: an ssh option for ssh and scp, as for -o (repeatable), e.g. --ssh-option StrictHostKeyChecking=accept-new")
	uf.StringVar(&cfg.SSH.Identity, "ssh-identity", "", "with --hosts: private key file for ssh and scp (-i)")
	uf.BoolVar(&cfg.SSH.Sudo, "sudo", false, "with --hosts: where the login user is not root, run the node and its steps with sudo -n (passwordless sudo)")
	uf.StringVar(&cfg.RemoteDir, "remote-dir", "/var/lib/sandstorm-fleet", "with --hosts: on each host, where the binaries go (bin/) and each node's data dir, log and PID file (<node>, <node>.log, <node>.pid)")
	uf.IntVar(&cfg.NodePort, "node-port", 7443, "with --hosts: the port each node listens on for the master")
	uf.StringVar(&cfg.NodeSubnet, "node-subnet", "10.161.0.0/16", "with --hosts: the first node's sandbox subnet; each next node gets the next block of that size (10.162.0.0/16, …)")
	uf.StringVar(&cfg.Runsc, "runsc", "", "with --hosts: the runsc to copy to the hosts (default: the pinned one next to this sandstormd, from make runsc)")
	uf.IntVar(&cfg.Routers, "routers", 1, "how many routers start beside the control plane (ports 7700, 7710, …); every sam-node joins each, so the mesh goes on when one is gone")
	uf.BoolVar(&cfg.NoMesh, "no-mesh", false, "no mesh (by default a control plane and a router start beside the master and a sam-node on every node, enrolled; the nodes' boundaries take the mesh's policy from it)")
	uf.StringVar(&cfg.MeshPolicy, "mesh-policy", "", "a policy file (roles, bindings) set on the mesh's control plane at once; without it nothing is granted until: sam-control-plane policy set FILE")
	uf.StringVar(&cfg.MeshConfig, "mesh-config", "", "a sam-node config file (providers, mcp_servers) every node's sam-node serves; with --hosts it is copied to each host, and the paths in it (an MCP server's command, api_key_file) are the host's")
	uf.StringVar(&cfg.MeshAddress, "mesh-address", "", "with --hosts: the address of this machine the hosts reach the mesh's control plane and router at (default: the one each host's SSH_CONNECTION names, which a NAT or a jump host hides)")
	uf.StringVar(&cfg.RemoteRunsc, "remote-runsc", "", "with --hosts: a runsc already on every host, given to its node as --runsc; nothing is copied")
	return up
}

func fleetDownCmd() *cobra.Command {
	var root string
	var purge bool
	var ssh fleetup.SSH
	down := &cobra.Command{
		Use: "down", Short: "Delete the fleet's sandboxes and stop and remove everything fleet up made", Args: cobra.NoArgs,
		Long: fleetDownHelp,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fleetup.DownWith(root, purge, ssh, os.Stdout)
		},
	}
	df := down.Flags()
	df.StringVar(&root, "root", "/var/lib/sandstorm-fleet", "the fleet's root (as given to fleet up)")
	df.BoolVar(&purge, "purge", false, "also remove the data dirs and logs (on the hosts too)")
	df.StringArrayVar(&ssh.Options, "ssh-option", nil, "ssh options for the hosts (repeatable), instead of those fleet up was given")
	df.StringVar(&ssh.Identity, "ssh-identity", "", "private key for the hosts, instead of the one fleet up was given")
	return down
}

const fleetUpHelp = `fleet up starts a master on this machine and its nodes, pairs every node
with the master, seeds a demo template and checks that a sandbox answers on
every node. What it made is recorded in <root>/fleet.json; fleet down reads
it, deletes the fleet's sandboxes and stops exactly what fleet up started,
by PID.

--nodes N (the default, 3): N nodes on this machine, each in a network
namespace of its own (its own address 10.186.<k>.2, nftables table, routes
and ports, joined to this namespace by a veth). The fleet is also one mesh:
a control plane (https://10.186.1.1:7600) and a router (--routers N: N of
them, on ports 7700, 7710, …) start beside the master, and a sam-node on
every node, enrolled with a token fleet up makes and spends, joined to every
router; each node's boundaries reach the mesh through its sam-node and
take the mesh's one policy from it (--mesh-policy, or later
sam-control-plane policy set). --no-mesh leaves all that out.

--hosts user@h1,user@h2,…: one node on each of those machines, over the
system's ssh and scp (your ssh config, agent and known_hosts apply; never a
prompt: BatchMode). Every host is checked first (ssh, root, architecture),
so one that fails costs nothing to undo. Then, for each host, it copies
this sandstormd, and the pinned runsc, to --remote-dir/bin unless the same
bytes are there (sha256), starts 'sandstormd serve --node' there detached
(data dir, log and PID file in --remote-dir, named after the node; the
node named after the host: 10.0.0.5 → 10-0-0-5, web1.example.com → web1),
listening on the address the host's sshd answered on, port --node-port,
with sandboxes in its block of --node-subnet; reads the node's pairing
code over ssh (never shown) and pairs it from the master here, which sends
it the template's rootfs. The node runs as root: log in as root, or pass
--sudo for passwordless sudo. The master must reach each host on
--node-port and its gateway ports (20000-29999 unless --node-arg says
otherwise). A failure later on takes down what was started. fleet down
stops each node by its PID over ssh and keeps its files, so that a fleet
up again finds the nodes paired; with --purge it removes them.

Over --hosts the fleet is one mesh too. The control plane and the router
run here, listening on the address each host sees this machine at (the
first field of its SSH_CONNECTION; hosts on different networks each get
their own, and the control plane's certificate names every one), on TCP
7600 and 7700: the hosts must reach this machine there. Behind a NAT or a
jump host that address is not this machine's: give the one the hosts reach
with --mesh-address. Each host gets sam-node beside sandstormd (the same
sha256-checked copy), enrolled with a bootstrap token fleet up makes for
exactly the sam-nodes it enrols, good for two minutes, and fed to sam-node
join on its stdin (never on a command line); it runs detached with a PID
file (<node>-sam-node.pid; its identity in <node>-mesh, log
<node>-sam-node.log), a member at the host's address on TCP 7701, and the
node's boundaries take the mesh's policy from it. --mesh-config is copied
to each host (<node>-sam-node.yaml, mode 0600): an MCP server's command
and an api_key_file in it are paths on the hosts, not here. fleet down
stops each sam-node by its PID over ssh, and --purge removes its files.`

const fleetDownHelp = `fleet down reads <root>/fleet.json, deletes the fleet's sandboxes through its
master, stops the master, the mesh's control plane and router, and every
node and its sam-node by the PID fleet up recorded (on a host over ssh, the
way fleet up reached it), and removes the namespaces and links of nodes on
this machine. Data dirs stay unless --purge; on a host, --purge removes the
node's data dir and log, its sam-node's mesh dir, log and config, and the
binaries fleet up copied once no other node there has a PID file. If a host
cannot be reached, fleet.json is kept so that fleet down can be run again.`
