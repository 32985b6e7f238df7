package fleetup

// The pure half of fleet up --hosts: what a host spec means, what each
// host's node is called, which sandbox subnet it gets and where its files
// go on it. No I/O here (hosts_test.go covers it); ssh.go runs it.

import (
	"errors"
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"

	"sandstorm/internal/pki"
)

// Host is a machine of a fleet over ssh, as --hosts names it:
// [user@]host[:port], an IPv6 address in brackets when a port follows
// ([fd00::5]:2222).
type Host struct {
	Spec string `json:"spec"`           // as given
	User string `json:"user,omitempty"` // "": ssh's own choice (ssh config, else the local user)
	Addr string `json:"addr"`           // name or address, without brackets
	Port int    `json:"port,omitempty"` // ssh port; 0: ssh's own choice (ssh config, else 22)
}

// ParseHost reads one host spec. It refuses anything ssh could take for
// an option (a leading "-") or a second destination, so a spec can only
// ever name a host.
func ParseHost(s string) (Host, error) {
	h := Host{Spec: s}
	rest := s
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		h.User, rest = rest[:i], rest[i+1:]
		if !validUser(h.User) {
			return h, fmt.Errorf("host %q: user %q: want letters, digits, '.', '_' or '-', not starting with '-'", s, h.User)
		}
	}
	switch {
	case strings.HasPrefix(rest, "["):
		end := strings.Index(rest, "]")
		if end < 0 {
			return h, fmt.Errorf("host %q: no ']' after the IPv6 address", s)
		}
		h.Addr = rest[1:end]
		if a, err := netip.ParseAddr(h.Addr); err != nil || !a.Is6() {
			return h, fmt.Errorf("host %q: %q in brackets is not an IPv6 address", s, h.Addr)
		}
		rest = rest[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return h, fmt.Errorf("host %q: want [IPv6]:port", s)
			}
			p, err := parsePort(rest[1:])
			if err != nil {
				return h, fmt.Errorf("host %q: %v", s, err)
			}
			h.Port = p
		}
		return h, nil
	case strings.Count(rest, ":") > 1:
		// A bare IPv6 address: its colons are not a port.
		a, err := netip.ParseAddr(rest)
		if err != nil || !a.Is6() {
			return h, fmt.Errorf("host %q: not an IPv6 address (with a port, write [address]:port)", s)
		}
		h.Addr = rest
		return h, nil
	case strings.Contains(rest, ":"):
		var ps string
		rest, ps, _ = strings.Cut(rest, ":")
		p, err := parsePort(ps)
		if err != nil {
			return h, fmt.Errorf("host %q: %v", s, err)
		}
		h.Port = p
	}
	h.Addr = rest
	if !validHostname(h.Addr) {
		return h, fmt.Errorf("host %q: %q is not a host name or address", s, h.Addr)
	}
	return h, nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("ssh port %q: want 1 to 65535", s)
	}
	return p, nil
}

