// Package fleetup brings a whole fleet up and down again (the seed's
// scripts/fleet.sh up|seed|verify, as sandstormd fleet up and fleet down):
// a master on this machine, and N nodes each in a network namespace of
// its own here — its own address, nftables table, routes and ports —
// joined to the master's namespace by a veth, or one node on each of
// several machines reached over ssh (hosts.go, ssh.go, remote.go); paired,
// seeded with a template and checked by one sandbox each. What it made is
// written to <root>/fleet.json, which fleet down reads to take exactly
// that down again, by PID and by name.
package fleetup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/pki"
)

// Config is what fleet up makes.
type Config struct {
	Nodes  int    // how many nodes (1–9)
	Root   string // where every data dir, log and fleet.json go
	Listen string // the master's API address
	Bin    string // the sandstormd binary
	// Template is the demo template seeded (web or app64); "" seeds none.
	Template string
	// NodeArgs are added to every node's serve flags, "{addr}" in each
	// replaced by that node's address (nodeArgs).
	NodeArgs []string
	// MasterArgs are added to the master's serve flags (its
	// --metrics-addr, say).
	MasterArgs []string
	Out        io.Writer // progress

	// Hosts, when set, are the machines to run one node each on, over
	// ssh ([user@]host[:port]), instead of Nodes namespaces here.
	Hosts []string
	SSH   SSH
	// RemoteDir is where on each host the binaries go (bin/) and each
	// node's data dir, log and PID file.
	RemoteDir string
	NodePort  int // each remote node's --node-listen port
	// NodeSubnet is the first remote node's sandbox subnet; the next get
	// the blocks of its size that follow (NodeSubnets).
	NodeSubnet string
	// Runsc is the runsc copied to the hosts ("": the one next to Bin);
	// RemoteRunsc, if set, one already on every host, and none is copied.
	Runsc, RemoteRunsc string

	// NoMesh: no control plane, router or sam-nodes (mesh.go); the nodes'
	// boundaries then grant nothing unless NodeArgs give them a policy.
	NoMesh bool
	// MeshPolicy is a policy file set on the control plane at once;
	// MeshConfig a sam-node config (providers, MCP servers) every node's
	// sam-node serves (over --hosts, copied to each host: the paths in it
	// are the host's).
	MeshPolicy, MeshConfig string
	// Routers is how many routers start beside the control plane (each a
	// process of its own on a port of its own, 7700, 7710, …; every
	// member joins each); 0 is 1.
	Routers int
	// MeshAddress, with Hosts, is the address of this machine every host
	// reaches the control plane and the router at; "": the one each host
	// sees this machine at (MeshAddresses).
	MeshAddress string
}

// State is what fleet up made (<root>/fleet.json).
type State struct {
	API    string      `json:"api"`
	Master Proc        `json:"master"`
	Nodes  []NodeState `json:"nodes"`
	// SSH is set for a fleet over ssh: how to reach its hosts again.
	SSH *SSHState `json:"ssh,omitempty"`
	// Mesh is the control plane, router and sam-nodes (mesh.go).
	Mesh *MeshState `json:"mesh,omitempty"`
}

// Proc is a process fleet up started.
type Proc struct {
	PID     int    `json:"pid"`
	DataDir string `json:"data_dir"`
	Log     string `json:"log"`
}

// NodeState is one node of the fleet: in a netns here (Netns, HostIf), or
// on a host over ssh (Host; its Proc's PID, paths and PIDFile are the
// host's).
type NodeState struct {
	Proc
	Name    string `json:"name"`
	Netns   string `json:"netns,omitempty"`
	HostIf  string `json:"host_if,omitempty"`
	Address string `json:"address"`        // its --node-listen
	Host    string `json:"host,omitempty"` // [user@]host[:port], as --hosts named it
	PIDFile string `json:"pid_file,omitempty"`
	Sudo    bool   `json:"sudo,omitempty"` // its host's root steps go through sudo -n
}

// Addresses: node k's link is 10.186.k.0/24 (the master's side .1, the
// node's .2); its sandboxes' pool is 10.(160+k).0.0/16.
func linkNet(k int) (host, node string) {
	return fmt.Sprintf("10.186.%d.1", k), fmt.Sprintf("10.186.%d.2", k)
}

const stateFile = "fleet.json"

