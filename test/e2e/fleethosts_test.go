package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/fleetup"
	"sandstorm/internal/pki"
	"sandstorm/internal/testenv"
)

// sshHost is machine k of a fleet over ssh: network namespace sh-<k>,
// joined to the test's by veth shh<k> (10.191.k.1/24 on this side,
// 10.191.k.2/24 inside), with a real sshd listening inside on
// 10.191.k.2:22. sshd — and so everything fleet up starts through it —
// runs in a mount namespace of its own in which the fleet's --remote-dir
// is dir: the two hosts share nothing fleet up puts there, as two
// machines would not, so every copy is a real one and this machine's
// remoteDir stays empty.
type sshHost struct {
	addr, ns, link string
	dir            string // what the host sees as the remote dir
	hostPub        string // its host key, for known_hosts
	cmd            *exec.Cmd
	exited         chan struct{}
}

func startSSHHost(t *testing.T, k int, keys, remoteDir string) *sshHost {
	t.Helper()
	h := &sshHost{addr: fmt.Sprintf("10.191.%d.2", k), ns: fmt.Sprintf("sh-%d", k), link: fmt.Sprintf("shh%d", k),
		dir: filepath.Join(workDir, fmt.Sprintf("sh%d", k))}
	exec.Command("ip", "netns", "delete", h.ns).Run() // a run cut short
	exec.Command("ip", "link", "delete", h.link).Run()
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"netns", "add", h.ns},
		{"link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
		{"addr", "add", fmt.Sprintf("10.191.%d.1/24", k), "dev", h.link},
		{"link", "set", h.link, "up"},
		{"-n", h.ns, "addr", "add", h.addr + "/24", "dev", "eth0"},
		{"-n", h.ns, "link", "set", "eth0", "up"},
		{"-n", h.ns, "link", "set", "lo", "up"},
		{"-n", h.ns, "route", "add", "default", "via", fmt.Sprintf("10.191.%d.1", k)},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	logPath := filepath.Join(workDir, fmt.Sprintf("sshd%d.log", k))
	t.Cleanup(func() {
		// The fleet's own cleanup (registered later) has run by now;
		// whatever a failure left of it goes by its data dir's path.
		for pid := range processesMentioning(remoteDir + "/") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if h.cmd != nil && h.cmd.Process != nil {
			stopProcess(h.cmd.Process, h.exited, syscall.SIGTERM, 10*time.Second)
		}
		exec.Command("ip", "netns", "delete", h.ns).Run()
		exec.Command("ip", "link", "delete", h.link).Run()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("sshd %s's log:\n%s", h.ns, lastBytes(b, 3000))
			b, _ = os.ReadFile(filepath.Join(h.dir, "10-191-"+strconv.Itoa(k)+"-2.log"))
			t.Logf("node on %s, its log:\n%s", h.addr, lastBytes(b, 6000))
			b, _ = os.ReadFile(filepath.Join(h.dir, "10-191-"+strconv.Itoa(k)+"-2-sam-node.log"))
			t.Logf("sam-node on %s, its log:\n%s", h.addr, lastBytes(b, 4000))
		}
		os.RemoveAll(h.dir)
	})
	hostKey := filepath.Join(keys, fmt.Sprintf("host%d", k))
	keygen(t, hostKey)
	pub, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	h.hostPub = strings.TrimSpace(string(pub))
	conf := filepath.Join(keys, fmt.Sprintf("sshd%d.conf", k))
	// Only what the test needs, all of it in the test's files: the key
	// it generated, no passwords, no PAM; StrictModes off because
	// t.TempDir's parents are not root-only.
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`ListenAddress %s:22
HostKey %s
PidFile %s
AuthorizedKeysFile %s
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
Subsystem sftp internal-sftp
LogLevel VERBOSE
`, h.addr, hostKey, filepath.Join(keys, fmt.Sprintf("sshd%d.pid", k)), filepath.Join(keys, "authorized_keys"))), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("/usr/sbin/sshd", "-t", "-f", conf).CombinedOutput(); err != nil {
		t.Fatalf("sshd -t -f %s: %v: %s", conf, err, out)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// nsenter --net only (as for the netns fleet: ip netns exec would
	// hide the cgroups runsc needs), then a private mount namespace in
	// which the bind mount of the host's own dir over remoteDir is seen
	// by sshd and its sessions alone; exec all the way down, so the PID
	// is sshd's.
	h.cmd = exec.Command("nsenter", "--net=/run/netns/"+h.ns, "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount --bind "$1" "$2" && exec /usr/sbin/sshd -D -e -f "$3"`, "sh", h.dir, remoteDir, conf)
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.exited = make(chan struct{})
	go func() { h.cmd.Wait(); close(h.exited) }()
	testenv.WaitFor(t, 20*time.Second, "sshd listens on "+h.addr+":22", func() bool {
		select {
		case <-h.exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("sshd in %s exited at start:\n%s", h.ns, b)
		default:
		}
		c, err := net.DialTimeout("tcp", h.addr+":22", 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return h
}

func keygen(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", filepath.Base(path), "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen %s: %v: %s", path, err, out)
	}
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func fileSHA(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// netnsInode is the inode of a network namespace, to tell which one a
// process is in.
func netnsInode(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

// TestFleetUpHosts: sandstormd fleet up --hosts brings a node up on each
// of two machines over real ssh — sshd in a network namespace and a mount
// namespace of its own, a key and a known_hosts the test made, given by
// --ssh-identity and --ssh-option — copying sandstormd and runsc there,
// pairing each node by the code it reads over ssh (never printed), and
// checks a sandbox answers on each; fleet down stops the nodes by PID
// over ssh, keeping their files for a fleet up again, and with --purge
// leaves nothing on the hosts. A host ssh cannot reach
// fails before anything starts, saying what to check; nodes that cannot
// start fail fleet up with their logs' last words and are taken down;
// --nodes with --hosts is a usage error.
//
// The fleet is one mesh, with nothing configured by hand but the policy
// and the sam-node config given to fleet up: a control plane and a router
// here, listening where each host sees this machine (the two hosts see it
// at different addresses, one per link), and a sam-node on each host,
// enrolled with a token fleet up makes for exactly them. An agent in a
// sandbox on each host reaches the MCP tool the control plane's policy
// grants, through its boundary, and is refused the one it does not; a
// policy change reaches both hosts' boundaries and sam-nodes; fleet down
// stops every mesh process here and on the hosts by PID.
func TestFleetUpHosts(t *testing.T) {
	for _, tool := range []string{"/usr/sbin/sshd", "ssh", "scp", "ssh-keygen", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (apt-get install openssh-server openssh-client)", tool, err)
		}
	}
	// sshd's privilege separation directory, which Debian's service
	// would make at boot.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	keys := t.TempDir()
	clientKey := filepath.Join(keys, "id")
	keygen(t, clientKey)
	pub, err := os.ReadFile(clientKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keys, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(workDir, "fleethosts")
	remoteDir := filepath.Join(workDir, "fhr") // on this machine: the hosts' mount point, and nothing else
	if err := os.MkdirAll(remoteDir, 0o700); err != nil {
		t.Fatal(err)
	}
	hosts := []*sshHost{startSSHHost(t, 1, keys, remoteDir), startSSHHost(t, 2, keys, remoteDir)}
	var kh bytes.Buffer
	for _, h := range hosts {
		fmt.Fprintf(&kh, "%s %s\n", h.addr, h.hostPub)
	}
	knownHosts := filepath.Join(keys, "known_hosts")
	if err := os.WriteFile(knownHosts, kh.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	// Only the test's key and known_hosts: no agent, no ~/.ssh of this
	// machine's root, a host key that is not the known one refused.
	sshFlags := []string{"--ssh-identity", clientKey, "--ssh-option", "IdentitiesOnly=yes",
		"--ssh-option", "UserKnownHostsFile=" + knownHosts, "--ssh-option", "GlobalKnownHostsFile=/dev/null",
		"--ssh-option", "StrictHostKeyChecking=yes"}
	env := []string{}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SSH_AUTH_SOCK=") {
			env = append(env, e)
		}
	}
	fleet := func(args ...string) (string, int) {
		cmd := exec.Command(sandstormdBin, append([]string{"fleet"}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}

	if out, code := fleet("up", "--nodes", "2", "--hosts", "root@"+hosts[0].addr, "--root", root); code != 2 || !strings.Contains(out, "exclude each other") {
		t.Errorf("--nodes with --hosts: exit %d: %s", code, out)
	}
	// Nothing listens on that port: ssh fails, and fleet up says how to
	// see why, before it has started anything.
	out, code := fleet(append([]string{"up", "--hosts", "root@" + hosts[0].addr + ":2222", "--root", root, "--remote-dir", remoteDir}, sshFlags...)...)
	if code != 1 || !strings.Contains(out, "ssh to root@"+hosts[0].addr+":2222 failed") || !strings.Contains(out, "works without a prompt") || !strings.Contains(out, "-p 2222 root@"+hosts[0].addr+" true") {
		t.Errorf("an unreachable host: exit %d: %s", code, out)
	}
	t.Logf("an unreachable host:\n%s", out)
	if exists(filepath.Join(root, "fleet.json")) || exists(filepath.Join(root, "master")) {
		t.Errorf("fleet up started something for a host it could not reach")
	}

	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	t.Cleanup(func() {
		if exists(filepath.Join(root, "fleet.json")) {
			out, _ := fleet("down", "--root", root, "--purge")
			t.Logf("cleanup: fleet down: %s", out)
		}
		for pid := range processesMentioning(root + "/") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(root, "master.log"))
			t.Logf("the master's log:\n%s", lastBytes(b, 4000))
		}
		os.RemoveAll(root)
	})
	// The mesh's policy and its sam-nodes' config, given once: the
	// config is copied to each host, where node and server-everything
	// are at the same paths as here (the hosts share this filesystem but
	// the remote dir).
	nodeJS, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	everything, _ := filepath.Abs("../../testdata/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	meshConfig := writeTemp(t, "sam-node.yaml", fmt.Sprintf("mcp_servers:\n  - {name: everything, command: [%q, %q, stdio]}\n", nodeJS, everything))
	meshPolicy := writeTemp(t, "policy.yaml", "roles:\n  - {name: a, services: [\"mcp://everything/echo\"]}\nbindings:\n  - {principal: agent-a, roles: [a]}\n")
	upArgs := append([]string{"up", "--hosts", "root@" + hosts[0].addr + ",root@" + hosts[1].addr, "--root", root, "--listen", listen,
		"--remote-dir", remoteDir, "--node-subnet", "10.191.101.0/24", "--mesh-policy", meshPolicy, "--mesh-config", meshConfig}, sshFlags...)

	// Nodes that cannot start: fleet up copies the binaries, says why the
	// nodes died (the end of their logs, read over ssh) and takes down
	// what it made.
	out, code = fleet(append(upArgs, "--node-arg=--no-such-flag")...)
	if code != 1 || !strings.Contains(out, "exited; the end of") || !strings.Contains(out, "unknown flag: --no-such-flag") || !strings.Contains(out, "taking down what it made") {
		t.Errorf("nodes that cannot start: exit %d:\n%s", code, out)
	}
	t.Logf("nodes that cannot start:\n%s", out)
	for _, want := range []string{"host root@10.191.1.2: copying sandstormd", "host root@10.191.2.2: copying runsc", "host root@10.191.1.2: copying sam-node",
		// Each host sees this machine at its own link's address.
		"the control plane and the routers will listen on 10.191.1.1, 10.191.2.1",
		// The sam-nodes enrol with one token for exactly them.
		"mesh: a bootstrap token for exactly 2 enrolment(s)", "sam-node of 10-191-1-2: PID", "enrolled now",
		"sam-node of 10-191-2-2 on root@10.191.2.2: a member of the mesh",
		"sam-node of 10-191-1-2 on root@10.191.1.2: stopped PID"} {
		if !strings.Contains(out, want) {
			t.Errorf("the failed fleet up did not say %q", want)
		}
	}
	if exists(filepath.Join(root, "fleet.json")) {
		t.Error("a failed fleet up left fleet.json")
	}
	if ps := processesMentioning(root + "/"); len(ps) > 0 {
		t.Errorf("a failed fleet up left processes: %v", ps)
	}
	if ps := processesMentioning(remoteDir + "/"); len(ps) > 0 {
		t.Errorf("a failed fleet up left processes on the hosts: %v", ps)
	}

	start := time.Now()
	out, code = fleet(upArgs...)
	if code != 0 {
		t.Fatalf("fleet up --hosts: exit %d\n%s", code, out)
	}
	t.Logf("fleet up --hosts took %.1fs:\n%s", time.Since(start).Seconds(), out)
	for _, want := range []string{
		"host root@10.191.1.2: ssh ok (root,", "host root@10.191.2.2: ssh ok (root,",
		// Copied by the failed run; the same bytes are not copied twice.
		"host root@10.191.1.2: sandstormd is up to date", "host root@10.191.2.2: runsc is up to date",
		"node 10-191-1-2: PID ", "listening on 10.191.2.2:7443, sandboxes in 10.191.102.0/24",
		"paired 10-191-1-2", "paired 10-191-2-2", "on 10-191-1-2 answers", "on 10-191-2-2 answers",
		"fleet is up: 2 node(s)", "fleet down --root " + root,
		"control plane: PID", "API https://10.191.1.1:7600 https://10.191.2.1:7600", "router: PID", "/ip4/10.191.2.1/tcp/7700/p2p/",
		// Enrolled by the failed run, which kept their mesh dirs: no
		// token now.
		"sam-node of 10-191-1-2: PID", "a member already", "sam-node of 10-191-2-2 on root@10.191.2.2: a member of the mesh",
		"sam-node.yaml is up to date", "policy set FILE",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("fleet up did not say %q", want)
		}
	}

	readState := func() (st fleetup.State) {
		if b, err := os.ReadFile(filepath.Join(root, "fleet.json")); err != nil || json.Unmarshal(b, &st) != nil {
			t.Fatalf("fleet.json: %v", err)
		}
		return st
	}
	st := readState()
	if st.SSH == nil || st.SSH.RemoteDir != remoteDir || st.SSH.Identity != clientKey || len(st.Nodes) != 2 {
		t.Fatalf("fleet.json: %+v", st)
	}
	for i, n := range st.Nodes {
		h := hosts[i]
		if n.Host != "root@"+h.addr || n.Address != h.addr+":7443" || n.PID <= 0 || n.Netns != "" {
			t.Errorf("node %d in fleet.json: %+v", i, n)
		}
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n.PID))
		if !strings.Contains(string(cl), n.DataDir) || !strings.Contains(string(cl), "--node-listen\x00"+n.Address) {
			t.Errorf("PID %d of node %s is %q", n.PID, n.Name, cl)
		}
		// Started over ssh, the node is where that sshd is.
		if got, want := netnsInode(fmt.Sprintf("/proc/%d/ns/net", n.PID)), netnsInode("/run/netns/"+h.ns); got == 0 || got != want {
			t.Errorf("node %s is not in netns %s (%d, want %d)", n.Name, h.ns, got, want)
		}
		// Copied to the host, byte for byte.
		if fileSHA(t, filepath.Join(h.dir, "bin", "sandstormd")) != fileSHA(t, sandstormdBin) || fileSHA(t, filepath.Join(h.dir, "bin", "runsc")) != fileSHA(t, runscBin) ||
			fileSHA(t, filepath.Join(h.dir, "bin", "sandstorm-envd")) != fileSHA(t, filepath.Join(workDir, "sandstorm-envd")) {
			t.Errorf("the binaries on %s are not this machine's", h.addr)
		}
		code, err := os.ReadFile(filepath.Join(h.dir, n.Name, "pki", pki.PairingCodeFile))
		if err != nil || len(bytes.TrimSpace(code)) < 8 {
			t.Errorf("node %s's pairing code: %v %q", n.Name, err, code)
		} else if strings.Contains(out, string(bytes.TrimSpace(code))) {
			t.Errorf("fleet up printed node %s's pairing code", n.Name)
		}
	}
	if ents, _ := os.ReadDir(remoteDir); len(ents) > 0 {
		t.Errorf("fleet up wrote into this machine's %s (the hosts' remote dir): %v", remoteDir, ents)
	}
	if strings.Contains(out, "a bootstrap token for") {
		t.Errorf("fleet up made a token with every sam-node a member already:\n%s", out)
	}

	// The mesh, in fleet.json: the control plane and the router here,
	// a sam-node on each host, in the host's namespace, at the host's
	// address, its files where the layout says.
	if st.Mesh == nil || len(st.Mesh.Nodes) != 2 || st.Mesh.ControlPlane.PID <= 0 || len(st.Mesh.Routers) != 1 || st.Mesh.Routers[0].PID <= 0 || len(st.Mesh.Routers[0].Addrs) != 2 {
		t.Fatalf("fleet.json's mesh: %+v", st.Mesh)
	}
	for i, mn := range st.Mesh.Nodes {
		h := hosts[i]
		if mn.Host != "root@"+h.addr || mn.Name != st.Nodes[i].Name || mn.DataDir != filepath.Join(remoteDir, mn.Name+"-mesh") {
			t.Errorf("sam-node %d in fleet.json: %+v", i, mn)
		}
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", mn.PID))
		for _, want := range []string{"--mesh-dir\x00" + mn.DataDir, "--p2p-listen\x00/ip4/" + h.addr + "/tcp/7701",
			// Each dials the router where its host sees this machine.
			fmt.Sprintf("--router\x00/ip4/10.191.%d.1/tcp/7700/p2p/", i+1)} {
			if !strings.Contains(string(cl), want) {
				t.Errorf("sam-node PID %d on %s: %q lacks %q", mn.PID, h.addr, cl, want)
			}
		}
		if strings.Contains(string(cl), "samb_") {
			t.Errorf("a token on sam-node's command line: %q", cl)
		}
		if got, want := netnsInode(fmt.Sprintf("/proc/%d/ns/net", mn.PID)), netnsInode("/run/netns/"+h.ns); got == 0 || got != want {
			t.Errorf("sam-node %s is not in netns %s", mn.Name, h.ns)
		}
		// Its node's boundaries take their policy from it.
		ncl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.Nodes[i].PID))
		if !strings.Contains(string(ncl), "--sam-node\x00unix://"+mn.Socket+"\x00--policy\x00sam-node") {
			t.Errorf("node %s's command line: %q", st.Nodes[i].Name, ncl)
		}
		if fileSHA(t, filepath.Join(h.dir, "bin", "sam-node")) != fileSHA(t, samNodeBin) {
			t.Errorf("the sam-node on %s is not this machine's", h.addr)
		}
		cfgPath := filepath.Join(h.dir, mn.Name+"-sam-node.yaml")
		if fi, err := os.Stat(cfgPath); err != nil || fi.Mode().Perm() != 0o600 || fileSHA(t, cfgPath) != fileSHA(t, meshConfig) {
			t.Errorf("the sam-node config on %s: %v %v", h.addr, fi, err)
		}
	}
	operator := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(samControlPlaneBin, append([]string{"--data-dir", st.Mesh.ControlPlane.DataDir, "--api", st.Mesh.API}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("sam-control-plane %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	members := operator("members")
	for _, m := range []string{"router", "10-191-1-2", "10-191-2-2"} {
		if !strings.Contains(members, m) {
			t.Errorf("the control plane's members lack %s:\n%s", m, members)
		}
	}

	c, err := client.ForDataDir(st.API, st.Master.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	var nodes api.List[api.NodeStatus]
	if err := c.Do(ctxT(t), "GET", "/v1/nodes", nil, &nodes); err != nil {
		t.Fatal(err)
	}
	byName := map[string]api.NodeStatus{}
	for _, n := range nodes.Items {
		byName[n.Name] = n
	}
	for _, n := range st.Nodes {
		if got := byName[n.Name]; got.State != "ready" || got.Address != n.Address {
			t.Errorf("GET /v1/nodes: %s is %+v", n.Name, got)
		}
	}
	if len(nodes.Items) != 2 {
		t.Errorf("GET /v1/nodes: %+v", nodes.Items)
	}
	sbs, err := c.Sandboxes(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, sb := range sbs {
		on[sb.Node] = true
	}
	if !on["10-191-1-2"] || !on["10-191-2-2"] {
		t.Errorf("the verification's sandboxes are on %v", on)
	}
	// Commands reach a sandbox on each host: its node found the envd
	// fleet up copied beside its sandstormd.
	cliEnv := []string{"SANDSTORM_API=" + st.API, "SANDSTORM_DATA_DIR=" + st.Master.DataDir, "SANDSTORM_TOKEN="}
	done := map[string]bool{}
	for _, sb := range sbs {
		if !done[sb.Node] {
			done[sb.Node] = true
			cli(t, cliEnv, "sandbox", "exec", sb.ID, "--", py, "-c", "print('on', __import__('socket').gethostname())").ok(t, "a command in a sandbox on host node "+sb.Node, `^on `)
		}
	}

	// An agent on each host reaches the mesh through its boundary, with
	// the control plane's policy: echo granted, get-sum not.
	tpl := agentTemplate("agent")
	tpl.Principal = "agent-a"
	if _, err := c.CreateTemplate(ctxT(t), tpl); err != nil {
		t.Fatal(err)
	}
	agents := map[string]api.Sandbox{}
	for i := 0; len(agents) < 2 && i < 4; i++ {
		sb, err := c.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "agent", Name: fmt.Sprintf("agent-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := agents[sb.Node]; !ok {
			agents[sb.Node] = sb
		}
	}
	if len(agents) != 2 {
		t.Fatalf("4 agent sandboxes went to %d host(s)", len(agents))
	}
	run := func(sb api.Sandbox) agentResult {
		return agentRun(t, sb, url.Values{"tool": {"everything__echo"}, "tool_args": {`{"message":"hi from ` + sb.Node + `"}`}, "denied_tool": {"everything__get-sum"}})
	}
	for node, sb := range agents {
		var r agentResult
		testenv.WaitFor(t, 60*time.Second, "the agent on "+node+" reaches the mesh with the control plane's policy", func() bool {
			r = run(sb)
			return strings.Contains(r.ToolResult, "hi from "+node)
		})
		if strings.Join(r.Tools, ",") != "everything__echo" || !r.DeniedToolIs {
			t.Errorf("the agent on %s: tools %q, denied tool %q (error %v)", node, r.Tools, r.DeniedTool, r.DeniedToolIs)
		}
		// The boundary's own decision: a mesh service's name resolves
		// only if the policy grants something of it.
		if p := probeFrom(t, sb, "kind", "dns", "name", "everything.mcp.sam.alt"); len(p.Addrs) == 0 {
			t.Errorf("the boundary on %s does not resolve a granted server's name: %+v", node, p)
		}
	}
	// A policy change on the control plane reaches both hosts: their
	// sam-nodes list no tool, and their boundaries no longer resolve the
	// server's name.
	operator("policy", "set", writeTemp(t, "policy-2.yaml", "roles:\n  - {name: a, services: [\"inference://none\"]}\nbindings:\n  - {principal: agent-a, roles: [a]}\n"))
	changed := time.Now()
	for node, sb := range agents {
		testenv.WaitFor(t, 30*time.Second, "the policy change reaches "+node, func() bool {
			r := run(sb)
			p := probeFrom(t, sb, "kind", "dns", "name", "everything.mcp.sam.alt")
			return len(r.Tools) == 0 && !strings.Contains(r.ToolResult, "hi from") && len(p.Addrs) == 0
		})
	}
	t.Logf("the policy change reached both hosts' boundaries and sam-nodes %v after it was set", time.Since(changed).Round(time.Millisecond))
	if sbs, err = c.Sandboxes(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// fleet down reaches the hosts as fleet up did (fleet.json), with no
	// ssh flags given again. Without --purge the nodes stop and their
	// files stay; up again, each is back with the master that kept it.
	out, code = fleet("down", "--root", root)
	if code != 0 {
		t.Fatalf("fleet down: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, fmt.Sprintf("deleted %d of %d sandbox(es)", len(sbs), len(sbs))) {
		t.Errorf("fleet down did not delete the %d sandboxes:\n%s", len(sbs), out)
	}
	meshGone(t, st)
	for i, n := range st.Nodes {
		if !strings.Contains(out, fmt.Sprintf("node %s on %s: stopped PID %d", n.Name, n.Host, n.PID)) || strings.Contains(out, "removed") {
			t.Errorf("fleet down without --purge did not say it stopped %s (and only that):\n%s", n.Name, out)
		}
		if mn := st.Mesh.Nodes[i]; !strings.Contains(out, fmt.Sprintf("sam-node of %s on %s: stopped PID %d", mn.Name, mn.Host, mn.PID)) {
			t.Errorf("fleet down did not say it stopped %s's sam-node:\n%s", n.Name, out)
		}
		if !exists(filepath.Join(hosts[i].dir, n.Name+"-mesh", "credential.json")) || exists(filepath.Join(hosts[i].dir, n.Name+"-sam-node.pid")) {
			t.Errorf("after fleet down without --purge on %s: the sam-node's member kept? its PID file gone?", hosts[i].addr)
		}
		if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n.PID)); err == nil && strings.Contains(string(cl), n.DataDir) {
			t.Errorf("node %s's PID %d still runs", n.Name, n.PID)
		}
		if d := filepath.Join(hosts[i].dir, n.Name); !exists(filepath.Join(d, "pki", pki.PairingCodeFile)) || exists(d+".pid") || !exists(d+".log") {
			t.Errorf("after fleet down without --purge on %s: data dir, log kept? PID file gone?", hosts[i].addr)
		}
	}
	out, code = fleet(upArgs...)
	if code != 0 {
		t.Fatalf("fleet up again: exit %d\n%s", code, out)
	}
	t.Logf("fleet up again:\n%s", out)
	for _, want := range []string{"node 10-191-1-2: paired already", "node 10-191-2-2: paired already", "on 10-191-1-2 answers", "on 10-191-2-2 answers",
		"sam-node of 10-191-2-2 on root@10.191.2.2: a member of the mesh"} {
		if !strings.Contains(out, want) {
			t.Errorf("fleet up again did not say %q", want)
		}
	}
	st = readState()
	if sbs, err = c.Sandboxes(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	out, code = fleet("down", "--root", root, "--purge")
	if code != 0 {
		t.Fatalf("fleet down: exit %d\n%s", code, out)
	}
	t.Logf("fleet down --purge:\n%s", out)
	for _, want := range []string{fmt.Sprintf("deleted %d of %d sandbox(es)", len(sbs), len(sbs)),
		fmt.Sprintf("node 10-191-1-2 on root@10.191.1.2: stopped PID %d", st.Nodes[0].PID),
		fmt.Sprintf("node 10-191-2-2 on root@10.191.2.2: stopped PID %d", st.Nodes[1].PID),
		fmt.Sprintf("sam-node of 10-191-1-2 on root@10.191.1.2: stopped PID %d", st.Mesh.Nodes[0].PID),
		"sam-node of 10-191-2-2 on root@10.191.2.2: removed",
		"fleet is down"} {
		if !strings.Contains(out, want) {
			t.Errorf("fleet down did not say %q", want)
		}
	}
	for _, n := range st.Nodes {
		if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n.PID)); err == nil && strings.Contains(string(cl), n.DataDir) {
			t.Errorf("node %s's PID %d still runs", n.Name, n.PID)
		}
	}
	meshGone(t, st)
	if ps := processesMentioning(remoteDir + "/"); len(ps) > 0 {
		t.Errorf("processes left on the hosts: %v", ps)
	}
	if ps := processesMentioning(root + "/"); len(ps) > 0 {
		t.Errorf("processes left here: %v", ps)
	}
	for _, h := range hosts {
		if ents, err := os.ReadDir(h.dir); err != nil || len(ents) > 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("left on %s after --purge: %v %v", h.addr, names, err)
		}
	}
	if exists(filepath.Join(root, "fleet.json")) || exists(st.Master.DataDir) {
		t.Error("fleet.json or the master's data dir left after --purge")
	}
	// A sandbox's netns would be a file here under /run/netns (the name
	// is the node's, the mount its mount namespace's).
	for _, sb := range sbs {
		if exists(netnsPath(sb.ID)) {
			t.Errorf("netns of sandbox %s left", sb.Name)
		}
	}
}

// meshGone: none of the mesh's processes fleet.json names still runs (by
// PID and the dir on its command line, so a reused PID is not taken for
// one): the control plane and the router here, the sam-nodes on the
// hosts.
func meshGone(t *testing.T, st fleetup.State) {
	t.Helper()
	procs := []fleetup.Proc{st.Mesh.ControlPlane, st.Mesh.Routers[0].Proc}
	for _, mn := range st.Mesh.Nodes {
		procs = append(procs, mn.Proc)
	}
	for _, p := range procs {
		if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID)); err == nil && strings.Contains(string(cl), p.DataDir) {
			t.Errorf("after fleet down, PID %d (%s) still runs", p.PID, p.DataDir)
		}
	}
}
