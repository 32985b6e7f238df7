package fleetup

// fleet up --hosts: the nodes on other machines, reached over ssh (ssh.go).
// Everything about the hosts is checked before anything is started
// (planHosts); then each host gets this sandstormd (and runsc) unless it
// has them already, byte for byte, and a node started detached with a PID
// file; fleet up reads each node's pairing code over ssh and pairs it
// from the master here, which it runs as for a fleet on this machine.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"sandstorm/internal/sandbox/gvisor"
)

// SSHState is how fleet up reached its hosts and where it put things
// there (fleet.json), for fleet down.
type SSHState struct {
	SSH
	RemoteDir string `json:"remote_dir"`
	// RemoteRunsc is the runsc that was on the hosts already ("" when
	// fleet up copied its own into bin/, which --purge then removes).
	RemoteRunsc string `json:"remote_runsc,omitempty"`
}

// hostPlan is fleet up --hosts worked out and checked before anything is
// started.
type hostPlan struct {
	ssh      SSHState
	nodes    []*remoteNode
	files    []localFile // what each host's bin/ must hold
	nodePort int
	// meshListen are the addresses the control plane and the router
	// listen on here: where the hosts reach this machine (MeshAddresses);
	// none without the mesh.
	meshListen []netip.Addr
}

// remoteNode is one host and the node fleet up runs on it.
type remoteNode struct {
	host   Host
	name   string
	subnet string
	addr   string // where its node listens: the host's address sshd answered on
	sudo   bool   // its root steps go through sudo -n
	l      layout
	// sees is the address it sees this machine at (its SSH_CONNECTION's
	// first field); meshAddr the one its sam-node reaches the control
	// plane and router at (MeshAddresses).
	sees     string
	meshAddr netip.Addr
	// meshJoin: its sam-node is not a member yet (meshJoinNeeded).
	meshJoin bool
}

// envdName is envd's binary, which a node looks for beside its sandstormd.
const envdName = "sandstorm-envd"

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

type localFile struct {
	name, path, sum string
	size            int64
}

// unameArch is uname -m for each GOARCH fleet up can check a host against.
var unameArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64", "riscv64": "riscv64", "ppc64le": "ppc64le", "s390x": "s390x"}

// planHosts parses and checks the hosts flags, hashes what is to be
// copied and asks every host (at once) over ssh who and what it is.
func planHosts(ctx context.Context, cfg Config, say func(string, ...any)) (*hostPlan, error) {
	if err := cfg.checkHosts(); err != nil {
		return nil, err
	}
	hosts, _ := ParseHosts(cfg.Hosts)
	names, _ := NodeNames(hosts)
	subnets, _ := NodeSubnets(cfg.NodeSubnet, len(hosts))
	p := &hostPlan{ssh: SSHState{SSH: cfg.SSH, RemoteDir: cfg.RemoteDir, RemoteRunsc: cfg.RemoteRunsc}, nodePort: cfg.NodePort}
	for i, h := range hosts {
		p.nodes = append(p.nodes, &remoteNode{host: h, name: names[i], subnet: subnets[i], l: layout{Dir: cfg.RemoteDir, Node: names[i]}})
	}
	files := []localFile{{name: "sandstormd", path: cfg.Bin}}
	if cfg.RemoteRunsc == "" {
		runsc := cfg.Runsc
		if runsc == "" {
			// Where the node looks for it by default, and where the master
			// machine's own is (gvisor.DefaultRunsc).
			runsc = filepath.Join(filepath.Dir(cfg.Bin), "runsc")
		}
		if _, err := os.Stat(runsc); err != nil {
			return nil, fmt.Errorf("no runsc at %s to copy to the hosts: build the pinned one with `make runsc` (into bin/, next to sandstormd), give another with --runsc PATH, or name one already on every host with --remote-runsc PATH", runsc)
		}
		if v, err := gvisor.Version(ctx, runsc); err != nil {
			return nil, fmt.Errorf("runsc %s: %w", runsc, err)
		} else if v != gvisor.PinnedVersion {
			say("note: runsc %s is %s, not the pinned %s (snapshots restore only on the runsc that wrote them)", runsc, v, gvisor.PinnedVersion)
		}
		files = append(files, localFile{name: "runsc", path: runsc})
	}
	// envd (commands, files, the E2B API) is found beside sandstormd, on
	// the hosts as here: a node without it serves none of them.
	if envd := filepath.Join(filepath.Dir(cfg.Bin), envdName); fileExists(envd) {
		files = append(files, localFile{name: envdName, path: envd})
	} else {
		say("note: no %s beside %s (make build puts it there): the nodes will serve no commands and files (sandbox exec/cp, the E2B API)", envdName, cfg.Bin)
	}
	if !cfg.NoMesh {
		// The node's sam-node runs beside it (mesh.go); meshBinaries has
		// checked it is there.
		files = append(files, localFile{name: "sam-node", path: filepath.Join(filepath.Dir(cfg.Bin), "sam-node")})
		if cfg.MeshConfig != "" {
			files = append(files, localFile{name: meshConfigName, path: cfg.MeshConfig})
		}
	}
	for i := range files {
		sum, size, err := fileSum(files[i].path)
		if err != nil {
			return nil, err
		}
		files[i].sum, files[i].size = sum, size
	}
	p.files = files
	if err := each(len(p.nodes), func(i int) error { return p.preflight(ctx, p.nodes[i], say) }); err != nil {
		return p, err
	}
	if cfg.NoMesh {
		return p, nil
	}
	local, err := localAddrs()
	if err != nil {
		return p, err
	}
	sees := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		sees[i] = n.sees
	}
	per, listen, err := MeshAddresses(hosts, sees, local, cfg.MeshAddress)
	if err != nil {
		return p, err
	}
	for i, n := range p.nodes {
		n.meshAddr = per[i]
	}
	p.meshListen = listen
	var ls []string
	for _, a := range listen {
		ls = append(ls, a.String())
	}
	var ports []string
	for _, port := range append([]int{controlPlanePort}, routerPorts(max(cfg.Routers, 1))...) {
		ports = append(ports, strconv.Itoa(port))
	}
	say("mesh: the control plane and the routers will listen on %s (where the hosts reach this machine): the hosts must reach it there on TCP %s", strings.Join(ls, ", "), strings.Join(ports, ", "))
	return p, nil
}

