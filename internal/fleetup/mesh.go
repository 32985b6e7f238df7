package fleetup

// A fleet is a mesh (issue 17, item 5): fleet up --nodes also brings up
// the mesh's control plane and a router beside the master, and a sam-node
// on every node, enrolled with a bootstrap token fleet up makes and spends
// itself; every node's sandstormd takes its boundaries' policy from its
// sam-node (--policy sam-node), which has the mesh's one policy from the
// control plane. So there is one policy for the fleet, set with
// sam-control-plane policy set (or fleet up --mesh-policy), and no file to
// copy to any node.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// MeshState is the mesh fleet up started (fleet.json's "mesh").
type MeshState struct {
	// API is the control plane's URL; its CA is <ControlPlane.DataDir>/pki/ca.pem.
	API          string `json:"api"`
	ControlPlane Proc   `json:"control_plane"`
	Router       Proc   `json:"router"`
	// RouterAddr is the router's multiaddr with its peer ID.
	RouterAddr string `json:"router_addr"`
	// Nodes are the sam-nodes, one per node, in the node's namespace;
	// each Proc's DataDir is its mesh dir.
	Nodes []MeshNode `json:"nodes"`
}

// MeshNode is one node's sam-node.
type MeshNode struct {
	Proc
	Name   string `json:"name"`
	Netns  string `json:"netns"`
	Socket string `json:"socket"` // its agent listener, which the node's sandstormd uses
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
)

// meshSocket is node k's sam-node agent socket.
func meshSocket(cfg Config, k int) string {
	return filepath.Join(cfg.Root, fmt.Sprintf("node-%d-mesh", k), "sam-node.sock")
}

// meshNodeArgs are what node k's sandstormd is given for the mesh.
func meshNodeArgs(cfg Config, k int) []string {
	return []string{"--sam-node", "unix://" + meshSocket(cfg, k), "--policy", "sam-node"}
}

