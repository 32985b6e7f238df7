package fleetup

// A fleet is a mesh (issue 17, item 5): fleet up (--nodes and --hosts)
// also brings up the mesh's control plane and a router beside the master,
// and a sam-node on every node, enrolled with a bootstrap token fleet up
// makes and spends itself; every node's sandstormd takes its boundaries'
// policy from its sam-node (--policy sam-node), which has the mesh's one
// policy from the control plane. So there is one policy for the fleet,
// set with sam-control-plane policy set (or fleet up --mesh-policy), and
// no file to copy to any node. Over --hosts the sam-nodes run on the
// hosts (remote.go) and reach the control plane and the router at the
// address each host sees this machine at (MeshAddresses).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/internal/pki"
	"sandstorm/internal/sam/membership"
)

// MeshState is the mesh fleet up started (fleet.json's "mesh").
type MeshState struct {
	// API is the control plane's URL; its CA is <ControlPlane.DataDir>/pki/ca.pem.
	API          string `json:"api"`
	ControlPlane Proc   `json:"control_plane"`
	// Routers are the routers (--routers), each a process of its own on a
	// port of its own: every member joins every one, so one can go.
	Routers []MeshRouter `json:"routers"`
	// Router is the one router of a fleet.json written before there
	// could be several; fleet down still stops it.
	Router Proc `json:"router,omitzero"`
	// Nodes are the sam-nodes, one per node, in the node's namespace or
	// on its host; each Proc's DataDir is its mesh dir.
	Nodes []MeshNode `json:"nodes"`
}

// MeshRouter is one router.
type MeshRouter struct {
	Proc
	Name string `json:"name"`
	// Addr is its multiaddr with its peer ID; Addrs are all of them, one
	// per address it listens on (over --hosts, each host dials the one at
	// the address it reaches this machine at).
	Addr  string   `json:"addr"`
	Addrs []string `json:"addrs,omitempty"`
	port  int
	peer  string
}

// MeshNode is one node's sam-node.
type MeshNode struct {
	Proc
	Name   string `json:"name"`
	Netns  string `json:"netns,omitempty"`
	Socket string `json:"socket"` // its agent listener, which the node's sandstormd uses
	// On a host over ssh (Host): its Proc's PID and paths are the host's.
	Host    string `json:"host,omitempty"`
	PIDFile string `json:"pid_file,omitempty"`
	Sudo    bool   `json:"sudo,omitempty"`
}

// meshBins are the mesh's binaries, beside sandstormd (make build puts
// them there).
type meshBins struct{ controlPlane, router, node string }

func meshBinaries(sandstormd string) (meshBins, error) {
	dir := filepath.Dir(sandstormd)
	b := meshBins{filepath.Join(dir, "sam-control-plane"), filepath.Join(dir, "sam-router"), filepath.Join(dir, "sam-node")}
	for _, p := range []string{b.controlPlane, b.router, b.node} {
		if _, err := os.Stat(p); err != nil {
			return b, fmt.Errorf("the mesh needs %s beside sandstormd (make build puts it there), or pass --no-mesh: %w", filepath.Base(p), err)
		}
	}
	return b, nil
}

// The mesh's addresses: the control plane and the router listen on the
// master's end of node 1's link. Every node reaches it through its own
// link (its default route is the master's namespace, and an address of
// the master's is delivered there whichever link a packet came in on), so
// one address, and one name in the control plane's certificate, serves
// them all. Members reach each other directly where this machine
// forwards between the links, and through the router's relay where not.
func meshHost() string { h, _ := linkNet(1); return h }

const (
	controlPlanePort = 7600
	routerPort       = 7700
	memberPort       = 7701
	// meshAdminAddr is each sam-node's health and metrics listener, on
	// its own machine's (or namespace's) loopback, where no sandbox
	// reaches.
	meshAdminAddr = "127.0.0.1:9601"
)

// meshTokenTTL is how long a bootstrap token fleet up makes is good
// for: it is made just before the joins that spend it (each within one
// ssh session, its HTTP call bounded at 30 s), and a token left with
// uses after a failure must not stay a way in for long.
const meshTokenTTL = 2 * time.Minute

// meshSocket is node k's sam-node agent socket.
func meshSocket(cfg Config, k int) string {
	return filepath.Join(cfg.Root, fmt.Sprintf("node-%d-mesh", k), "sam-node.sock")
}