// localAddrs are this machine's addresses.
func localAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("this machine's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// checkHosts is every check of the --hosts flags that needs no host.
func (cfg Config) checkHosts() error {
	hosts, err := ParseHosts(cfg.Hosts)
	if err != nil {
		return err
	}
	if _, err := NodeNames(hosts); err != nil {
		return err
	}
	if _, err := NodeSubnets(cfg.NodeSubnet, len(hosts)); err != nil {
		return err
	}
	if err := CheckRemoteDir(cfg.RemoteDir); err != nil {
		return err
	}
	if cfg.NodePort < 1 || cfg.NodePort > 65535 {
		return fmt.Errorf("--node-port %d: want 1 to 65535", cfg.NodePort)
	}
	if cfg.RemoteRunsc != "" && !filepath.IsAbs(cfg.RemoteRunsc) {
		return fmt.Errorf("--remote-runsc %q: want an absolute path on the hosts", cfg.RemoteRunsc)
	}
	if cfg.RemoteRunsc != "" && cfg.Runsc != "" {
		return errors.New("--runsc (a runsc to copy) and --remote-runsc (one on the hosts already) exclude each other")
	}
	if !cfg.NoMesh {
		if cfg.MeshAddress != "" {
			if a, err := netip.ParseAddr(cfg.MeshAddress); err != nil || a.Zone() != "" {
				return fmt.Errorf("--mesh-address %q: want an IP address of this machine", cfg.MeshAddress)
			}
		}
		names, _ := NodeNames(hosts)
		for _, n := range names {
			if s := (layout{Dir: cfg.RemoteDir, Node: n}).meshSocket(); len(s) > maxSocketPath {
				return fmt.Errorf("--remote-dir %s: node %s's sam-node socket would be %s, longer than a unix socket path may be (%d bytes): use a shorter --remote-dir", cfg.RemoteDir, n, s, maxSocketPath)
			}
		}
	}
	for _, o := range cfg.SSH.Options {
		if strings.HasPrefix(o, "-") || o == "" {
			return fmt.Errorf("--ssh-option %q: give the option itself, as for ssh -o (e.g. --ssh-option StrictHostKeyChecking=accept-new)", o)
		}
	}
	return nil
}

// Validate checks cfg's flags as given, before anything runs: what it
// says is a mistake in how fleet up was called.
func (cfg Config) Validate() error {
	if cfg.NoMesh && (cfg.MeshAddress != "" || cfg.MeshConfig != "" || cfg.MeshPolicy != "" || cfg.Routers > 1) {
		return errors.New("--mesh-address, --mesh-config, --mesh-policy and --routers are for the mesh, which --no-mesh leaves out")
	}
	if cfg.Routers < 0 || cfg.Routers > maxRouters {
		return fmt.Errorf("--routers %d: 1 to %d", cfg.Routers, maxRouters)
	}
	if len(cfg.Hosts) > 0 {
		return cfg.checkHosts()
	}
	if cfg.Nodes < 1 || cfg.Nodes > 9 {
		return fmt.Errorf("--nodes %d: 1 to 9 on one machine", cfg.Nodes)
	}
	return nil
}

func fileSum(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// each runs f(0…n-1) at once and returns every error.
func each(n int, f func(int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// preflight: ssh works without a prompt, the node can be root, the
// machine runs this binary, and which address the node listens on.
func (p *hostPlan) preflight(ctx context.Context, n *remoteNode, say func(string, ...any)) error {
	out, err := p.ssh.run(ctx, n.host, "check the host", preflightScript(p.ssh.Sudo), false)
	if err != nil {
		return err
	}
	kv := keyValues(out)
	if kv["uid"] != "0" {
		if !p.ssh.Sudo {
			return fmt.Errorf("%s: logged in as uid %s, and a node needs root: log in as root (root@%s), or pass --sudo for passwordless sudo there", n.host.Spec, kv["uid"], n.host.Addr)
		}
		if kv["sudo"] != "ok" {
			return fmt.Errorf("%s: `sudo -n true` fails there (a password is asked, or the user may not sudo): allow this user passwordless sudo, or log in as root", n.host.Spec)
		}
		n.sudo = true
	}
	if want, ok := unameArch[runtime.GOARCH]; ok && kv["arch"] != want {
		return fmt.Errorf("%s is %s, and this sandstormd (the one fleet up copies) is built for %s (%s): run fleet up from a machine of the hosts' architecture", n.host.Spec, kv["arch"], runtime.GOARCH, want)
	}
	if f := strings.Fields(kv["conn"]); len(f) == 4 {
		if a, err := netip.ParseAddr(f[2]); err == nil {
			n.addr = a.WithZone("").String()
		}
		n.sees = f[0]
	}
	if n.addr == "" {
		if a, err := netip.ParseAddr(n.host.Addr); err == nil {
			n.addr = a.String()
		} else {
			return fmt.Errorf("%s: cannot tell the address its node should listen on (SSH_CONNECTION is empty there): name the host by its IP address in --hosts", n.host.Spec)
		}
	}
	who := "root"
	if n.sudo {
		who = "sudo"
	}
	say("host %s: ssh ok (%s, %s); node %s will listen on %s", n.host.Spec, who, kv["arch"], n.name, n.listen(p))
	return nil
}

// listen is n's --node-listen, the address the master pairs with.
func (n *remoteNode) listen(p *hostPlan) string {
	return net.JoinHostPort(n.addr, strconv.Itoa(p.nodePort))
}

// prepare readies n's host: what is there inspected (a node or sam-node
// of this name still running is an error), the binaries (and the
// sam-node config) checked and copied if they differ, and, with the mesh
// (cp), whether its sam-node must enrol.
func (p *hostPlan) prepare(ctx context.Context, n *remoteNode, cp *meshCP, say func(string, ...any)) error {
	out, err := p.ssh.run(ctx, n.host, "inspect "+p.ssh.RemoteDir, inspectScript(n.l, p.ssh.RemoteRunsc), n.sudo)
	if err != nil {
		return err
	}
	kv := keyValues(out)
	if pid := kv["running"]; pid != "" {
		return fmt.Errorf("%s: a node %s already runs there (PID %s, %s): take its fleet down first (sandstormd fleet down --root … on the machine that brought it up), or use another --remote-dir", n.host.Spec, n.name, pid, n.l.pidFile())
	}
	if cp != nil {
		if pid := kv["mesh_running"]; pid != "" {
			return fmt.Errorf("%s: a sam-node of node %s already runs there (PID %s, %s): take its fleet down first, or use another --remote-dir", n.host.Spec, n.name, pid, n.l.meshPIDFile())
		}
		if n.meshJoin, err = meshJoinNeeded(kv, cp.caSum, meshURL(n.meshAddr), n.host, n.l); err != nil {
			return err
		}
	}
	if p.ssh.RemoteRunsc != "" {
		if kv["runsc_missing"] != "" {
			return fmt.Errorf("%s: no runsc at %s (--remote-runsc); leave the flag out and fleet up copies the pinned one", n.host.Spec, p.ssh.RemoteRunsc)
		}
		if v := strings.TrimPrefix(kv["runsc_version"], "runsc version "); v != gvisor.PinnedVersion {
			say("host %s: note: runsc there is %q, not the pinned %s", n.host.Spec, v, gvisor.PinnedVersion)
		}
	}
	var need []localFile
	for _, f := range p.files {
		if kv[f.name] == f.sum {
			say("host %s: %s is up to date", n.host.Spec, f.name)
		} else {
			need = append(need, f)
		}
	}
	if len(need) > 0 {
		return p.install(ctx, n, need, say)
	}
	return nil
}

// start starts node n on its host, detached (prepare has readied the
// host), its boundaries on its sam-node's policy with the mesh. It
// returns its state once it has a PID.
func (p *hostPlan) start(ctx context.Context, cfg Config, n *remoteNode, mesh bool, say func(string, ...any)) (NodeState, error) {
	st := NodeState{Name: n.name, Address: n.listen(p), Host: n.host.Spec, PIDFile: n.l.pidFile(), Sudo: n.sudo,
		Proc: Proc{DataDir: n.l.dataDir(), Log: n.l.log()}}
	args := []string{n.l.bin(), "serve", "--node", "--node-name", n.name, "--node-listen", n.listen(p),
		"--data-dir", n.l.dataDir(), "--subnet", n.subnet, "--gateway-listen", n.addr}
	if p.ssh.RemoteRunsc != "" {
		args = append(args, "--runsc", p.ssh.RemoteRunsc)
	}
	args = append(args, nodeArgs(cfg.NodeArgs, n.addr)...)
	if mesh {
		// After --node-arg, as for a fleet here: the mesh's policy is
		// the fleet's one policy.
		args = append(args, "--sam-node", "unix://"+n.l.meshSocket(), "--policy", "sam-node")
	}
	out, err := p.ssh.run(ctx, n.host, "start the node", startScript(n.l, args), n.sudo)
	if err != nil {
		return st, err
	}
	if st.PID, err = strconv.Atoi(strings.TrimSpace(out)); err != nil || st.PID <= 0 {
		return st, fmt.Errorf("%s: starting the node printed %q, not its PID", n.host.Spec, strings.TrimSpace(out))
	}
	say("node %s: PID %d on %s, listening on %s, sandboxes in %s; log %s:%s", n.name, st.PID, n.host.Spec, st.Address, n.subnet, n.host.Spec, st.Log)
	return st, nil
}

// startSamNode enrols n's sam-node with token (unless it is a member
// already) and starts it detached on its host: a member listening on the
// host's address, dialling the router at the address the host reaches
// this machine at, its agent socket for the node's boundaries. It
// returns its state once it has a PID, and where in its log this start
// begins.
func (p *hostPlan) startSamNode(ctx context.Context, cfg Config, n *remoteNode, cp *meshCP, token string, say func(string, ...any)) (MeshNode, int64, error) {
	mn := MeshNode{Name: n.name, Host: n.host.Spec, PIDFile: n.l.meshPIDFile(), Sudo: n.sudo, Socket: n.l.meshSocket(),
		Proc: Proc{DataDir: n.l.meshDir(), Log: n.l.meshLog()}}
	addr, err := netip.ParseAddr(n.addr)
	if err != nil {
		return mn, 0, fmt.Errorf("%s: its address %q: %w", n.host.Spec, n.addr, err)
	}
	var join *meshJoin
	if n.meshJoin {
		join = &meshJoin{URL: meshURL(n.meshAddr), Name: n.name, Token: token, CA: cp.ca,
			Hint: fmt.Sprintf("(%s must reach this fleet's control plane at %s, TCP %d: a firewall between?)", n.host.Spec, n.meshAddr, controlPlanePort)}
	}
	args := append([]string{n.l.samNode(), "--mesh-dir", n.l.meshDir()}, cp.routersFor(n.meshAddr)...)
	args = append(args, "--p2p-listen", tcpMultiaddr(addr, memberPort), "--listen", "unix://"+n.l.meshSocket(), "--admin-addr", meshAdminAddr)
	if cfg.MeshConfig != "" {
		args = append(args, "--config", n.l.meshConfig())
	}
	script, err := samNodeScript(n.l, join, args)
	if err != nil {
		return mn, 0, err
	}
	out, err := p.ssh.run(ctx, n.host, "start node "+n.name+"'s sam-node", script, n.sudo)
	if err != nil {
		return mn, 0, err
	}
	kv := keyValues(out)
	off, _ := strconv.ParseInt(kv["log_offset"], 10, 64)
	if mn.PID, err = strconv.Atoi(kv["pid"]); err != nil || mn.PID <= 0 {
		return mn, 0, fmt.Errorf("%s: starting the sam-node printed %q, not its PID", n.host.Spec, strings.TrimSpace(out))
	}
	how := "enrolled now"
	if join == nil {
		how = "a member already (its mesh dir kept from an earlier fleet up)"
	}
	say("sam-node of %s: PID %d on %s, %s, listening on %s; log %s:%s", n.name, mn.PID, n.host.Spec, how, tcpMultiaddr(addr, memberPort), n.host.Spec, mn.Log)
	return mn, off, nil
}

// install copies files to a stage on n's host with scp and moves them
// into bin/ as root.
func (p *hostPlan) install(ctx context.Context, n *remoteNode, files []localFile, say func(string, ...any)) error {
	out, err := p.ssh.run(ctx, n.host, "make a directory to copy into", stageScript(n.l, n.sudo), false)
	if err != nil {
		return err
	}
	stage := strings.TrimSpace(out)
	if !strings.HasPrefix(stage, "/") || strings.ContainsAny(stage, "\n'") {
		return fmt.Errorf("%s: mktemp printed %q", n.host.Spec, stage)
	}
	var st []staged
	for _, f := range files {
		say("host %s: copying %s (%d MiB)", n.host.Spec, f.name, f.size>>20)
		if err := p.ssh.copy(ctx, n.host, f.path, stage+"/"+f.name); err != nil {
			// The stage is the login user's; best effort, the error is
			// the copy's.
			p.ssh.run(context.WithoutCancel(ctx), n.host, "remove "+stage, "rm -rf "+shQuote(stage)+"\n", false)
			return err
		}
		st = append(st, staged{Name: f.name, Sum: f.sum})
	}
	_, err = p.ssh.run(ctx, n.host, "install into "+p.ssh.RemoteDir+"/bin", installScript(n.l, stage, st), n.sudo)
	return err
}

// pairingCode waits on n's host until its node has written its pairing
// code, reads it (never shown: it pairs whoever has it), and waits until
// this machine reaches the node's address.
func pairingCode(ctx context.Context, s SSHState, n NodeState) (string, error) {
	h, err := ParseHost(n.Host)
	if err != nil {
		return "", err
	}
	l := layout{Dir: s.RemoteDir, Node: n.Name}
	out, err := s.run(ctx, h, "read node "+n.Name+"'s pairing code", codeScript(l, n.PID), n.Sudo)
	if err != nil {
		return "", err
	}
	code := strings.TrimSpace(out)
	if code == "" {
		return "", fmt.Errorf("%s: node %s's pairing code file %s is empty", n.Host, n.Name, l.codeFile())
	}
	deadline := time.Now().Add(time.Minute)
	for {
		c, derr := net.DialTimeout("tcp", n.Address, 2*time.Second)
		if derr == nil {
			c.Close()
			return code, nil
		}
		if time.Now().After(deadline) {
			tail, _ := s.run(context.WithoutCancel(ctx), h, "read the log", tailScript(l), n.Sudo)
			_, port, _ := net.SplitHostPort(n.Address)
			return "", fmt.Errorf("node %s on %s runs, but this machine cannot reach it at %s within a minute (%v): let TCP port %s through to it from here (a firewall?), or see its log %s there:\n%s", n.Name, n.Host, n.Address, derr, port, n.Log, lastLines(tail, 10))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stopRemote stops, on one host, a node's sam-node (mn) and then the
// node (n) by PID — either may be nil, when fleet up failed before it
// started — and with purge removes their files there, saying what it did.
func stopRemote(s SSHState, n *NodeState, mn *MeshNode, purge bool, out io.Writer) error {
	name, spec, sudo := "", "", false
	if n != nil {
		name, spec, sudo = n.Name, n.Host, n.Sudo
	} else {
		name, spec, sudo = mn.Name, mn.Host, mn.Sudo
	}
	h, err := ParseHost(spec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := layout{Dir: s.RemoteDir, Node: name}
	script := ""
	if mn != nil {
		script += stopMeshScript(l, mn.PID, purge)
	}
	if n != nil {
		script += stopScript(l, n.PID, purge, s.RemoteRunsc == "")
	}
	res, err := s.run(ctx, h, "stop node "+name, script, sudo)
	kv := map[string]bool{}
	for _, w := range strings.Fields(res) {
		kv[w] = true
	}
	// say tells what the script said of one process, its words prefixed
	// with prefix (killWait's, and "purged").
	say := func(prefix, who string, pid int, removed string) {
		switch {
		case kv[prefix+"stopped"]:
			fmt.Fprintf(out, "%s: stopped PID %d\n", who, pid)
		case kv[prefix+"gone"]:
			fmt.Fprintf(out, "%s: PID %d had already exited\n", who, pid)
		}
		if kv[prefix+"purged"] {
			fmt.Fprintf(out, "%s: removed %s\n", who, removed)
		}
	}
	if mn != nil {
		say("mesh_", fmt.Sprintf("sam-node of %s on %s", name, spec), mn.PID, mn.DataDir+", its log and config")
	}
	if err != nil {
		return err
	}
	if n != nil {
		say("", fmt.Sprintf("node %s on %s", name, spec), n.PID, n.DataDir+" and its log")
	}
	return nil
}

// startHosts brings every host up at once: each readied (prepare); then,
// with the mesh (cp), one bootstrap token for exactly the sam-nodes that
// enrol now, made only once every copy is done so that it lives minutes,
// not as long as the slowest copy; then on each host its sam-node and its
// node, each recorded in st (and fleet.json) as soon as it has a PID, in
// --hosts order; and last, every sam-node waited for until it has joined
// the mesh.
func startHosts(ctx context.Context, cfg Config, p *hostPlan, st *State, cp *meshCP, say func(string, ...any)) error {
	st.SSH = &p.ssh
	save(cfg.Root, *st)
	if err := each(len(p.nodes), func(i int) error { return p.prepare(ctx, p.nodes[i], cp, say) }); err != nil {
		return err
	}
	var token string
	if cp != nil {
		joins := 0
		for _, n := range p.nodes {
			if n.meshJoin {
				joins++
			}
		}
		if joins > 0 {
			var err error
			if token, err = cp.token(ctx, joins); err != nil {
				return err
			}
			say("mesh: a bootstrap token for exactly %d enrolment(s), good for %v, fed to each sam-node join on its stdin", joins, meshTokenTTL)
		}
	}
	var mu sync.Mutex
	started := make([]*NodeState, len(p.nodes))
	meshStarted := make([]*MeshNode, len(p.nodes))
	offsets := make([]int64, len(p.nodes))
	record := func() {
		st.Nodes = st.Nodes[:0]
		for _, s := range started {
			if s != nil {
				st.Nodes = append(st.Nodes, *s)
			}
		}
		if cp != nil {
			st.Mesh.Nodes = st.Mesh.Nodes[:0]
			for _, s := range meshStarted {
				if s != nil {
					st.Mesh.Nodes = append(st.Mesh.Nodes, *s)
				}
			}
		}
		save(cfg.Root, *st)
	}
	err := each(len(p.nodes), func(i int) error {
		if cp != nil {
			mn, off, err := p.startSamNode(ctx, cfg, p.nodes[i], cp, token, say)
			if mn.PID > 0 {
				mu.Lock()
				meshStarted[i], offsets[i] = &mn, off
				record()
				mu.Unlock()
			}
			if err != nil {
				return err
			}
		}
		n, err := p.start(ctx, cfg, p.nodes[i], cp != nil, say)
		if n.PID > 0 {
			mu.Lock()
			started[i] = &n
			record()
			mu.Unlock()
		}
		return err
	})
	if err != nil || cp == nil {
		return err
	}
	return each(len(p.nodes), func(i int) error {
		n, mn := p.nodes[i], meshStarted[i]
		if _, err := p.ssh.run(ctx, n.host, "wait for node "+n.name+"'s sam-node to join the mesh", meshWaitScript(n.l, mn.PID, offsets[i]), n.sudo); err != nil {
			return err
		}
		say("sam-node of %s on %s: a member of the mesh", n.name, n.host.Spec)
		return nil
	})
}
