// Package meshlab is a mesh of machines on one: each machine a network
// namespace on a LAN of its own (a bridge in a namespace of its own), a
// control plane, one or more routers and members running the real
// binaries (sam-control-plane, sam-router, sam-node), each member serving
// a model from a real OpenAI-protocol server on its own loopback
// (internal/sam/fakellm). A member's namespace lets it reach the control
// plane and the routers only (nftables): members reach each other through
// a router's relay, as fleet up's nodes do on one host, where nothing is
// forwarded between them (issue 29).
//
// It is the apparatus of the mesh's end-to-end heal test and of sam-bench
// heal: faults (a router killed and restarted, down for a while, a member
// cut off from a router, the control plane down, a member restarted) and
// probes (a cross-node call each way, a fresh lookup of each member's
// names, each member's own status) with the time each was made, from
// which heal.go measures how long the mesh took to heal.
//
// Everything a lab sends stays inside namespaces it made; it needs root.
package meshlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"sandstorm/internal/sam/fakellm"
)

// Bins are the mesh's binaries.
type Bins struct{ ControlPlane, Router, Node string }

// BinsIn are the binaries in dir (make build's bin/).
func BinsIn(dir string) Bins {
	return Bins{filepath.Join(dir, "sam-control-plane"), filepath.Join(dir, "sam-router"), filepath.Join(dir, "sam-node")}
}

// Config is a lab's shape.
type Config struct {
	Bins Bins
	// Net is the LAN's /24, as its first three octets ("10.201.7"):
	// every lab of one run needs its own.
	Net string
	// Tag makes the lab's namespace names its own (a run's PID and the
	// lab's number, say).
	Tag string
	// Routers (default 1) and Members (default 2).
	Routers, Members int
	// Dir holds the lab's data dirs and logs (kept: a failed run's logs
	// say what happened).
	Dir string
	// LogLevel is the mesh processes' (default info).
	LogLevel string
}

// Lab is a running mesh.
type Lab struct {
	cfg Config
	lan string
	// hosts are every namespace made, for Close.
	hosts []Host

	CP      *Proc
	CPHost  Host
	cpAPI   string
	cpDir   string
	Routers []*Router
	Members []*Member

	closeOnce sync.Once
}

// Router is one router: its process and the multiaddr members dial.
type Router struct {
	Host Host
	Proc *Proc
	Addr string // /ip4/…/tcp/7700/p2p/<ID>
}

// Member is one sam-node: its process, its agent socket, the model it
// serves and that model's server.
type Member struct {
	Name   string
	Host   Host
	Proc   *Proc
	Socket string
	Model  string
	LLM    *fakellm.Server
	// Peer is its peer ID, read from its status once it joined.
	Peer string
	dir  string
}

const (
	cpPort     = "7600"
	routerPort = "7700"
	memberPort = "7701"
	adminAddr  = "127.0.0.1:9601"
	// Principal is who the probes call as; the lab's policy grants it
	// every model.
	Principal = "agent"
)

var tokenRE = regexp.MustCompile(`samb_[A-Za-z0-9_-]+`)

