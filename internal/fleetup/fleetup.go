// Package fleetup brings a whole fleet up on this machine and down again
// (the seed's scripts/fleet.sh up|seed|verify, as sandstormd fleet up and
// fleet down): a master, and N nodes each in a network namespace of its
// own — its own address, nftables table, routes and ports — joined to the
// master's namespace by a veth, paired, seeded with a template and checked
// by one sandbox each. What it made is written to <root>/fleet.json, which
// fleet down reads to take exactly that down again, by PID and by name.
package fleetup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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
	// NodeArgs are added to every node's serve flags.
	NodeArgs []string
	Out      io.Writer // progress
}

// State is what fleet up made (<root>/fleet.json).
type State struct {
	API    string      `json:"api"`
	Master Proc        `json:"master"`
	Nodes  []NodeState `json:"nodes"`
}

// Proc is a process fleet up started.
type Proc struct {
	PID     int    `json:"pid"`
	DataDir string `json:"data_dir"`
	Log     string `json:"log"`
}

// NodeState is one node of the fleet.
type NodeState struct {
	Proc
	Name    string `json:"name"`
	Netns   string `json:"netns"`
	HostIf  string `json:"host_if"`
	Address string `json:"address"` // its --node-listen
}

// Addresses: node k's link is 10.186.k.0/24 (the master's side .1, the
// node's .2); its sandboxes' pool is 10.(160+k).0.0/16.
func linkNet(k int) (host, node string) {
	return fmt.Sprintf("10.186.%d.1", k), fmt.Sprintf("10.186.%d.2", k)
}

const stateFile = "fleet.json"

// Up brings the fleet up. On failure it takes down what it made.
func Up(ctx context.Context, cfg Config) (st State, err error) {
	if cfg.Nodes < 1 || cfg.Nodes > 9 {
		return st, fmt.Errorf("--nodes %d: 1 to 9 on one machine", cfg.Nodes)
	}
	if _, err := os.Stat(filepath.Join(cfg.Root, stateFile)); err == nil {
		return st, fmt.Errorf("a fleet is already up under %s (see its %s); take it down first: sandstormd fleet down --root %s", cfg.Root, stateFile, cfg.Root)
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return st, err
	}
	say := func(f string, a ...any) { fmt.Fprintf(cfg.Out, f+"\n", a...) }
	defer func() {
		if err != nil {
			say("fleet up failed (%v); taking down what it made", err)
			down(st, io.Discard)
			os.Remove(filepath.Join(cfg.Root, stateFile))
		}
	}()
	st.API = "https://" + cfg.Listen
	master := Proc{DataDir: filepath.Join(cfg.Root, "master"), Log: filepath.Join(cfg.Root, "master.log")}
	if master.PID, err = spawn(cfg.Bin, master.Log, nil, "serve", "--master", "--data-dir", master.DataDir, "--listen", cfg.Listen); err != nil {
		return st, err
	}
	st.Master = master
	save(cfg.Root, st)
	say("master: PID %d, API %s, log %s", master.PID, st.API, master.Log)
	for k := 1; k <= cfg.Nodes; k++ {
		n, err := startNode(cfg, k)
		if n.Netns != "" {
			st.Nodes = append(st.Nodes, n)
			save(cfg.Root, st)
		}
		if err != nil {
			return st, err
		}
		say("node %s: PID %d in netns %s, listening on %s", n.Name, n.PID, n.Netns, n.Address)
	}
	c, err := waitMaster(ctx, st.API, master.DataDir)
	if err != nil {
		return st, err
	}
	for _, n := range st.Nodes {
		code, err := waitNode(ctx, n)
		if err != nil {
			return st, err
		}
		var ns api.NodeStatus
		if err := c.Do(ctx, "POST", "/v1/nodes", api.NodeRequest{Address: n.Address, PairingCode: code}, &ns); err != nil {
			return st, fmt.Errorf("pair %s: %w", n.Name, err)
		}
		say("paired %s: %d MiB available", n.Name, ns.MemAvailableMiB)
	}
	if cfg.Template != "" {
		if err := seed(ctx, cfg, st, c); err != nil {
			return st, err
		}
	}
	say("fleet is up: %d node(s). Stop it with: sandstormd fleet down --root %s", len(st.Nodes), cfg.Root)
	say("use it: SANDSTORM_API=%s SANDSTORM_DATA_DIR=%s sandstormd sandbox ls", st.API, master.DataDir)
	return st, nil
}

func startNode(cfg Config, k int) (NodeState, error) {
	host, addr := linkNet(k)
	n := NodeState{Name: fmt.Sprintf("node-%d", k), Netns: fmt.Sprintf("sf-%d", k), HostIf: fmt.Sprintf("sfh%d", k), Address: addr + ":7443",
		Proc: Proc{DataDir: filepath.Join(cfg.Root, fmt.Sprintf("node-%d", k)), Log: filepath.Join(cfg.Root, fmt.Sprintf("node-%d.log", k))}}
	for _, c := range [][]string{
		{"netns", "add", n.Netns},
		{"link", "add", n.HostIf, "type", "veth", "peer", "name", "eth0", "netns", n.Netns},
		{"addr", "add", host + "/24", "dev", n.HostIf},
		{"link", "set", n.HostIf, "up"},
		{"-n", n.Netns, "addr", "add", addr + "/24", "dev", "eth0"},
		{"-n", n.Netns, "link", "set", "eth0", "up"},
		{"-n", n.Netns, "link", "set", "lo", "up"},
		{"-n", n.Netns, "route", "add", "default", "via", host},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			return n, fmt.Errorf("ip %s: %v: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	args := append([]string{"--net=/var/run/netns/" + n.Netns, cfg.Bin, "serve", "--node", "--node-name", n.Name,
		"--node-listen", n.Address, "--data-dir", n.DataDir, "--subnet", fmt.Sprintf("10.%d.0.0/16", 160+k),
		"--gateway-listen", addr}, cfg.NodeArgs...)
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
// links. Data dirs stay unless purge.
func Down(root string, purge bool, out io.Writer) error {
	b, err := os.ReadFile(filepath.Join(root, stateFile))
	if err != nil {
		return fmt.Errorf("no fleet under %s (%v)", root, err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(root, stateFile), err)
	}
	if c, err := client.ForDataDir(st.API, st.Master.DataDir); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if sbs, err := c.Sandboxes(ctx); err == nil {
			for _, sb := range sbs {
				if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
					fmt.Fprintf(out, "delete sandbox %s: %v\n", sb.Name, err)
				}
			}
			fmt.Fprintf(out, "deleted %d sandbox(es)\n", len(sbs))
		}
		cancel()
	}
	down(st, out)
	os.Remove(filepath.Join(root, stateFile))
	if purge {
		for _, d := range append([]string{st.Master.DataDir}, dirs(st)...) {
			os.RemoveAll(d)
		}
	}
	fmt.Fprintln(out, "fleet is down")
	return nil
}

func dirs(st State) []string {
	var out []string
	for _, n := range st.Nodes {
		out = append(out, n.DataDir)
	}
	return out
}

func down(st State, out io.Writer) {
	procs := []Proc{st.Master}
	for _, n := range st.Nodes {
		procs = append(procs, n.Proc)
	}
	for _, p := range procs {
		stop(p, out)
	}
	for _, n := range st.Nodes {
		exec.Command("ip", "netns", "delete", n.Netns).Run()
		exec.Command("ip", "link", "delete", n.HostIf).Run()
	}
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