// startMesh starts the control plane and the router, enrols them and a
// sam-node per node, and starts those; st.Mesh records each as it starts.
func startMesh(ctx context.Context, cfg Config, st *State, say func(string, ...any)) error {
	bins, err := meshBinaries(cfg.Bin)
	if err != nil {
		return err
	}
	host := meshHost()
	m := &MeshState{API: fmt.Sprintf("https://%s:%d", host, controlPlanePort)}
	st.Mesh = m
	m.ControlPlane = Proc{DataDir: filepath.Join(cfg.Root, "control-plane"), Log: filepath.Join(cfg.Root, "control-plane.log")}
	if m.ControlPlane.PID, err = spawn(bins.controlPlane, m.ControlPlane.Log, nil, "serve",
		"--data-dir", m.ControlPlane.DataDir, "--listen", fmt.Sprintf("%s:%d", host, controlPlanePort)); err != nil {
		return err
	}
	save(cfg.Root, *st)
	operator := func(args ...string) ([]byte, error) {
		c := exec.CommandContext(ctx, bins.controlPlane, append([]string{"--data-dir", m.ControlPlane.DataDir, "--api", m.API}, args...)...)
		out, err := c.CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("sam-control-plane %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return out, nil
	}
	if err := waitFor(ctx, time.Minute, func() bool { _, err := operator("members"); return err == nil }); err != nil {
		return fmt.Errorf("the control plane did not answer within a minute (log %s): %w", m.ControlPlane.Log, err)
	}
	say("control plane: PID %d, API %s, log %s", m.ControlPlane.PID, m.API, m.ControlPlane.Log)
	if cfg.MeshPolicy != "" {
		if _, err := operator("policy", "set", cfg.MeshPolicy); err != nil {
			return err
		}
		say("mesh policy: %s", cfg.MeshPolicy)
	}
	// One token for exactly the members fleet up enrols, spent by them
	// now: a token left over would be a way in.
	out, err := operator("token", "create", "--max-uses", fmt.Sprint(len(st.Nodes)+1), "--ttl", "10m", "--json")
	if err != nil {
		return err
	}
	var tok struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(out, &tok); err != nil || tok.Token == "" {
		return fmt.Errorf("token create --json: %q", out)
	}
	ca := filepath.Join(m.ControlPlane.DataDir, "pki", "ca.pem")
	join := func(prefix []string, bin, name, dir string) error {
		args := append(prefix, bin, "join", "--control-plane", m.API, "--ca", ca, "--name", name, "--token", tok.Token, "--mesh-dir", dir)
		c := exec.CommandContext(ctx, args[0], args[1:]...)
		if out, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("%s join %s: %v: %s", filepath.Base(bin), name, err, strings.TrimSpace(string(out)))
		}
		return nil
	}

	m.Router = Proc{DataDir: filepath.Join(cfg.Root, "router-mesh"), Log: filepath.Join(cfg.Root, "router.log")}
	if err := join(nil, bins.router, "router", m.Router.DataDir); err != nil {
		return err
	}
	listen := fmt.Sprintf("/ip4/%s/tcp/%d", host, routerPort)
	if m.Router.PID, err = spawn(bins.router, m.Router.Log, nil, "--mesh-dir", m.Router.DataDir, "--listen", listen); err != nil {
		return err
	}
	save(cfg.Root, *st)
	if err := waitFor(ctx, 30*time.Second, func() bool { m.RouterAddr = fieldWith(m.Router.Log, listen+"/p2p/"); return m.RouterAddr != "" }); err != nil {
		return fmt.Errorf("the router did not print its address within 30 s (log %s): %w", m.Router.Log, err)
	}
	say("router: PID %d, %s, log %s", m.Router.PID, m.RouterAddr, m.Router.Log)

	for k, n := range st.Nodes {
		_, addr := linkNet(k + 1)
		mn := MeshNode{Name: n.Name, Netns: n.Netns, Socket: meshSocket(cfg, k+1),
			Proc: Proc{DataDir: filepath.Join(cfg.Root, n.Name+"-mesh"), Log: filepath.Join(cfg.Root, n.Name+"-sam-node.log")}}
		// nsenter --net, as for the node: its sam-node is a member at the
		// node's own address.
		ns := []string{"nsenter", "--net=/var/run/netns/" + n.Netns, "--"}
		if err := join(ns, bins.node, n.Name, mn.DataDir); err != nil {
			return err
		}
		args := append(ns[1:], bins.node, "--mesh-dir", mn.DataDir, "--router", m.RouterAddr,
			"--p2p-listen", fmt.Sprintf("/ip4/%s/tcp/%d", addr, memberPort),
			"--listen", "unix://"+mn.Socket, "--admin-addr", "127.0.0.1:9601")
		if cfg.MeshConfig != "" {
			args = append(args, "--config", cfg.MeshConfig)
		}
		if mn.PID, err = spawn("nsenter", mn.Log, nil, args...); err != nil {
			return err
		}
		m.Nodes = append(m.Nodes, mn)
		save(cfg.Root, *st)
	}
	for _, mn := range m.Nodes {
		if err := waitFor(ctx, time.Minute, func() bool { return fileHas(mn.Log, "joined the mesh") }); err != nil {
			return fmt.Errorf("%s's sam-node did not join the mesh within a minute (log %s): %w", mn.Name, mn.Log, err)
		}
		say("sam-node on %s: PID %d, a member of the mesh, log %s", mn.Name, mn.PID, mn.Log)
	}
	return nil
}

// meshProcs are the mesh's processes, the sam-nodes first.
func meshProcs(m *MeshState) []Proc {
	if m == nil {
		return nil
	}
	var out []Proc
	for _, n := range m.Nodes {
		out = append(out, n.Proc)
	}
	return append(out, m.Router, m.ControlPlane)
}

// meshDirs are the mesh's data dirs (for --purge).
func meshDirs(m *MeshState) []string {
	var out []string
	for _, p := range meshProcs(m) {
		out = append(out, p.DataDir)
	}
	return out
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

func fileHas(path, s string) bool {
	b, _ := os.ReadFile(path)
	return strings.Contains(string(b), s)
}

// fieldWith is the first whitespace-separated word of the file that
// contains s.
func fieldWith(path, s string) string {
	b, _ := os.ReadFile(path)
	for _, w := range strings.Fields(string(b)) {
		if strings.Contains(w, s) {
			return w
		}
	}
	return ""
}