// New makes the lab's namespaces, starts and enrols the control plane,
// the routers and the members, and returns once every member has joined
// and found every other's model. On an error what was made is taken down.
func New(ctx context.Context, cfg Config) (*Lab, error) {
	if cfg.Routers <= 0 {
		cfg.Routers = 1
	}
	if cfg.Members <= 0 {
		cfg.Members = 2
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "info"
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	l := &Lab{cfg: cfg}
	for _, step := range []func(context.Context) error{l.makeLAN, l.startControlPlane, l.startRouters, l.startMembers,
		func(ctx context.Context) error { return l.WaitHealthy(ctx, 2*time.Minute) }} {
		if err := step(ctx); err != nil {
			l.Close()
			return nil, fmt.Errorf("lab %s (logs in %s): %w", cfg.Tag, cfg.Dir, err)
		}
	}
	return l, nil
}

// host makes the namespace of the lab's host named role at address
// Net.last, with a port on the LAN's bridge.
func (l *Lab) host(role string, last int) (Host, error) {
	h := Host{NS: fmt.Sprintf("ml-%s-%s", l.cfg.Tag, role), Addr: fmt.Sprintf("%s.%d", l.cfg.Net, last)}
	exec := func(args ...string) error { return ip(args...) }
	ip("netns", "delete", h.NS) // a run cut short
	if err := exec("netns", "add", h.NS); err != nil {
		return h, err
	}
	l.hosts = append(l.hosts, h)
	port := fmt.Sprintf("p%d", last)
	for _, args := range [][]string{
		{"-n", l.lan, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.NS},
		{"-n", l.lan, "link", "set", port, "master", "br0", "up"},
		{"-n", h.NS, "addr", "add", h.Addr + "/24", "dev", "eth0"},
		{"-n", h.NS, "link", "set", "eth0", "up"},
		{"-n", h.NS, "link", "set", "lo", "up"},
	} {
		if err := exec(args...); err != nil {
			return h, err
		}
	}
	return h, nil
}

func (l *Lab) makeLAN(context.Context) error {
	l.lan = fmt.Sprintf("ml-%s-lan", l.cfg.Tag)
	ip("netns", "delete", l.lan)
	if err := ip("netns", "add", l.lan); err != nil {
		return err
	}
	l.hosts = append(l.hosts, Host{NS: l.lan})
	if err := ip("-n", l.lan, "link", "add", "br0", "type", "bridge"); err != nil {
		return err
	}
	return ip("-n", l.lan, "link", "set", "br0", "up")
}

// operator runs a sam-control-plane operator command.
func (l *Lab) operator(args ...string) (string, error) {
	out, err := l.CPHost.Command(l.cfg.Bins.ControlPlane, append([]string{"--data-dir", l.cpDir, "--api", l.cpAPI}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("sam-control-plane %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// lanPolicy grants the probes' principal every model and tool.
const lanPolicy = "roles: [{name: all, services: [\"inference://*\", \"mcp://*\"]}]\nbindings: [{principal: " + Principal + ", roles: [all]}]\n"

func (l *Lab) startControlPlane(ctx context.Context) error {
	h, err := l.host("cp", 10)
	if err != nil {
		return err
	}
	l.CPHost, l.cpDir, l.cpAPI = h, filepath.Join(l.cfg.Dir, "control-plane"), "https://"+h.Addr+":"+cpPort
	l.CP = &Proc{Name: "control-plane", Log: filepath.Join(l.cfg.Dir, "control-plane.log"), host: h, bin: l.cfg.Bins.ControlPlane,
		args: []string{"serve", "--data-dir", l.cpDir, "--listen", h.Addr + ":" + cpPort, "--log-level", l.cfg.LogLevel}}
	if _, _, err := l.RestartControlPlane(ctx); err != nil {
		return err
	}
	pol := filepath.Join(l.cfg.Dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(lanPolicy), 0o600); err != nil {
		return err
	}
	_, err = l.operator("policy", "set", pol)
	return err
}

// join enrols bin (sam-router or sam-node) as name in dir, on h, with a
// one-use token on its standard input.
func (l *Lab) join(h Host, bin, name, dir string) error {
	out, err := l.operator("token", "create", "--max-uses", "1", "--ttl", "2m")
	if err != nil {
		return err
	}
	tok := tokenRE.FindString(out)
	if tok == "" {
		return fmt.Errorf("token create printed no token: %s", out)
	}
	c := h.Command(bin, "join", "--control-plane", l.cpAPI, "--ca", filepath.Join(l.cpDir, "pki", "ca.pem"),
		"--name", name, "--token-file", "-", "--mesh-dir", dir)
	c.Stdin = strings.NewReader(tok + "\n")
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("%s join %s: %v: %s", filepath.Base(bin), name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (l *Lab) startRouters(ctx context.Context) error {
	for i := range l.cfg.Routers {
		h, err := l.host(fmt.Sprintf("r%d", i+1), 20+i)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("router-%d", i+1)
		dir := filepath.Join(l.cfg.Dir, name)
		if err := l.join(h, l.cfg.Bins.Router, name, dir); err != nil {
			return err
		}
		listen := "/ip4/" + h.Addr + "/tcp/" + routerPort
		r := &Router{Host: h, Proc: &Proc{Name: name, Log: filepath.Join(l.cfg.Dir, name+".log"), host: h, bin: l.cfg.Bins.Router,
			args: []string{"--mesh-dir", dir, "--listen", listen, "--log-level", l.cfg.LogLevel}}}
		off := size(r.Proc.Log)
		if _, _, err := r.Proc.Restart(ctx, RouterReady); err != nil {
			return err
		}
		if r.Addr = wordWith(r.Proc.Log, off, listen+"/p2p/"); r.Addr == "" {
			return fmt.Errorf("%s printed no address", name)
		}
		l.Routers = append(l.Routers, r)
	}
	return nil
}

// RouterReady and MemberReady are what their logs say once they serve.
const (
	RouterReady = "router serving"
	MemberReady = "joined the mesh"
)

func (l *Lab) startMembers(ctx context.Context) error {
	for i := range l.cfg.Members {
		name := fmt.Sprintf("node-%c", 'a'+i)
		h, err := l.host(name, 30+i)
		if err != nil {
			return err
		}
		m := &Member{Name: name, Host: h, Model: "m-" + name, dir: filepath.Join(l.cfg.Dir, name),
			Socket: filepath.Join(l.cfg.Dir, name+".sock")}
		if err := l.confine(m); err != nil {
			return err
		}
		if err := InNS(h.NS, func() (err error) { m.LLM, err = fakellm.Listen("127.0.0.1:0", m.Model); return err }); err != nil {
			return err
		}
		cfgFile := filepath.Join(l.cfg.Dir, name+".yaml")
		if err := os.WriteFile(cfgFile, fmt.Appendf(nil, "providers:\n  - {name: llm, url: %q, models: [%s]}\n", m.LLM.BaseURL(), m.Model), 0o600); err != nil {
			return err
		}
		if err := l.join(h, l.cfg.Bins.Node, name, m.dir); err != nil {
			return err
		}
		args := []string{"--mesh-dir", m.dir, "--p2p-listen", "/ip4/" + h.Addr + "/tcp/" + memberPort,
			"--listen", "unix://" + m.Socket, "--admin-addr", adminAddr, "--config", cfgFile, "--log-level", l.cfg.LogLevel}
		for _, r := range l.Routers {
			args = append(args, "--router", r.Addr)
		}
		m.Proc = &Proc{Name: name, Log: filepath.Join(l.cfg.Dir, name+".log"), host: h, bin: l.cfg.Bins.Node, args: args}
		if _, _, err := m.Proc.Restart(ctx, MemberReady); err != nil {
			return err
		}
		l.Members = append(l.Members, m)
	}
	for _, m := range l.Members {
		st, err := l.Status(ctx, m)
		if err != nil {
			return err
		}
		m.Peer = st.Peer
	}
	return nil
}

// confine lets m's namespace talk to the control plane and the routers
// only (and to itself): what it sends anywhere else is dropped and
// counted, and the addresses in its set "cut" are dropped both ways
// (Cut).
func (l *Lab) confine(m *Member) error {
	allowed := []string{l.CPHost.Addr}
	for i := range l.cfg.Routers {
		allowed = append(allowed, fmt.Sprintf("%s.%d", l.cfg.Net, 20+i))
	}
	set := strings.Join(allowed, ", ")
	rules := fmt.Sprintf(`table inet meshlab {
  set cut { type ipv4_addr; }
  counter refused { }
  chain in {
    type filter hook input priority 0; policy accept;
    iif lo accept
    ip saddr @cut drop
    ip saddr { %[1]s } accept
    counter name refused drop
  }
  chain out {
    type filter hook output priority 0; policy accept;
    oif lo accept
    ip daddr @cut drop
    ip daddr { %[1]s } accept
    counter name refused drop
  }
}
`, set)
	f := filepath.Join(l.cfg.Dir, m.Name+".nft")
	if err := os.WriteFile(f, []byte(rules), 0o600); err != nil {
		return err
	}
	return m.Host.nft("-f", f)
}

// Dir is where the lab's data dirs and logs are.
func (l *Lab) Dir() string { return l.cfg.Dir }

// Close stops every process and removes the namespaces; the logs stay.
func (l *Lab) Close() {
	l.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, m := range l.Members {
			wg.Go(func() {
				if m.Proc != nil {
					m.Proc.Stop()
				}
				if m.LLM != nil {
					m.LLM.Close()
				}
			})
		}
		wg.Wait()
		for _, r := range l.Routers {
			wg.Go(r.Proc.Stop)
		}
		if l.CP != nil {
			wg.Go(l.CP.Stop)
		}
		wg.Wait()
		for _, h := range l.hosts {
			ip("netns", "delete", h.NS)
		}
	})
}

// Status is m's own view of the mesh (sam-node's admin GET /mesh).
func (l *Lab) Status(ctx context.Context, m *Member) (MemberStatus, error) {
	var st MemberStatus
	err := l.adminGet(ctx, m, "/mesh", &st)
	return st, err
}

func (l *Lab) adminGet(ctx context.Context, m *Member, path string, v any) error {
	req, err := newGet(ctx, "http://"+adminAddr+path)
	if err != nil {
		return err
	}
	resp, err := m.Host.HTTPClient(5 * time.Second).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var e struct{ Error string }
		json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("%s %s: %s: %s", m.Name, path, resp.Status, e.Error)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// WaitHealthy waits (bounded by d) until every member finds every
// other's model and calls it.
func (l *Lab) WaitHealthy(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if last = l.healthy(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.Join(fmt.Errorf("the lab's mesh was not whole within %v", d), last)
}

func (l *Lab) healthy(ctx context.Context) error {
	for _, a := range l.Members {
		for _, b := range l.Members {
			if a == b {
				continue
			}
			if err := l.Finds(ctx, a, b); err != nil {
				return err
			}
			if err := l.Call(ctx, a, b); err != nil {
				return err
			}
		}
	}
	return nil
}