func validUser(s string) bool {
	if s == "" || s[0] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// validHostname: a DNS name, an ssh config alias or an IPv4 address.
func validHostname(s string) bool {
	if s == "" || len(s) > 253 || s[0] == '-' || s[0] == '.' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// ParseHosts reads --hosts: at least one host, none twice.
func ParseHosts(specs []string) ([]Host, error) {
	if len(specs) == 0 {
		return nil, errors.New("--hosts: name at least one host, e.g. --hosts root@10.0.0.5,root@10.0.0.6")
	}
	var hs []Host
	seen := map[string]bool{}
	for _, s := range specs {
		s = strings.TrimSpace(s)
		h, err := ParseHost(s)
		if err != nil {
			return nil, err
		}
		key := strings.ToLower(h.Addr) + ":" + strconv.Itoa(h.Port)
		if seen[key] {
			return nil, fmt.Errorf("host %q is named twice in --hosts", s)
		}
		seen[key] = true
		hs = append(hs, h)
	}
	return hs, nil
}

// Target is h as ssh's destination: [user@]addr (the port goes in -p).
func (h Host) Target() string {
	if h.User != "" {
		return h.User + "@" + h.Addr
	}
	return h.Addr
}

// scpTarget is path on h as scp names it: an IPv6 address in brackets,
// since scp splits host from path at the first colon.
func (h Host) scpTarget(p string) string {
	a := h.Addr
	if strings.Contains(a, ":") {
		a = "[" + a + "]"
	}
	if h.User != "" {
		a = h.User + "@" + a
	}
	return a + ":" + p
}

// NodeNames names each host's node: an address with its dots (or colons)
// as dashes (10.0.0.5 → 10-0-0-5), a host name by its first label
// (web1.example.com → web1) unless two hosts share that, then by all of
// it; hosts on one address told apart by their ssh port. Node names are
// lower-case letters, digits and dashes (what pairing accepts).
func NodeNames(hs []Host) ([]string, error) {
	base := make([]string, len(hs))
	count := map[string]int{}
	for i, h := range hs {
		if _, err := netip.ParseAddr(h.Addr); err != nil {
			base[i], _, _ = strings.Cut(h.Addr, ".")
			count[base[i]]++
		}
	}
	names := make([]string, len(hs))
	seen := map[string]bool{}
	for i, h := range hs {
		n := h.Addr
		if base[i] != "" && count[base[i]] == 1 {
			n = base[i]
		}
		n = dashed(n)
		if same := sameAddr(hs, h); same {
			n = dashed(n + "-" + strconv.Itoa(h.Port))
		}
		if len(n) > 63 {
			n = strings.TrimRight(n[:63], "-")
		}
		if n == "" || seen[n] {
			return nil, fmt.Errorf("hosts %s: cannot give each a node name of its own (%q twice)", hostList(hs), n)
		}
		seen[n] = true
		names[i] = n
	}
	return names, nil
}

func sameAddr(hs []Host, h Host) bool {
	k := 0
	for _, o := range hs {
		if strings.EqualFold(o.Addr, h.Addr) {
			k++
		}
	}
	return k > 1
}

func dashed(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-")
}

func hostList(hs []Host) string {
	var s []string
	for _, h := range hs {
		s = append(s, h.Spec)
	}
	return strings.Join(s, ",")
}

// NodeSubnets gives n nodes a sandbox subnet each: the first is first, the
// next ones the blocks of its size that follow (10.161.0.0/16 →
// 10.161.0.0/16, 10.162.0.0/16, …). Machines apart could share one, but
// distinct pools keep every sandbox address in the fleet unique, as the
// netns fleet's 10.(160+k).0.0/16 do.
func NodeSubnets(first string, n int) ([]string, error) {
	p, err := netip.ParsePrefix(first)
	if err != nil || !p.Addr().Is4() {
		return nil, fmt.Errorf("--node-subnet %q: want an IPv4 prefix, e.g. 10.161.0.0/16", first)
	}
	// What the node's pool takes (internal/netns): /8 to /28.
	if p.Bits() < 8 || p.Bits() > 28 {
		return nil, fmt.Errorf("--node-subnet %q: want a prefix length from /8 to /28", first)
	}
	if p.Masked() != p {
		return nil, fmt.Errorf("--node-subnet %q: not the start of its block (%s is)", first, p.Masked())
	}
	b := p.Addr().As4()
	start := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	size := uint64(1) << (32 - p.Bits())
	if start+uint64(n)*size > 1<<32 {
		return nil, fmt.Errorf("--node-subnet %s: %d nodes' blocks of that size run past 255.255.255.255", first, n)
	}
	out := make([]string, n)
	for i := range out {
		a := start + uint64(i)*size
		out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), p.Bits()).String()
	}
	return out, nil
}

// CheckRemoteDir: an absolute path of plain characters. It goes into
// remote shell scripts (quoted) and scp's destination, and the plain
// characters keep what a person reads in fleet.json what the host has.
func CheckRemoteDir(d string) error {
	if !path.IsAbs(d) || path.Clean(d) != d || d == "/" {
		return fmt.Errorf("--remote-dir %q: want an absolute, clean path other than /", d)
	}
	for _, r := range d {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+", r)) {
			return fmt.Errorf("--remote-dir %q: only letters, digits and / . _ - +", d)
		}
	}
	return nil
}

// layout is where a node's files are on its host, under the remote dir:
// the binaries in bin/ (shared by every node there), and per node its data
// dir, log and PID file named after it — so two fleets' nodes, or a host
// that is also the master's machine, never share a file.
type layout struct{ Dir, Node string }

func (l layout) bin() string      { return l.Dir + "/bin/sandstormd" }
func (l layout) runsc() string    { return l.Dir + "/bin/runsc" }
func (l layout) envd() string     { return l.Dir + "/bin/" + envdName }
func (l layout) dataDir() string  { return l.Dir + "/" + l.Node }
func (l layout) log() string      { return l.Dir + "/" + l.Node + ".log" }
func (l layout) pidFile() string  { return l.Dir + "/" + l.Node + ".pid" }
func (l layout) codeFile() string { return path.Join(l.dataDir(), "pki", pki.PairingCodeFile) }

// The node's sam-node (mesh.go): its binary beside sandstormd, and per
// node its mesh dir (identity, credential, agent socket), log, PID file
// and config.
func (l layout) samNode() string     { return l.Dir + "/bin/sam-node" }
func (l layout) meshDir() string     { return l.Dir + "/" + l.Node + "-mesh" }
func (l layout) meshSocket() string  { return l.meshDir() + "/sam-node.sock" }
func (l layout) meshLog() string     { return l.Dir + "/" + l.Node + "-sam-node.log" }
func (l layout) meshPIDFile() string { return l.Dir + "/" + l.Node + "-sam-node.pid" }
func (l layout) meshConfig() string  { return l.Dir + "/" + l.Node + "-sam-node.yaml" }

// meshConfigName is the sam-node config among the files copied to a
// host: it goes beside the node's files, not into bin/, mode 0600.
const meshConfigName = "sam-node.yaml"

