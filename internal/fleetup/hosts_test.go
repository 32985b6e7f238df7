package fleetup

import (
	"net/netip"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

func TestParseHost(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Host
		err  string
	}{
		{in: "h1", want: Host{Addr: "h1"}},
		{in: "root@10.0.0.5", want: Host{User: "root", Addr: "10.0.0.5"}},
		{in: "admin@web1.example.com:2222", want: Host{User: "admin", Addr: "web1.example.com", Port: 2222}},
		{in: "fd00::5", want: Host{Addr: "fd00::5"}},
		{in: "root@[fd00::5]:22", want: Host{User: "root", Addr: "fd00::5", Port: 22}},
		{in: "[fd00::5]", want: Host{Addr: "fd00::5"}},
		{in: "", err: "not a host name"},
		{in: "root@", err: "not a host name"},
		{in: "@h1", err: "user"},
		{in: "-oProxyCommand=evil", err: "not a host name"},
		{in: "-l@h1", err: "user"},
		{in: "h1:0", err: "ssh port"},
		{in: "h1:99999", err: "ssh port"},
		{in: "h1:ssh", err: "ssh port"},
		{in: "h 1", err: "not a host name"},
		{in: "h1;reboot", err: "not a host name"},
		{in: "[10.0.0.5]:22", err: "not an IPv6"},
		{in: "[fd00::5", err: "no ']'"},
		{in: "[fd00::5]22", err: "want [IPv6]:port"},
		{in: "fd00::zz", err: "not an IPv6"},
	} {
		got, err := ParseHost(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseHost(%q) = %+v, %v; want an error saying %q", c.in, got, err, c.err)
			}
			continue
		}
		c.want.Spec = c.in
		if err != nil || got != c.want {
			t.Errorf("ParseHost(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestParseHosts(t *testing.T) {
	if _, err := ParseHosts(nil); err == nil {
		t.Error("no hosts: no error")
	}
	if _, err := ParseHosts([]string{"root@h1", "admin@H1"}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("one host twice (another user, another case): %v", err)
	}
	hs, err := ParseHosts([]string{"h1", "h1:2222"})
	if err != nil || len(hs) != 2 {
		t.Errorf("one address, two ssh ports: %v %v", hs, err)
	}
}

func TestTargets(t *testing.T) {
	for _, c := range []struct{ in, target, scp string }{
		{"h1", "h1", "h1:/d/f"},
		{"root@10.0.0.5:2222", "root@10.0.0.5", "root@10.0.0.5:/d/f"},
		{"root@[fd00::5]:2222", "root@fd00::5", "root@[fd00::5]:/d/f"},
	} {
		h, err := ParseHost(c.in)
		if err != nil {
			t.Fatal(err)
		}
		if h.Target() != c.target || h.scpTarget("/d/f") != c.scp {
			t.Errorf("%s: target %q, scp %q; want %q, %q", c.in, h.Target(), h.scpTarget("/d/f"), c.target, c.scp)
		}
	}
}

func TestNodeNames(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []string
	}{
		{[]string{"root@10.191.1.2", "root@10.191.2.2"}, []string{"10-191-1-2", "10-191-2-2"}},
		{[]string{"web1.example.com", "Web2.Example.com"}, []string{"web1", "web2"}},
		// The same first label twice: the whole names tell them apart.
		{[]string{"web.eu.example.com", "web.us.example.com"}, []string{"web-eu-example-com", "web-us-example-com"}},
		// One address, two ssh ports (two machines behind one NAT).
		{[]string{"gw:2201", "gw:2202"}, []string{"gw-2201", "gw-2202"}},
		{[]string{"fd00::5"}, []string{"fd00--5"}},
		{[]string{"my_host"}, []string{"my-host"}},
	} {
		hs, err := ParseHosts(c.in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := NodeNames(hs)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("NodeNames(%v) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	hs, _ := ParseHosts([]string{"a-b", "a_b"})
	if _, err := NodeNames(hs); err == nil {
		t.Error("a-b and a_b: both would be node a-b, and no error")
	}
	hs, _ = ParseHosts([]string{strings.Repeat("x", 70) + ".example"})
	if n, err := NodeNames(hs); err != nil || len(n[0]) != 63 {
		t.Errorf("a 70-letter label: %v %v", n, err)
	}
}

func TestNodeSubnets(t *testing.T) {
	got, err := NodeSubnets("10.161.0.0/16", 3)
	if want := []string{"10.161.0.0/16", "10.162.0.0/16", "10.163.0.0/16"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("/16: %v %v", got, err)
	}
	got, err = NodeSubnets("10.191.101.0/24", 2)
	if want := []string{"10.191.101.0/24", "10.191.102.0/24"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("/24: %v %v", got, err)
	}
	got, err = NodeSubnets("10.0.255.0/24", 2) // across an octet
	if want := []string{"10.0.255.0/24", "10.1.0.0/24"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("/24 across an octet: %v %v", got, err)
	}
	for _, bad := range []string{"10.161.0.1/16", "10.0.0.0/30", "10.0.0.0/4", "fd00::/64", "10.161.0.0", "x"} {
		if _, err := NodeSubnets(bad, 1); err == nil {
			t.Errorf("NodeSubnets(%q): no error", bad)
		}
	}
	if _, err := NodeSubnets("255.255.0.0/16", 2); err == nil || !strings.Contains(err.Error(), "past") {
		t.Errorf("past the end: %v", err)
	}
}

func TestCheckRemoteDir(t *testing.T) {
	for _, ok := range []string{"/var/lib/sandstorm-fleet", "/opt/sf_1.2+x"} {
		if err := CheckRemoteDir(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/", "var/lib", "/var/lib/", "/var//lib", "/a b", "/a'b", "/a$b", "/a/../b"} {
		if err := CheckRemoteDir(bad); err == nil {
			t.Errorf("CheckRemoteDir(%q): no error", bad)
		}
	}
}

// TestShQuote: what sh reads back is what was quoted, whatever it holds.
func TestShQuote(t *testing.T) {
	args := []string{"plain", "it's", `a"b`, "$HOME", "`id`", "a b\tc\nd", "'", "''", `\`, ""}
	out, err := exec.Command("sh", "-c", `for a in `+shJoin(args)+`; do printf '%s\0' "$a"; done`).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"); !reflect.DeepEqual(got, args) {
		t.Errorf("sh read back %q, want %q", got, args)
	}
}

func TestSSHArgs(t *testing.T) {
	h, _ := ParseHost("admin@web1:2222")
	s := SSH{Options: []string{"StrictHostKeyChecking=accept-new", "ConnectTimeout=3"}, Identity: "/k/id"}
	got := s.sshArgs(h, true)
	want := []string{"-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=3",
		"-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
		"-i", "/k/id", "-p", "2222", "--", "admin@web1", "sudo -n sh -s"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ssh args:\n got %q\nwant %q", got, want)
	}
	// The user's options come before fleet up's defaults (ssh keeps the
	// first value of an option), BatchMode before them all.
	if strings.Index(strings.Join(got, " "), "ConnectTimeout=3") > strings.Index(strings.Join(got, " "), "ConnectTimeout=15") {
		t.Error("the user's option comes after the default")
	}
	plain := SSH{}.sshArgs(Host{Addr: "h1"}, false)
	if !reflect.DeepEqual(plain[len(plain)-3:], []string{"--", "h1", "sh -s"}) {
		t.Errorf("no port, no sudo: %q", plain)
	}
	got = s.scpArgs(h, "/bin/sandstormd", "/var/x/sandstormd")
	want = []string{"-q", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=3",
		"-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
		"-i", "/k/id", "-P", "2222", "--", "/bin/sandstormd", "admin@web1:/var/x/sandstormd"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("scp args:\n got %q\nwant %q", got, want)
	}
	if c := s.tryCommand(h); !strings.HasPrefix(c, "ssh -o BatchMode=yes") || !strings.HasSuffix(c, "-p 2222 admin@web1 true") {
		t.Errorf("try command: %s", c)
	}
}

func TestKeyValues(t *testing.T) {
	got := keyValues("uid=0\narch=x86_64\nconn=10.0.0.1 5000 10.0.0.5 22\nnoise\nrunsc=\n")
	want := map[string]string{"uid": "0", "arch": "x86_64", "conn": "10.0.0.1 5000 10.0.0.5 22", "runsc": ""}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Hosts: []string{"root@10.0.0.5"}, RemoteDir: "/var/lib/sandstorm-fleet", NodePort: 7443, NodeSubnet: "10.161.0.0/16"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Hosts = []string{"h1", "h1"} }, "twice"},
		{func(c *Config) { c.RemoteDir = "rel" }, "--remote-dir"},
		{func(c *Config) { c.NodePort = 0 }, "--node-port"},
		{func(c *Config) { c.NodeSubnet = "10.161.0.0/29" }, "--node-subnet"},
		{func(c *Config) { c.RemoteRunsc = "runsc" }, "--remote-runsc"},
		{func(c *Config) { c.RemoteRunsc, c.Runsc = "/usr/bin/runsc", "/bin/runsc" }, "exclude"},
		{func(c *Config) { c.SSH.Options = []string{"-F/dev/null"} }, "--ssh-option"},
		{func(c *Config) { c.MeshAddress = "10.0.0.300" }, "--mesh-address"},
		{func(c *Config) { c.MeshAddress = "fe80::1%eth0" }, "--mesh-address"},
		{func(c *Config) { c.NoMesh, c.MeshConfig = true, "/etc/sam/node.yaml" }, "--no-mesh"},
		{func(c *Config) { c.NoMesh, c.Routers = true, 2 }, "--no-mesh"},
		{func(c *Config) { c.Routers = 6 }, "--routers"},
		// The sam-node socket's path must fit a sockaddr_un.
		{func(c *Config) { c.RemoteDir = "/" + strings.Repeat("d", 90) }, "unix socket"},
	} {
		cfg := ok
		c.mod(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want an error saying %q", cfg, err, c.want)
		}
	}
	long := ok
	long.RemoteDir, long.NoMesh = "/"+strings.Repeat("d", 90), true
	if err := long.Validate(); err != nil {
		t.Errorf("a long --remote-dir with --no-mesh (no socket there): %v", err)
	}
	if err := (Config{Nodes: 10}).Validate(); err == nil {
		t.Error("--nodes 10: no error")
	}
}

// TestMeshAddresses: each host reaches the control plane and the router
// at the address it sees this machine at, if that is this machine's; the
// listeners are those addresses, each once; --mesh-address overrides; a
// NAT or jump host between (an address not this machine's), an empty
// SSH_CONNECTION and a link-local address are errors saying what to do.
func TestMeshAddresses(t *testing.T) {
	hs, _ := ParseHosts([]string{"root@10.191.1.2", "root@10.191.2.2", "root@10.191.3.2"})
	local := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.191.1.1"), netip.MustParseAddr("10.191.2.1"),
		netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fe80::1%eth0")}
	str := func(as []netip.Addr) []string {
		var out []string
		for _, a := range as {
			out = append(out, a.String())
		}
		return out
	}
	// Hosts on two networks: each its own; the listeners each once, in
	// host order.
	per, listen, err := MeshAddresses(hs, []string{"10.191.1.1", "10.191.2.1", "10.191.1.1"}, local, "")
	if err != nil || !reflect.DeepEqual(str(per), []string{"10.191.1.1", "10.191.2.1", "10.191.1.1"}) || !reflect.DeepEqual(str(listen), []string{"10.191.1.1", "10.191.2.1"}) {
		t.Errorf("two networks: %v %v %v", per, listen, err)
	}
	// IPv4-mapped (a dual-stack sshd) and IPv6.
	per, listen, err = MeshAddresses(hs[:2], []string{"::ffff:10.191.1.1", "fd00::1"}, local, "")
	if err != nil || !reflect.DeepEqual(str(per), []string{"10.191.1.1", "fd00::1"}) || len(listen) != 2 {
		t.Errorf("mapped and v6: %v %v %v", per, listen, err)
	}
	// The override serves every host, whatever they saw.
	per, listen, err = MeshAddresses(hs, []string{"203.0.113.9", "", "10.191.2.1"}, local, "10.191.2.1")
	if err != nil || !reflect.DeepEqual(str(per), []string{"10.191.2.1", "10.191.2.1", "10.191.2.1"}) || !reflect.DeepEqual(str(listen), []string{"10.191.2.1"}) {
		t.Errorf("--mesh-address: %v %v %v", per, listen, err)
	}
	for _, c := range []struct {
		sees     []string
		override string
		want     string
	}{
		{[]string{"10.191.1.1", "203.0.113.9", "10.191.1.1"}, "", "root@10.191.2.2 sees this machine as 203.0.113.9"},
		{[]string{"10.191.1.1", "203.0.113.9", "10.191.1.1"}, "", "--mesh-address"},
		{[]string{"10.191.1.1", "", "10.191.1.1"}, "", "SSH_CONNECTION is empty"},
		{[]string{"fe80::1", "10.191.1.1", "10.191.1.1"}, "", "link-local"},
		{[]string{"10.191.1.1", "10.191.1.1", "10.191.1.1"}, "192.0.2.1", "not an address of this machine"},
		{[]string{"10.191.1.1", "10.191.1.1", "10.191.1.1"}, "nonsense", "--mesh-address"},
	} {
		if _, _, err := MeshAddresses(hs, c.sees, local, c.override); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("sees %v, override %q: %v; want an error saying %q", c.sees, c.override, err, c.want)
		}
	}
}

func TestMeshDialStrings(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.191.1.1"), netip.MustParseAddr("fd00::1")
	if got := hostPort(v4, 7600); got != "10.191.1.1:7600" {
		t.Error(got)
	}
	if got := hostPort(v6, 7600); got != "[fd00::1]:7600" {
		t.Error(got)
	}
	if got := tcpMultiaddr(v4, 7700); got != "/ip4/10.191.1.1/tcp/7700" {
		t.Error(got)
	}
	if got := tcpMultiaddr(v6, 7700); got != "/ip6/fd00::1/tcp/7700" {
		t.Error(got)
	}
	l := layout{Dir: "/var/lib/sf", Node: "web1"}
	if d, m := l.dest("sam-node"); d != "/var/lib/sf/bin/sam-node" || m != "755" {
		t.Errorf("sam-node goes to %s mode %s", d, m)
	}
	if d, m := l.dest(meshConfigName); d != "/var/lib/sf/web1-sam-node.yaml" || m != "600" {
		t.Errorf("the sam-node config goes to %s mode %s", d, m)
	}
}

// TestMeshJoinNeeded: a host's sam-node joins unless its mesh dir holds
// a member of this control plane (by its CA's sha256); a member of
// another is an error that says how to clear it.
func TestMeshJoinNeeded(t *testing.T) {
	h, _ := ParseHost("root@10.0.0.5")
	l := layout{Dir: "/var/lib/sf", Node: "10-0-0-5"}
	const url = "https://10.0.0.1:7600"
	if j, err := meshJoinNeeded(map[string]string{"mesh_ca": ""}, "abc", url, h, l); !j || err != nil {
		t.Errorf("nothing there: %v %v", j, err)
	}
	// A CA left by a failed join, no credential: join again.
	if j, err := meshJoinNeeded(map[string]string{"mesh_ca": "abc"}, "abc", url, h, l); !j || err != nil {
		t.Errorf("a CA and no member: %v %v", j, err)
	}
	if j, err := meshJoinNeeded(map[string]string{"mesh_member": "1", "mesh_ca": "abc", "mesh_url": url}, "abc", url, h, l); j || err != nil {
		t.Errorf("a member of this control plane: %v %v", j, err)
	}
	if _, err := meshJoinNeeded(map[string]string{"mesh_member": "1", "mesh_ca": "def", "mesh_url": url}, "abc", url, h, l); err == nil || !strings.Contains(err.Error(), "another mesh") || !strings.Contains(err.Error(), "/var/lib/sf/10-0-0-5-mesh") {
		t.Errorf("a member of another control plane: %v", err)
	}
	if _, err := meshJoinNeeded(map[string]string{"mesh_member": "1", "mesh_ca": "abc", "mesh_url": "https://10.9.9.9:7600"}, "abc", url, h, l); err == nil || !strings.Contains(err.Error(), "--mesh-address") {
		t.Errorf("a member enrolled at another address of this control plane: %v", err)
	}
}

// TestRemoteUnits: fleet down stops each host's sam-node with its node,
// and one whose node never started (fleet up failed between) on its own.
func TestRemoteUnits(t *testing.T) {
	st := State{
		Nodes: []NodeState{{Name: "a", Host: "root@a"}, {Name: "node-1", Netns: "sf-1"}, {Name: "b", Host: "root@b"}},
		Mesh: &MeshState{Nodes: []MeshNode{{Name: "b", Host: "root@b"}, {Name: "c", Host: "root@c"}, {Name: "node-1", Netns: "sf-1"}},
			Routers: []MeshRouter{{Name: "router", Proc: Proc{PID: 11}}, {Name: "router-2", Proc: Proc{PID: 12}}},
			// A fleet.json from before --routers: its one router.
			Router: Proc{PID: 10}},
	}
	var got []string
	for _, u := range remoteUnits(st) {
		s := ""
		if u.node != nil {
			s += "node " + u.node.Name
		}
		if u.mesh != nil {
			s += "+mesh " + u.mesh.Name
		}
		got = append(got, s)
	}
	if want := []string{"node a", "node b+mesh b", "+mesh c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("remote units: %q, want %q", got, want)
	}
	if procs := meshProcs(st.Mesh); len(procs) != 5 || procs[1].PID != 11 || procs[2].PID != 12 || procs[3].PID != 10 {
		t.Errorf("the mesh's processes here: %+v (want node-1's sam-node, the routers and the control plane)", procs)
	}
}