// meshNodeArgs are what node k's sandstormd is given for the mesh.
func meshNodeArgs(cfg Config, k int) []string {
	return []string{"--sam-node", "unix://" + meshSocket(cfg, k), "--policy", "sam-node"}
}

// meshCP is the control plane fleet up started, and how to use it.
type meshCP struct {
	bins  meshBins
	m     *MeshState
	ca    []byte // its CA (PEM), which members check its HTTPS against
	caSum string // its sha256, as inspectScript reports a host's copy
}

// operator runs a sam-control-plane operator's command against it.
func (c *meshCP) operator(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.bins.controlPlane, append([]string{"--data-dir", c.m.ControlPlane.DataDir, "--api", c.m.API}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("sam-control-plane %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// token makes a bootstrap token for exactly uses enrolments, good for
// meshTokenTTL: a token with uses to spare would be a way in.
func (c *meshCP) token(ctx context.Context, uses int) (string, error) {
	out, err := c.operator(ctx, "token", "create", "--max-uses", fmt.Sprint(uses), "--ttl", meshTokenTTL.String(), "--json")
	if err != nil {
		return "", err
	}
	var tok struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(out, &tok); err != nil || tok.Token == "" {
		return "", errors.New("sam-control-plane token create --json printed no token")
	}
	return tok.Token, nil
}

// meshURL is the control plane's URL at a, one of the addresses it
// listens on.
func meshURL(a netip.Addr) string { return "https://" + hostPort(a, controlPlanePort) }

// routersFor are the routers' multiaddrs at a, one of the addresses they
// listen on: a sam-node's --router flags.
func (c *meshCP) routersFor(a netip.Addr) []string {
	var out []string
	for _, r := range c.m.Routers {
		out = append(out, "--router", tcpMultiaddr(a, r.port)+"/p2p/"+r.peer)
	}
	return out
}

// maxRouters is the most routers fleet up starts: each member holds a
// connection, a relay slot and its records on every one.
const maxRouters = 5

// routerPorts are the ports of n routers: routerPort, then 10 apart.
func routerPorts(n int) []int {
	var out []int
	for i := range n {
		out = append(out, routerPort+10*i)
	}
	return out
}

// startControlPlane starts the control plane listening on addrs (port
// controlPlanePort), its certificate naming each, waits until it
// answers and sets --mesh-policy on it; st.Mesh records it.
func startControlPlane(ctx context.Context, cfg Config, st *State, addrs []netip.Addr, say func(string, ...any)) (*meshCP, error) {
	bins, err := meshBinaries(cfg.Bin)
	if err != nil {
		return nil, err
	}
	m := &MeshState{API: meshURL(addrs[0])}
	st.Mesh = m
	c := &meshCP{bins: bins, m: m}
	m.ControlPlane = Proc{DataDir: filepath.Join(cfg.Root, "control-plane"), Log: filepath.Join(cfg.Root, "control-plane.log")}
	args := []string{"serve", "--data-dir", m.ControlPlane.DataDir}
	var apis []string
	for _, a := range addrs {
		args = append(args, "--listen", hostPort(a, controlPlanePort))
		apis = append(apis, meshURL(a))
	}
	if m.ControlPlane.PID, err = spawn(bins.controlPlane, m.ControlPlane.Log, nil, args...); err != nil {
		return nil, err
	}
	save(cfg.Root, *st)
	if err := waitFor(ctx, time.Minute, func() bool { _, err := c.operator(ctx, "members"); return err == nil }); err != nil {
		return nil, fmt.Errorf("the control plane did not answer within a minute (log %s): %w", m.ControlPlane.Log, err)
	}
	say("control plane: PID %d, API %s, log %s", m.ControlPlane.PID, strings.Join(apis, " "), m.ControlPlane.Log)
	if c.ca, err = os.ReadFile(filepath.Join(m.ControlPlane.DataDir, "pki", pki.CAFile)); err != nil {
		return nil, fmt.Errorf("the control plane's CA: %w", err)
	}
	sum := sha256.Sum256(c.ca)
	c.caSum = hex.EncodeToString(sum[:])
	if cfg.MeshPolicy != "" {
		if _, err := c.operator(ctx, "policy", "set", cfg.MeshPolicy); err != nil {
			return nil, err
		}
		say("mesh policy: %s", cfg.MeshPolicy)
	}
	return c, nil
}

// memberOf reports whether dir holds a member of this control plane
// already (a fleet down without --purge keeps it; it needs no token
// then). A member of another control plane is an error: it could never
// refresh its credential here.
func (c *meshCP) memberOf(dir string) (bool, error) {
	if _, err := os.Stat(filepath.Join(dir, membership.CredentialFile)); err != nil {
		return false, nil
	}
	if ca, err := os.ReadFile(filepath.Join(dir, membership.CAFile)); err == nil && bytes.Equal(ca, c.ca) {
		return true, nil
	}
	return false, fmt.Errorf("%s holds a member of another mesh's control plane (an earlier fleet's?): remove it, or take that fleet down with --purge", dir)
}

// joinLocal enrols the member in dir on this machine (in a namespace with
// prefix), the token on sam-node join's stdin, never on its command line.
func (c *meshCP) joinLocal(ctx context.Context, prefix []string, bin, name, dir, token string) error {
	args := append(append([]string{}, prefix...), bin, "join", "--control-plane", c.m.API, "--ca", filepath.Join(c.m.ControlPlane.DataDir, "pki", pki.CAFile),
		"--name", name, "--token-file", "-", "--mesh-dir", dir)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(token + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s join %s: %v: %s", filepath.Base(bin), name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startRouters enrols cfg.Routers routers (each with a token of its own,
// for one use, unless it is a member already) and starts them listening
// on addrs, each on its own port.
func startRouters(ctx context.Context, cfg Config, st *State, c *meshCP, addrs []netip.Addr, say func(string, ...any)) error {
	for i, port := range routerPorts(max(cfg.Routers, 1)) {
		// The first keeps the names of the one router fleet up started
		// before there could be several (a root brought up again).
		name, dir, log := "router", "router-mesh", "router.log"
		if i > 0 {
			name, dir, log = fmt.Sprintf("router-%d", i+1), fmt.Sprintf("router-%d-mesh", i+1), fmt.Sprintf("router-%d.log", i+1)
		}
		r := MeshRouter{Name: name, port: port, Proc: Proc{DataDir: filepath.Join(cfg.Root, dir), Log: filepath.Join(cfg.Root, log)}}
		if err := startRouter(ctx, cfg, st, c, &r, addrs); err != nil {
			return err
		}
		say("%s: PID %d, %s, log %s", r.Name, r.PID, strings.Join(r.Addrs, " "), r.Log)
	}
	return nil
}

func startRouter(ctx context.Context, cfg Config, st *State, c *meshCP, r *MeshRouter, addrs []netip.Addr) error {
	member, err := c.memberOf(r.DataDir)
	if err != nil {
		return err
	}
	if !member {
		tok, err := c.token(ctx, 1)
		if err != nil {
			return err
		}
		if err := c.joinLocal(ctx, nil, c.bins.router, r.Name, r.DataDir, tok); err != nil {
			return err
		}
	}
	args := []string{"--mesh-dir", r.DataDir}
	for _, a := range addrs {
		args = append(args, "--listen", tcpMultiaddr(a, r.port))
	}
	// The router prints its addresses once it listens: from where its
	// log ends now (a root brought up again appends to it).
	off := fileSize(r.Log)
	if r.PID, err = spawn(c.bins.router, r.Log, nil, args...); err != nil {
		return err
	}
	c.m.Routers = append(c.m.Routers, *r)
	save(cfg.Root, *st)
	first := tcpMultiaddr(addrs[0], r.port) + "/p2p/"
	if err := waitFor(ctx, 30*time.Second, func() bool { r.Addr = fieldWithAfter(r.Log, off, first); return r.Addr != "" }); err != nil {
		return fmt.Errorf("%s did not print its address within 30 s (log %s): %w", r.Name, r.Log, err)
	}
	r.peer = strings.TrimPrefix(r.Addr, first)
	r.Addrs = nil
	for _, a := range addrs {
		r.Addrs = append(r.Addrs, tcpMultiaddr(a, r.port)+"/p2p/"+r.peer)
	}
	c.m.Routers[len(c.m.Routers)-1] = *r
	save(cfg.Root, *st)
	return nil
}

// startMesh brings the mesh up for a fleet here (--nodes): the control
// plane and the router on the master's end of node 1's link, and a
// sam-node per node in its namespace, enrolled and started; st.Mesh
// records each as it starts.
func startMesh(ctx context.Context, cfg Config, st *State, say func(string, ...any)) error {
	host := netip.MustParseAddr(meshHost())
	addrs := []netip.Addr{host}
	c, err := startControlPlane(ctx, cfg, st, addrs, say)
	if err != nil {
		return err
	}
	if err := startRouters(ctx, cfg, st, c, addrs, say); err != nil {
		return err
	}
	m := c.m
	type pending struct {
		mn   MeshNode
		join bool
	}
	var ps []pending
	joins := 0
	for k, n := range st.Nodes {
		mn := MeshNode{Name: n.Name, Netns: n.Netns, Socket: meshSocket(cfg, k+1),
			Proc: Proc{DataDir: filepath.Join(cfg.Root, n.Name+"-mesh"), Log: filepath.Join(cfg.Root, n.Name+"-sam-node.log")}}
		member, err := c.memberOf(mn.DataDir)
		if err != nil {
			return err
		}
		if !member {
			joins++
		}
		ps = append(ps, pending{mn, !member})
	}
	// One token for exactly the members fleet up enrols, spent by them
	// now.
	var tok string
	if joins > 0 {
		if tok, err = c.token(ctx, joins); err != nil {
			return err
		}
	}
	offsets := make([]int64, len(ps))
	for k, p := range ps {
		mn := p.mn
		_, addr := linkNet(k + 1)
		// nsenter --net, as for the node: its sam-node is a member at the
		// node's own address.
		ns := []string{"nsenter", "--net=/var/run/netns/" + mn.Netns, "--"}
		if p.join {
			if err := c.joinLocal(ctx, ns, c.bins.node, mn.Name, mn.DataDir, tok); err != nil {
				return err
			}
		}
		args := append(append(ns[1:], c.bins.node, "--mesh-dir", mn.DataDir), c.routersFor(host)...)
		args = append(args, "--p2p-listen", fmt.Sprintf("/ip4/%s/tcp/%d", addr, memberPort),
			"--listen", "unix://"+mn.Socket, "--admin-addr", meshAdminAddr)
		if cfg.MeshConfig != "" {
			args = append(args, "--config", cfg.MeshConfig)
		}
		offsets[k] = fileSize(mn.Log)
		if mn.PID, err = spawn("nsenter", mn.Log, nil, args...); err != nil {
			return err
		}
		m.Nodes = append(m.Nodes, mn)
		save(cfg.Root, *st)
	}
	for k, mn := range m.Nodes {
		if err := waitFor(ctx, time.Minute, func() bool { return fileHasAfter(mn.Log, offsets[k], "joined the mesh") }); err != nil {
			return fmt.Errorf("%s's sam-node did not join the mesh within a minute (log %s): %w", mn.Name, mn.Log, err)
		}
		say("sam-node on %s: PID %d, a member of the mesh, log %s", mn.Name, mn.PID, mn.Log)
	}
	return nil
}

// meshProcs are the mesh's processes on this machine, the sam-nodes
// first (those on hosts are stopped over ssh: stopRemote).
func meshProcs(m *MeshState) []Proc {
	if m == nil {
		return nil
	}
	var out []Proc
	for _, n := range m.Nodes {
		if n.Host == "" {
			out = append(out, n.Proc)
		}
	}
	for _, r := range m.Routers {
		out = append(out, r.Proc)
	}
	if m.Router.PID != 0 {
		out = append(out, m.Router)
	}
	return append(out, m.ControlPlane)
}

// waitFor polls ok every 100 ms until it holds, ctx ends or d passes.
func waitFor(ctx context.Context, d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %v", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func fileSize(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

// after is the file's content from offset on: what a process started
// after offset was taken wrote to a log it appends to.
func after(path string, offset int64) string {
	b, _ := os.ReadFile(path)
	if offset > int64(len(b)) {
		return ""
	}
	return string(b[offset:])
}

func fileHasAfter(path string, offset int64, s string) bool {
	return strings.Contains(after(path, offset), s)
}

// fieldWithAfter is the first whitespace-separated word of the file,
// from offset on, that contains s.
func fieldWithAfter(path string, offset int64, s string) string {
	for _, w := range strings.Fields(after(path, offset)) {
		if strings.Contains(w, s) {
			return w
		}
	}
	return ""
}