// dest is where a copied file goes on the host and its mode there.
func (l layout) dest(name string) (string, string) {
	if name == meshConfigName {
		return l.meshConfig(), "600"
	}
	return l.Dir + "/bin/" + name, "755"
}

// maxSocketPath is the longest path a unix socket can be bound at
// (sun_path is 108 bytes on Linux, with its terminating NUL).
const maxSocketPath = 107

// MeshAddresses decides where each host's sam-node reaches the control
// plane and the router on this machine, and so what they listen on.
// sees[i] is the address host i sees this machine at: the first field of
// its SSH_CONNECTION (RFC 4254 does not define it; OpenSSH's sshd sets it
// to "client-address client-port server-address server-port"), which is
// the address its packets to this machine go to — as long as nothing
// translates or relays between (a NAT, a ProxyJump host). So an address
// is taken only if it is one of this machine's (local); otherwise, or
// when a host says nothing, the caller must name it (override:
// --mesh-address), which then serves every host. Hosts that see this
// machine at different addresses (one on each of its networks) each get
// their own, and the listeners are every distinct one, in host order:
// only where members come from, never every address this machine has.
func MeshAddresses(hosts []Host, sees []string, local []netip.Addr, override string) (per, listen []netip.Addr, err error) {
	isLocal := func(a netip.Addr) bool {
		for _, l := range local {
			if l.WithZone("") == a {
				return true
			}
		}
		return false
	}
	if override != "" {
		a, err := netip.ParseAddr(override)
		if err != nil || a.Zone() != "" {
			return nil, nil, fmt.Errorf("--mesh-address %q: want an IP address of this machine (no zone)", override)
		}
		a = a.Unmap()
		if !isLocal(a) {
			return nil, nil, fmt.Errorf("--mesh-address %s is not an address of this machine: the control plane and the router listen there (ip -brief address shows this machine's)", a)
		}
		for range hosts {
			per = append(per, a)
		}
		return per, []netip.Addr{a}, nil
	}
	seen := map[netip.Addr]bool{}
	for i, h := range hosts {
		a, perr := netip.ParseAddr(sees[i])
		if sees[i] == "" || perr != nil {
			return nil, nil, fmt.Errorf("%s: cannot tell which address it reaches this machine at (its SSH_CONNECTION is empty): give it with --mesh-address ADDRESS, or leave the mesh out with --no-mesh", h.Spec)
		}
		a = a.WithZone("").Unmap()
		if a.IsLinkLocalUnicast() {
			return nil, nil, fmt.Errorf("%s reaches this machine at the link-local address %s, which members cannot dial without a zone: give a routable address of this machine with --mesh-address ADDRESS", h.Spec, a)
		}
		if !isLocal(a) {
			return nil, nil, fmt.Errorf("%s sees this machine as %s (its SSH_CONNECTION), which is not an address of this machine: a NAT or a jump host is between them. Give the address of this machine the hosts reach with --mesh-address ADDRESS, or leave the mesh out with --no-mesh", h.Spec, a)
		}
		per = append(per, a)
		if !seen[a] {
			seen[a] = true
			listen = append(listen, a)
		}
	}
	return per, listen, nil
}

// hostPort is a:port as a URL's host or a dial address ([v6]:port).
func hostPort(a netip.Addr, port int) string {
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// tcpMultiaddr is a libp2p address for TCP on a:port.
func tcpMultiaddr(a netip.Addr, port int) string {
	if a.Is4() {
		return fmt.Sprintf("/ip4/%s/tcp/%d", a, port)
	}
	return fmt.Sprintf("/ip6/%s/tcp/%d", a, port)
}

// meshJoinNeeded reads what inspectScript found of a node's sam-node on
// its host: its mesh dir holds a member of this control plane already
// (its CA's sha256 is caSum) — kept by a fleet down without --purge, and
// it needs no token — or nothing yet, and it must join. A member of
// another control plane is an error, as a node paired with another master
// is; so is one of this control plane enrolled at another URL than url
// (the address the host reaches this machine at has changed), which it
// would go on calling.
func meshJoinNeeded(kv map[string]string, caSum, url string, h Host, l layout) (bool, error) {
	if kv["mesh_member"] == "" {
		return true, nil
	}
	if kv["mesh_ca"] != caSum {
		return false, fmt.Errorf("%s: %s holds a member of another mesh's control plane (an earlier fleet's, whose root was purged or is another): take that fleet down with --purge, remove %s there, or use another --remote-dir", h.Spec, l.meshDir(), l.meshDir())
	}
	if u := kv["mesh_url"]; u != "" && u != url {
		return false, fmt.Errorf("%s: its sam-node's member (%s) was enrolled with the control plane at %s, and the host now reaches it at %s: give --mesh-address as then, or take this fleet down with --purge and up again", h.Spec, l.meshDir(), u, url)
	}
	return false, nil
}

// shQuote quotes s for a POSIX shell: in single quotes, each single quote
// of s ended, escaped with a backslash and begun again.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shQuote(a)
	}
	return strings.Join(q, " ")
}