// Up brings the fleet up. On failure it takes down what it made.
func Up(ctx context.Context, cfg Config) (st State, err error) {
	if err := cfg.Validate(); err != nil {
		return st, err
	}
	if _, err := os.Stat(filepath.Join(cfg.Root, stateFile)); err == nil {
		return st, fmt.Errorf("a fleet is already up under %s (see its %s); take it down first: sandstormd fleet down --root %s", cfg.Root, stateFile, cfg.Root)
	}
	if len(cfg.Hosts) == 0 {
		if err := checkFree(cfg.Nodes); err != nil {
			return st, err
		}
	}
	// Progress comes from the hosts' goroutines too: a line at a time.
	var outMu sync.Mutex
	say := func(f string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(cfg.Out, f+"\n", a...)
	}
	if !cfg.NoMesh {
		if _, err := meshBinaries(cfg.Bin); err != nil {
			return st, err
		}
	}
	// Every host is asked before anything is started: a host ssh cannot
	// reach costs nothing to take down.
	var plan *hostPlan
	if len(cfg.Hosts) > 0 {
		if plan, err = planHosts(ctx, cfg, say); err != nil {
			return st, err
		}
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return st, err
	}
	defer func() {
		if err != nil {
			// The error itself is the caller's to show (the CLI prints
			// it last): a node's log in it runs over several lines.
			say("fleet up failed; taking down what it made")
			// What a host could not stop is worth saying; the rest of
			// the teardown is quiet, as for a fleet here.
			var w io.Writer = io.Discard
			if plan != nil {
				w = cfg.Out
			}
			if derr := down(st, false, w); derr != nil {
				say("%v", derr)
			}
			os.Remove(filepath.Join(cfg.Root, stateFile))
		}
	}()
	st.API = "https://" + cfg.Listen
	master := Proc{DataDir: filepath.Join(cfg.Root, "master"), Log: filepath.Join(cfg.Root, "master.log")}
	if master.PID, err = spawn(cfg.Bin, master.Log, nil, append([]string{"serve", "--master", "--data-dir", master.DataDir, "--listen", cfg.Listen}, cfg.MasterArgs...)...); err != nil {
		return st, err
	}
	st.Master = master
	save(cfg.Root, st)
	say("master: PID %d, API %s, log %s", master.PID, st.API, master.Log)
	if plan != nil {
		// The mesh first, here: each host's sam-node enrols with the
		// control plane and dials the router as it starts, and its node
		// after it.
		var cp *meshCP
		if !cfg.NoMesh {
			if cp, err = startControlPlane(ctx, cfg, &st, plan.meshListen, say); err != nil {
				return st, err
			}
			if err := startRouters(ctx, cfg, &st, cp, plan.meshListen, say); err != nil {
				return st, err
			}
		}
		if err := startHosts(ctx, cfg, plan, &st, cp, say); err != nil {
			return st, err
		}
	}
	if plan == nil {
		if err := startHere(ctx, cfg, &st, say); err != nil {
			return st, err
		}
	}
	c, err := waitMaster(ctx, st.API, master.DataDir)
	if err != nil {
		return st, err
	}
	for _, n := range st.Nodes {
		if err := pair(ctx, c, st, n, say); err != nil {
			return st, err
		}
	}
	if cfg.Template != "" {
		if err := seed(ctx, cfg, st, c); err != nil {
			return st, err
		}
	}
	sayUp(cfg, st, say)
	return st, nil
}

// sayUp says how to use the fleet, as commands that can be pasted: this
// very binary (it is seldom on PATH), and where this master's CA and
// token are, which are not the default data dir's.
func sayUp(cfg Config, st State, say func(string, ...any)) {
	dir := st.Master.DataDir
	say("fleet is up: %d node(s). Stop it with: %s fleet down --root %s", len(st.Nodes), cfg.Bin, cfg.Root)
	say("use it: SANDSTORM_API=%s SANDSTORM_DATA_DIR=%s %s sandbox ls   (or: node ls)", st.API, dir, cfg.Bin)
	say("its CA is %s and its API token %s (console: %s/)", filepath.Join(dir, "pki", "ca.pem"), filepath.Join(dir, "pki", "api-token"), st.API)
	if st.Mesh != nil {
		say("the mesh's policy: %s --data-dir %s --api %s policy set FILE", filepath.Join(filepath.Dir(cfg.Bin), "sam-control-plane"), st.Mesh.ControlPlane.DataDir, st.Mesh.API)
	}
}

// startHere starts cfg.Nodes nodes on this machine, each in a network
// namespace, and the mesh over them; st records each as it starts.
func startHere(ctx context.Context, cfg Config, st *State, say func(string, ...any)) error {
	for k := 1; k <= cfg.Nodes; k++ {
		n, err := startNode(cfg, k)
		if n.Netns != "" {
			st.Nodes = append(st.Nodes, n)
			save(cfg.Root, *st)
		}
		if err != nil {
			return err
		}
		say("node %s: PID %d in netns %s, listening on %s", n.Name, n.PID, n.Netns, n.Address)
	}
	if cfg.NoMesh {
		return nil
	}
	return startMesh(ctx, cfg, st, say)
}

// pair pairs node n with the master (c), unless the master kept it from
// an earlier fleet up.
func pair(ctx context.Context, c *client.Client, st State, n NodeState, say func(string, ...any)) error {
	var code string
	var err error
	if n.Host != "" {
		code, err = pairingCode(ctx, *st.SSH, n)
	} else {
		code, err = waitNode(ctx, n)
	}
	if err != nil {
		return err
	}
	if ok, err := kept(ctx, c, n); err != nil {
		return err
	} else if ok {
		say("node %s: paired already (this root's master kept it from an earlier fleet up), ready", n.Name)
		return nil
	}
	var ns api.NodeStatus
	if err := c.Do(ctx, "POST", "/v1/nodes", api.NodeRequest{Address: n.Address, PairingCode: code}, &ns); err != nil {
		if n.Host != "" && client.StatusOf(err) == http.StatusConflict {
			// Paired already: a data dir an earlier fleet left there
			// (fleet down without --purge, and this master is new).
			return fmt.Errorf("pair %s: %w\n(its data dir %s on %s is an earlier fleet's: take that fleet down with --purge, remove the dir there, or use another --remote-dir)", n.Name, err, n.DataDir, n.Host)
		}
		return fmt.Errorf("pair %s: %w", n.Name, err)
	}
	say("paired %s: %d MiB available", n.Name, ns.MemAvailableMiB)
	return nil
}

// kept reports whether the master has node n paired already — a root
// brought up again after a fleet down without --purge keeps the master's
// store and the node its certificate, and the node is back with its
// master by itself — once the master has it ready.
func kept(ctx context.Context, c *client.Client, n NodeState) (bool, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		var l api.List[api.NodeStatus]
		if err := c.Do(ctx, "GET", "/v1/nodes", nil, &l); err != nil {
			return false, err
		}
		var known *api.NodeStatus
		for i := range l.Items {
			if l.Items[i].Address == n.Address {
				known = &l.Items[i]
			}
		}
		if known == nil {
			return false, nil
		}
		if known.State == "ready" {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("node %s at %s is this master's already (from an earlier fleet up of this root), but it is %s after a minute: %s", known.Name, n.Address, known.State, known.Error)
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nodeNetns and nodeHostIf are node k's network namespace and the host
// end of its veth.
func nodeNetns(k int) string  { return fmt.Sprintf("sf-%d", k) }
func nodeHostIf(k int) string { return fmt.Sprintf("sfh%d", k) }

// checkFree refuses a fleet whose nodes' namespaces or links are there
// already: another fleet's, under another root. Making them would fail
// half-way, and taking down what was made must never touch them.
func checkFree(nodes int) error {
	for k := 1; k <= nodes; k++ {
		_, nsErr := os.Stat(filepath.Join("/run/netns", nodeNetns(k)))
		_, ifErr := net.InterfaceByName(nodeHostIf(k))
		if nsErr == nil || ifErr == nil {
			return fmt.Errorf("network namespace %s or link %s is there already: another fleet is up on this machine (under another --root: take it down with sandstormd fleet down --root DIR), or one was left behind (ip netns del %s; ip link del %s)",
				nodeNetns(k), nodeHostIf(k), nodeNetns(k), nodeHostIf(k))
		}
	}
	return nil
}

func startNode(cfg Config, k int) (NodeState, error) {
	host, addr := linkNet(k)
	n := NodeState{Name: fmt.Sprintf("node-%d", k), Address: addr + ":7443",
		Proc: Proc{DataDir: filepath.Join(cfg.Root, fmt.Sprintf("node-%d", k)), Log: filepath.Join(cfg.Root, fmt.Sprintf("node-%d.log", k))}}
	netns, hostIf := nodeNetns(k), nodeHostIf(k)
	for i, c := range [][]string{
		{"netns", "add", netns},
		{"link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", netns},
		{"addr", "add", host + "/24", "dev", hostIf},
		{"link", "set", hostIf, "up"},
		{"-n", netns, "addr", "add", addr + "/24", "dev", "eth0"},
		{"-n", netns, "link", "set", "eth0", "up"},
		{"-n", netns, "link", "set", "lo", "up"},
		{"-n", netns, "route", "add", "default", "via", host},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			return n, fmt.Errorf("ip %s: %v: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
		// Recorded once made, so that a teardown after a failure
		// removes only what this fleet up made (a namespace of the
		// same name another fleet has is not ours to delete).
		switch i {
		case 0:
			n.Netns = netns
		case 1:
			n.HostIf = hostIf
		}
	}
	args := append([]string{"--net=/var/run/netns/" + n.Netns, cfg.Bin, "serve", "--node", "--node-name", n.Name,
		"--node-listen", n.Address, "--data-dir", n.DataDir, "--subnet", fmt.Sprintf("10.%d.0.0/16", 160+k),
		"--gateway-listen", addr}, nodeArgs(cfg.NodeArgs, addr)...)
	if !cfg.NoMesh {
		// Its boundaries reach the mesh through its sam-node, and take
		// the mesh's policy from it (mesh.go), which starts after it.
		args = append(args, meshNodeArgs(cfg, k)...)
		if err := os.MkdirAll(filepath.Dir(meshSocket(cfg, k)), 0o700); err != nil {
			return n, err
		}
	}
	// nsenter enters the namespace's network only: `ip netns exec` would
	// also mount a sysfs of its own over /sys, hiding the cgroups runsc
	// needs.
	pid, err := spawn("nsenter", n.Log, nil, args...)
	n.PID = pid
	return n, err
}

// spawn starts name in a session of its own, its output to logPath, and
// returns its PID; it outlives this process.
func spawn(name, logPath string, env []string, args ...string) (int, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	// The command line first: how to start this process again by hand
	// (a node stopped alone, docs/OPERATING.md). No secret is an argument
	// here: tokens go by file or by a join run apart.
	fmt.Fprintf(logf, "=== fleet up %s: %s\n", time.Now().UTC().Format(time.RFC3339), commandLine(name, args))
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	go cmd.Wait()
	return cmd.Process.Pid, nil
}

// commandLine is name and args as a shell would take them back.
func commandLine(name string, args []string) string {
	out := make([]string, 0, 1+len(args))
	for _, a := range append([]string{name}, args...) {
		if a == "" || strings.ContainsFunc(a, func(r rune) bool {
			return !(r == '/' || r == '-' || r == '.' || r == ':' || r == '=' || r == '_' || r == ',' || r == '@' || r == '+' || unicode.IsLetter(r) || unicode.IsDigit(r))
		}) {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

func save(root string, st State) {
	b, _ := json.MarshalIndent(st, "", "  ")
	os.WriteFile(filepath.Join(root, stateFile), b, 0o600)
}

func waitMaster(ctx context.Context, api, dataDir string) (*client.Client, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := client.ForDataDir(api, dataDir)
		if err == nil {
			if err = c.Do(ctx, "GET", "/v1/nodes", nil, nil); err == nil {
				return c, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the master did not answer at %s within a minute (%v); see its log", api, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitNode(ctx context.Context, n NodeState) (string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(filepath.Join(n.DataDir, "pki", pki.PairingCodeFile))
		if err == nil {
			if c, derr := net.DialTimeout("tcp", n.Address, time.Second); derr == nil {
				c.Close()
				return strings.TrimSpace(string(b)), nil
			} else {
				err = derr
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("node %s did not listen on %s within a minute (%v); see %s", n.Name, n.Address, err, n.Log)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// seed registers the demo template (built on this machine, which every
// node shares the filesystem of) and checks that a sandbox answers on
// every node: it creates sandboxes until each node has one, at most twice
// as many as nodes (placement decides where each goes).
func seed(ctx context.Context, cfg Config, st State, c *client.Client) error {
	out, err := exec.CommandContext(ctx, cfg.Bin, "--data-dir", st.Master.DataDir, "template", "demo", cfg.Template, "--api", st.API).CombinedOutput()
	if err != nil {
		return fmt.Errorf("template demo %s: %v: %s", cfg.Template, err, out)
	}
	fmt.Fprintf(cfg.Out, "seeded template %s\n", cfg.Template)
	on := map[string]bool{}
	for i := 0; len(on) < len(st.Nodes) && i < 2*len(st.Nodes); i++ {
		sb, err := c.CreateSandbox(ctx, api.SandboxRequest{Template: cfg.Template, Name: "verify-" + strconv.Itoa(i)})
		if err != nil {
			return fmt.Errorf("verify: create: %w", err)
		}
		if err := answers(ctx, sb.Endpoints); err != nil {
			return fmt.Errorf("verify: sandbox %s on %s: %w", sb.Name, sb.Node, err)
		}
		fmt.Fprintf(cfg.Out, "verified: %s on %s answers at %s\n", sb.Name, sb.Node, first(sb.Endpoints))
		on[sb.Node] = true
	}
	if len(on) < len(st.Nodes) {
		return fmt.Errorf("verify: sandboxes went to %d of %d nodes (placement follows headroom; one node may be much roomier)", len(on), len(st.Nodes))
	}
	return nil
}

func first(m map[string]string) string {
	for _, v := range m {
		return v
	}
	return ""
}

// answers polls a sandbox's first endpoint until it answers 200.
func answers(ctx context.Context, eps map[string]string) error {
	ep := first(eps)
	if ep == "" {
		return errors.New("no endpoint")
	}
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		out, err := exec.CommandContext(ctx, "curl", "-sS", "--noproxy", "*", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", ep+"/").Output()
		if err == nil && string(out) == "200" {
			return nil
		}
		last = fmt.Errorf("%v %s", err, out)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("did not answer 200 within 30 s (%v)", last)
}

// Down takes down the fleet under root: its sandboxes (through the master,
// while it still runs), then its processes by PID, its namespaces and
// links, and its nodes and their sam-nodes on other hosts by PID over
// ssh. Data dirs stay unless purge.
func Down(root string, purge bool, out io.Writer) error {
	return DownWith(root, purge, SSH{}, out)
}

// DownWith is Down reaching a fleet's hosts with ssh's options and
// identity replaced by those given (for a key or a jump host that is
// another now); fleet up's are used otherwise.
func DownWith(root string, purge bool, ssh SSH, out io.Writer) error {
	b, err := os.ReadFile(filepath.Join(root, stateFile))
	if err != nil {
		return fmt.Errorf("no fleet under %s (%v)", root, err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(root, stateFile), err)
	}
	if st.SSH != nil {
		if len(ssh.Options) > 0 {
			st.SSH.Options = ssh.Options
		}
		if ssh.Identity != "" {
			st.SSH.Identity = ssh.Identity
		}
	}
	left := deleteSandboxes(st, out)
	if err := down(st, purge, out); err != nil {
		// fleet.json stays: it is how a second fleet down finds what is
		// still up once the host answers.
		return fmt.Errorf("%w\n%s is kept: run fleet down again once that is fixed", err, filepath.Join(root, stateFile))
	}
	os.Remove(filepath.Join(root, stateFile))
	if purge {
		// Their logs too, as a host's purge removes its own (stopScript).
		for _, p := range localProcs(st) {
			os.RemoveAll(p.DataDir)
			if p.Log != "" {
				os.Remove(p.Log)
			}
		}
	}
	if len(left) > 0 {
		// Their nodes did not answer: what runs of them is not the
		// master's to stop, and its processes are gone now.
		return fmt.Errorf("the fleet's processes are stopped, but %d sandbox(es) could not be deleted, their nodes not answering: %s; their runsc sandboxes may still run (runsc --root <node data dir>/runsc list; runsc … delete --force ID), with their mounts under the node's data dir and their namespaces (ip netns list: ss-<id>)",
			len(left), strings.Join(left, ", "))
	}
	fmt.Fprintln(out, "fleet is down")
	return nil
}

// deleteSandboxes deletes every sandbox of the fleet through its master,
// saying how many went, and returns those that did not ("name (node)").
func deleteSandboxes(st State, out io.Writer) (left []string) {
	c, err := client.ForDataDir(st.API, st.Master.DataDir)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sbs, err := c.Sandboxes(ctx)
	if err != nil {
		fmt.Fprintf(out, "the master does not list its sandboxes (%v): none deleted through it\n", err)
		return nil
	}
	for _, sb := range sbs {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			fmt.Fprintf(out, "delete sandbox %s: %v\n", sb.Name, err)
			left = append(left, fmt.Sprintf("%s (%s)", sb.Name, sb.Node))
		}
	}
	fmt.Fprintf(out, "deleted %d of %d sandbox(es)\n", len(sbs)-len(left), len(sbs))
	return left
}

// localProcs are the fleet's processes on this machine: its master, its
// nodes and its mesh's here.
func localProcs(st State) []Proc {
	out := []Proc{st.Master}
	for _, n := range st.Nodes {
		if n.Host == "" {
			out = append(out, n.Proc)
		}
	}
	return append(out, meshProcs(st.Mesh)...)
}

// down stops the master, the mesh and every node by PID: here directly,
// on a host over ssh, its sam-node before its node (purging their files
// there with purge). It returns what the hosts could not do.
func down(st State, purge bool, out io.Writer) error {
	procs := append(meshProcs(st.Mesh), st.Master)
	for _, n := range st.Nodes {
		if n.Host == "" {
			procs = append(procs, n.Proc)
		}
	}
	for _, p := range procs {
		stop(p, out)
	}
	var errs []error
	for _, n := range st.Nodes {
		if n.Host == "" {
			exec.Command("ip", "netns", "delete", n.Netns).Run()
			exec.Command("ip", "link", "delete", n.HostIf).Run()
		}
	}
	for _, r := range remoteUnits(st) {
		name, host := r.name()
		if st.SSH == nil {
			errs = append(errs, fmt.Errorf("node %s on %s: fleet.json says nothing of how to reach it (no \"ssh\")", name, host))
			continue
		}
		if err := stopRemote(*st.SSH, r.node, r.mesh, purge, out); err != nil {
			errs = append(errs, fmt.Errorf("node %s on %s: %w", name, host, err))
		}
	}
	return errors.Join(errs...)
}

// remoteUnit is what fleet up started for one node on a host: the node,
// its sam-node, or both (either is nil if fleet up failed before it).
type remoteUnit struct {
	node *NodeState
	mesh *MeshNode
}

func (r remoteUnit) name() (string, string) {
	if r.node != nil {
		return r.node.Name, r.node.Host
	}
	return r.mesh.Name, r.mesh.Host
}

// remoteUnits pairs each node on a host with its sam-node, in
// fleet.json's order.
func remoteUnits(st State) []remoteUnit {
	var out []remoteUnit
	used := map[string]bool{}
	var mesh []MeshNode
	if st.Mesh != nil {
		mesh = st.Mesh.Nodes
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		if n.Host == "" {
			continue
		}
		u := remoteUnit{node: n}
		for j := range mesh {
			if mesh[j].Host == n.Host && mesh[j].Name == n.Name {
				u.mesh = &mesh[j]
				used[n.Name+"@"+n.Host] = true
			}
		}
		out = append(out, u)
	}
	for j := range mesh {
		if mesh[j].Host != "" && !used[mesh[j].Name+"@"+mesh[j].Host] {
			out = append(out, remoteUnit{mesh: &mesh[j]})
		}
	}
	return out
}

// stop sends SIGTERM to p's process if it is still the sandstormd it
// started (its command line names its data dir), and waits for it.
func stop(p Proc, out io.Writer) {
	if p.PID <= 0 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
	if err != nil || !strings.Contains(string(cmdline), p.DataDir) {
		return // gone, or the PID is another process's now
	}
	syscall.Kill(p.PID, syscall.SIGTERM)
	for i := 0; i < 300; i++ {
		if syscall.Kill(p.PID, 0) != nil {
			fmt.Fprintf(out, "stopped PID %d\n", p.PID)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(out, "PID %d did not stop within 30 s\n", p.PID)
}

// nodeArgs are args with "{addr}" replaced by addr, a node's own address
// (its --gateway-listen host), for a flag that differs per node
// (--ingress-public {addr}).
func nodeArgs(args []string, addr string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "{addr}", addr)
	}
	return out
}
