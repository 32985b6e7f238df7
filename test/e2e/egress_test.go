package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
	"golang.org/x/net/proxy"

	"sandstorm/api"
	"sandstorm/internal/sam/fakellm"
	"sandstorm/internal/testenv"
)

// testDNS is the node's resolver in these tests (sandstormd --resolver): a
// real DNS server on loopback whose answers the test sets, as a hostile or
// rebinding resolver would.
type testDNS struct {
	addr string
	mu   sync.Mutex
	recs map[string][]netip.Addr
}

func startTestDNS(t *testing.T) *testDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &testDNS{addr: pc.LocalAddr().String(), recs: map[string][]netip.Addr{}}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) }, Handler: dns.HandlerFunc(d.serve)}
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return d
}

func (d *testDNS) set(name string, addrs ...netip.Addr) {
	d.mu.Lock()
	d.recs[dns.Fqdn(name)] = addrs
	d.mu.Unlock()
}

func (d *testDNS) serve(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) == 1 {
		q := r.Question[0]
		d.mu.Lock()
		addrs, ok := d.recs[strings.ToLower(q.Name)]
		d.mu.Unlock()
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		for _, a := range addrs {
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 0}
			switch {
			case q.Qtype == dns.TypeA && a.Is4():
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case q.Qtype == dns.TypeAAAA && a.Is6():
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
	}
	w.WriteMsg(m)
}

// recorder is a TCP listener that counts every connection it accepts: the
// proof that a refused flow reached nothing.
type recorder struct {
	ln       net.Listener
	accepted atomic.Int64
}

func record(t *testing.T, addr netip.Addr) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("recording listener on %s: %v", addr, err)
	}
	r := &recorder{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nreached")
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return r
}

func (r *recorder) port() int { return r.ln.Addr().(*net.TCPAddr).Port }

// outsideNet is "the internet" of these tests: a network namespace of the
// test's own behind a router (its end of a veth), serving HTTP on
// 198.51.100.10 (RFC 5737 documentation space), routed from the host
// through that router. Nothing outside this machine is ever addressed.
type outsideNet struct {
	ns, hostIf      string
	hostEnd, router netip.Addr // the veth's two ends (198.18.x.1 and .2)
	server          netip.Addr
	accepted        atomic.Int64
}

func newOutsideNet(t *testing.T) *outsideNet {
	t.Helper()
	o := outsideNamespace(t, netip.MustParseAddr("198.51.100.10"))
	ln := listenIn(t, o.ns, netip.AddrPortFrom(o.server, 80).String())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "outside ok")
	}), ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			o.accepted.Add(1)
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o
}

// outsideNamespace makes the namespace of an outsideNet, serving
// nothing yet: servers (the first is o.server) are on its loopback, and
// the host routes each to it through the veth.
func outsideNamespace(t *testing.T, servers ...netip.Addr) *outsideNet {
	t.Helper()
	var rb [2]byte
	rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	o := &outsideNet{
		ns:      "e2eout-" + id,
		hostIf:  "e2eo" + id,
		hostEnd: netip.AddrFrom4([4]byte{198, 18, rb[0], rb[1]&0xfc | 1}),
		router:  netip.AddrFrom4([4]byte{198, 18, rb[0], rb[1]&0xfc | 2}),
		server:  servers[0],
	}
	peer := o.hostIf + "p"
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		for _, a := range servers {
			exec.Command("ip", "route", "del", a.String()+"/32", "via", o.router.String()).Run()
		}
		exec.Command("ip", "link", "del", o.hostIf).Run()
		exec.Command("ip", "netns", "del", o.ns).Run()
	})
	sh("ip", "netns", "add", o.ns)
	sh("ip", "link", "add", o.hostIf, "type", "veth", "peer", "name", peer, "netns", o.ns)
	sh("ip", "addr", "add", o.hostEnd.String()+"/30", "dev", o.hostIf)
	sh("ip", "link", "set", o.hostIf, "up")
	sh("ip", "-n", o.ns, "addr", "add", o.router.String()+"/30", "dev", peer)
	sh("ip", "-n", o.ns, "link", "set", peer, "up")
	sh("ip", "-n", o.ns, "link", "set", "lo", "up")
	sh("ip", "-n", o.ns, "route", "add", "default", "via", o.hostEnd.String())
	for _, a := range servers {
		sh("ip", "-n", o.ns, "addr", "add", a.String()+"/32", "dev", "lo")
		sh("ip", "route", "replace", a.String()+"/32", "via", o.router.String(), "dev", o.hostIf)
	}
	return o
}

// listenIn opens a TCP listener inside the named network namespace: the
// socket belongs to that namespace for life, whichever thread accepts.
func listenIn(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	type res struct {
		ln  net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked if the switch back fails: the thread dies with us
		orig, err := netns.Get()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		defer orig.Close()
		h, err := netns.GetFromName(ns)
		if err != nil {
			ch <- res{nil, err}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- res{nil, err}
			return
		}
		ln, lerr := net.Listen("tcp", addr)
		if err := netns.Set(orig); err != nil {
			ch <- res{nil, err}
			return
		}
		runtime.UnlockOSThread()
		ch <- res{ln, lerr}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, r.err)
	}
	return r.ln
}

// nodeAddress is a global unicast address of this machine's own interfaces
// other than the test's: the node's real address (192.0.2.2 on the VM this
// was written on). Only ever named as a destination that must be refused.
func nodeAddress() (netip.Addr, bool) {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr()
		if ip.Is4() && ip.IsGlobalUnicast() && !ip.IsPrivate() && !netip.MustParsePrefix("198.18.0.0/15").Contains(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// TestEgressAddressGuard is an attacker inside a real runsc sandbox whose
// policy allows names that the node's resolver (which the test controls)
// points at every address a sandbox must never reach: the node's loopback
// (where its API, metrics, gateway and sam-node's admin port listen), the
// host ends of its own and another sandbox's veth (another boundary
// included), another sandbox itself, link-local and metadata addresses,
// multicast, broadcast, private space, the node's own addresses and its
// on-link neighbour. Every flow is refused — transparently, over SOCKS5
// and HTTP CONNECT from inside, and over the boundary's Unix socket on the
// host — and recording listeners prove nothing was reached. A legitimate
// allowed name, served from a network namespace the test routes to, still
// works on every path.
func TestEgressAddressGuard(t *testing.T) {
	llm, err := fakellm.Listen("127.0.0.1:0", "gpt-small")
	if err != nil {
		t.Fatal(err)
	}
	defer llm.Close()
	out := newOutsideNet(t)
	resolver := startTestDNS(t)
	eth, haveEth := nodeAddress()

	policyPath := filepath.Join(t.TempDir(), "policy.yaml")
	literals := []string{out.hostEnd.String(), out.router.String()}
	if haveEth {
		literals = append(literals, eth.String())
	}
	os.WriteFile(policyPath, []byte(fmt.Sprintf(`
roles:
  - name: attacker
    services: ["inference://*"]
    egress: ["*.rebind.test", "good.test", "%s"]
bindings:
  - {principal: agent-a, roles: [attacker]}
  - {principal: agent-b, roles: [attacker]}
`, strings.Join(literals, `", "`))), 0o600)
	sn := startSAMNode(t, llm, policyPath)
	sock, samAdmin := sn.Sock, sn.Admin
	metrics := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	d := startDaemon(t, "--policy", policyPath, "--sam-node", "unix://"+sock, "--metrics-addr", metrics, "--resolver", resolver.addr)
	d.registerAgent(t)
	a := d.create(t, "agent", "agent-a")
	b := d.create(t, "agent", "agent-b")
	aHost := netip.MustParseAddr(a.Address).Prev() // the host ends of their /30s
	bHost := netip.MustParseAddr(b.Address).Prev()
	recLo, recA, recB := record(t, netip.MustParseAddr("127.0.0.1")), record(t, aHost), record(t, bHost)

	port := func(s string) int {
		_, p, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(s, "http://"), "https://"))
		n, _ := strconv.Atoi(p)
		return n
	}
	type target struct {
		what, name string
		addr       netip.Addr // what the resolver answers for name; invalid: name is a literal
		port       int
	}
	targets := []target{
		{"loopback", "lo.rebind.test", netip.MustParseAddr("127.0.0.1"), recLo.port()},
		{"the node's API on loopback", "api.rebind.test", netip.MustParseAddr("127.0.0.1"), port(d.API)},
		{"the boundaries' metrics", "metrics.rebind.test", netip.MustParseAddr("127.0.0.1"), port(metrics)},
		{"another sandbox's gateway port", "gateway.rebind.test", netip.MustParseAddr("127.0.0.1"), port(endpoint(t, b))},
		{"sam-node's admin port", "samadmin.rebind.test", netip.MustParseAddr("127.0.0.1"), port(samAdmin)},
		{"another loopback address", "lo2.rebind.test", netip.MustParseAddr("127.1.2.3"), recLo.port()},
		{"IPv6 loopback", "lo6.rebind.test", netip.MustParseAddr("::1"), recLo.port()},
		{"IPv4-mapped loopback", "mapped.rebind.test", netip.MustParseAddr("::ffff:127.0.0.1"), recLo.port()},
		{"NAT64 loopback", "nat64.rebind.test", netip.MustParseAddr("64:ff9b::7f00:1"), recLo.port()},
		{"unspecified", "zero.rebind.test", netip.MustParseAddr("0.0.0.0"), recLo.port()},
		{"cloud metadata", "metadata.rebind.test", netip.MustParseAddr("169.254.169.254"), 80},
		{"the synthetic pool", "synth.rebind.test", netip.MustParseAddr("169.254.64.1"), 80},
		{"IPv6 link-local", "ll6.rebind.test", netip.MustParseAddr("fe80::1"), 80},
		{"multicast", "mcast.rebind.test", netip.MustParseAddr("224.0.0.251"), 80},
		{"broadcast", "bcast.rebind.test", netip.MustParseAddr("255.255.255.255"), 80},
		{"private space", "private.rebind.test", netip.MustParseAddr("192.168.77.1"), 80},
		{"its own veth's host end", "ownhost.rebind.test", aHost, recA.port()},
		{"another sandbox's veth host end", "otherhost.rebind.test", bHost, recB.port()},
		{"another sandbox's boundary", "otherboundary.rebind.test", bHost, 1080},
		{"another sandbox", "othersandbox.rebind.test", netip.MustParseAddr(b.Address), 8000},
		{"an address of the node", "node.rebind.test", out.hostEnd, 80},
		{"the node's on-link router", "router.rebind.test", out.router, 80},
		{"an allowed literal that is the node's", out.hostEnd.String(), netip.Addr{}, 80},
		{"an allowed literal that is the node's neighbour", out.router.String(), netip.Addr{}, 80},
	}
	if haveEth {
		targets = append(targets,
			target{"the node's own interface address", "eth.rebind.test", eth, 80},
			target{"an allowed literal of the node's interface", eth.String(), netip.Addr{}, 80})
	}
	for _, tg := range targets {
		if tg.addr.IsValid() {
			resolver.set(tg.name, tg.addr)
		}
	}
	resolver.set("good.test", out.server)
	resolver.set("mixed.rebind.test", netip.MustParseAddr("127.0.0.1"), aHost, out.server) // one good address among bad ones

	proxyAddr := netip.AddrPortFrom(aHost, 1080).String()
	unixSOCKS, err := proxy.SOCKS5("unix", a.Boundary, nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	paths := []struct {
		name  string
		probe func(host string, port int) probeResult
	}{
		{"transparent", func(h string, p int) probeResult {
			return probeFrom(t, a, "kind", "http", "url", "http://"+net.JoinHostPort(h, strconv.Itoa(p))+"/")
		}},
		{"SOCKS5 from inside", func(h string, p int) probeResult {
			return probeFrom(t, a, "kind", "socks", "proxy", proxyAddr, "target", net.JoinHostPort(h, strconv.Itoa(p)))
		}},
		{"CONNECT from inside", func(h string, p int) probeResult {
			return probeFrom(t, a, "kind", "connect", "proxy", proxyAddr, "target", net.JoinHostPort(h, strconv.Itoa(p)))
		}},
		{"SOCKS5 on agent.sock", func(h string, p int) probeResult {
			c, err := unixSOCKS.Dial("tcp", net.JoinHostPort(h, strconv.Itoa(p)))
			if err != nil {
				return probeResult{Error: err.Error()}
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", h)
			body, err := io.ReadAll(c)
			return probeResult{OK: err == nil && len(body) > 0, Body: string(body)}
		}},
	}
	refused := 0
	for _, tg := range targets {
		for _, p := range paths {
			if p.name == "transparent" && !tg.addr.IsValid() {
				continue // a literal from inside is not intercepted: it is a direct connection, tried below
			}
			r := p.probe(tg.name, tg.port)
			if r.OK || r.Status == 200 {
				t.Errorf("%s (%s → %v:%d) over %s: reachable: %+v", tg.what, tg.name, tg.addr, tg.port, p.name, r)
				continue
			}
			if p.name == "CONNECT from inside" && r.Status != 403 {
				t.Errorf("%s over CONNECT: HTTP %d %q, want a 403 policy refusal", tg.what, r.Status, r.Error)
			}
			if p.name != "transparent" && !strings.Contains(r.Error, "not allowed") && !strings.Contains(r.Error, "403") {
				t.Errorf("%s over %s: %q, want a policy refusal (SOCKS5 0x02 or 403)", tg.what, p.name, r.Error)
			}
			refused++
		}
	}
	for _, rec := range []struct {
		what string
		r    *recorder
	}{{"loopback", recLo}, {"agent-a's host veth address", recA}, {"agent-b's host veth address", recB}} {
		if n := rec.r.accepted.Load(); n != 0 {
			t.Errorf("the recording listener on %s accepted %d connections from refused flows", rec.what, n)
		}
	}

	// The legitimate name works on every path, and so does a name with one
	// good address among bad ones (only the good one is dialled).
	for _, name := range []string{"good.test", "mixed.rebind.test"} {
		for _, p := range paths {
			r := p.probe(name, 80)
			if !strings.Contains(r.Body, "outside ok") {
				t.Errorf("%s over %s: %+v, want the outside server's answer", name, p.name, r)
			}
		}
	}
	if n := out.accepted.Load(); n != int64(2*len(paths)) {
		t.Errorf("the outside server accepted %d connections, want %d", n, 2*len(paths))
	}
	for _, rec := range []*recorder{recLo, recA, recB} {
		if n := rec.accepted.Load(); n != 0 {
			t.Errorf("a recording listener on %s accepted %d connections", rec.ln.Addr(), n)
		}
	}

	// Not through the boundary either: straight from the sandbox, another
	// sandbox's boundary port and the listeners on the host's veth ends are
	// dropped by nftables, and the outside server's address, dialled as
	// itself, is taken by the sandbox's own boundary, which grants no
	// address and resets it.
	var wg sync.WaitGroup
	for _, addr := range []string{
		netip.AddrPortFrom(bHost, 1080).String(),
		netip.AddrPortFrom(bHost, uint16(recB.port())).String(),
		netip.AddrPortFrom(aHost, uint16(recA.port())).String(),
		netip.AddrPortFrom(aHost, uint16(port(d.API))).String(),
		netip.AddrPortFrom(out.hostEnd, 80).String(),
		netip.AddrPortFrom(out.server, 80).String(),
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p := probeFrom(t, a, "kind", "tcp", "addr", addr); p.OK {
				t.Errorf("TCP straight from the sandbox to %s connected", addr)
			}
		}()
	}
	wg.Wait()
	if recA.accepted.Load()+recB.accepted.Load() != 0 || out.accepted.Load() != int64(2*len(paths)) {
		t.Error("a direct connection from the sandbox reached a host listener or the outside")
	}

	// A host process is not its sandbox: agent-a's boundary resets it.
	if c, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second); err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte{5, 1, 0})
		if n, _ := c.Read(make([]byte, 2)); n != 0 {
			t.Error("agent-a's boundary answered a connection from the host")
		}
		c.Close()
	}

	// The boundaries counted every address they refused, by class, on
	// their own metrics listener, and the host's connection as foreign.
	m, err := call("GET", "http://"+metrics+"/metrics", nil, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sum := func(prefix string) float64 {
		total := 0.0
		for _, line := range strings.Split(m.Body, "\n") {
			if strings.HasPrefix(line, prefix) {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				total += v
			}
		}
		return total
	}
	// Every refused flow is at least one refused address (mixed.rebind.test
	// adds two per path).
	if got, want := sum("sam_box_address_refusals_total{"), float64(refused); got < want {
		t.Errorf("sam_box_address_refusals_total = %v, want at least %v:\n%s", got, want, m.Body)
	}
	for _, class := range []string{"loopback", "link_local", "sandbox", "node", "local_network", "private", "multicast", "broadcast", "unspecified"} {
		if sum(`sam_box_address_refusals_total{class="`+class+`"}`) == 0 {
			t.Errorf("no refusal counted as %s", class)
		}
	}
	if sum("sam_box_foreign_connections_total") < 1 {
		t.Error("the host's connection to agent-a's boundary was not counted as foreign")
	}
	if !strings.Contains(d.logTail(400), `msg="boundary refused an address"`) {
		t.Error("no refusal in the daemon's log")
	}
}

// rulesProbe runs in a sandbox: it fetches each name it is given and
// prints what answered or why not.
const rulesProbe = `import sys, urllib.request
for name in sys.argv[1:]:
    try:
        print(name, "says", urllib.request.urlopen("http://%s/" % name, timeout=10).read().decode())
    except Exception as e:
        print(name, "refused:", type(e).__name__)
`

// TestSandboxEgressRules: a sandbox's own egress rules (sandbox create
// --allow-out/--deny-out, E2B's allowOut/denyOut) narrow what the policy
// grants it, from its first flow and across a snapshot: with denyOut all,
// only the name it allows goes out, though the policy grants both; the
// same sandbox without rules reaches both; a name the policy does not
// grant is refused at create, 403, and nothing is made.
func TestSandboxEgressRules(t *testing.T) {
	resolver, policyPath := twoOutsideNames(t, `
roles:
  - name: agent
    egress: ["mirror.test", "other.test", "198.51.100.10"]
bindings:
  - {principal: narrow, roles: [agent]}
  - {principal: wide, roles: [agent]}
  - {principal: greedy, roles: [agent]}
`)
	d := startDaemon(t, "--policy", policyPath, "--resolver", resolver.addr)
	d.registerWeb(t, "web")
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	probe := func(name string) string {
		t.Helper()
		// The outside server by its address too (a program dialling an
		// address, which the policy grants by itself), and a name the
		// policy does not grant.
		r := cli(t, env, "sandbox", "exec", name, "--", "/usr/bin/python3", "-c", rulesProbe, "mirror.test", "other.test", "198.51.100.10", "elsewhere.test")
		r.ok(t, "the egress probe in "+name)
		return r.Stdout
	}

	cli(t, env, "sandbox", "create", "web", "--name", "narrow", "--allow-out", "mirror.test", "--deny-out", "0.0.0.0/0").ok(t, "a sandbox with egress rules")
	narrow, err := d.C.Sandbox(ctxT(t), "narrow")
	if err != nil {
		t.Fatal(err)
	}
	d.track(narrow.ID)
	if e := narrow.Egress; e == nil || !slices.Equal(e.AllowOut, []string{"mirror.test"}) || !slices.Equal(e.DenyOut, []string{"0.0.0.0/0"}) {
		t.Errorf("the sandbox shows egress %+v", narrow.Egress)
	}
	check := func(why string) {
		t.Helper()
		got := probe("narrow")
		if !strings.Contains(got, "mirror.test says outside ok") || !strings.Contains(got, "other.test refused") || !strings.Contains(got, "198.51.100.10 refused") || !strings.Contains(got, "elsewhere.test refused") {
			t.Errorf("%s: with allow-out mirror.test and deny-out all:\n%s", why, got)
		}
	}
	check("from its first flow")
	// Its rules are its own across a snapshot (the boundary comes up again
	// with them).
	d.transition(t, narrow.ID, "snapshot", api.TierSnapshot)
	check("after a snapshot")
	after := checkEgressLog(t, d, env, narrow.ID)
	// Followed: a flow made after the follow began arrives on it.
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	pr, pw := io.Pipe()
	defer pr.Close()
	go func() { pw.CloseWithError(d.C.EgressLog(ctx, narrow.ID, after, 0, true, pw)) }()
	dec := json.NewDecoder(pr)
	var first api.EgressPage
	if err := dec.Decode(&first); err != nil || len(first.Items) != 0 {
		t.Fatalf("a followed log's first page after the newest flow: %+v, %v; want none", first, err)
	}
	probe("narrow")
	var next api.EgressPage
	if err := dec.Decode(&next); err != nil || len(next.Items) == 0 || next.Items[0].Seq != after+1 {
		t.Errorf("the followed log's next page: %+v, %v; want the flow after %d", next, err, after)
	}
	// The reader goes too: a page the follow writes after the last one
	// read would block it in the pipe past the cancel (seen: 16 minutes).
	cancel()
	pr.Close()

	wide := d.create(t, "web", "wide")
	if got := probe(wide.Name); !strings.Contains(got, "mirror.test says outside ok") || !strings.Contains(got, "other.test says outside ok") || !strings.Contains(got, "198.51.100.10 says outside ok") {
		t.Errorf("without rules, the policy alone (the address by itself too):\n%s", got)
	}
	// Rules set on the running sandbox apply to its next flows; a name
	// its policy lacks is refused and leaves them as they were.
	cli(t, env, "sandbox", "network", wide.Name, "--allow-out", "other.test", "--deny-out", "0.0.0.0/0").ok(t, "sandbox network")
	if got := probe(wide.Name); !strings.Contains(got, "mirror.test refused") || !strings.Contains(got, "other.test says outside ok") {
		t.Errorf("after sandbox network --allow-out other.test --deny-out all:\n%s", got)
	}
	cli(t, env, "sandbox", "network", wide.Name, "--allow-out", "elsewhere.test", "--deny-out", "0.0.0.0/0").fails(t, "widening by sandbox network", `not granted to principal "wide"`)
	if got, err := d.C.Sandbox(ctxT(t), wide.Name); err != nil || got.Egress == nil || !slices.Equal(got.Egress.AllowOut, []string{"other.test"}) {
		t.Errorf("a refused update changed the rules: %+v, %v", got.Egress, err)
	}
	cli(t, env, "sandbox", "network", wide.Name).ok(t, "sandbox network with no rules")
	if got := probe(wide.Name); !strings.Contains(got, "mirror.test says outside ok") || !strings.Contains(got, "other.test says outside ok") {
		t.Errorf("rules cleared, the policy alone again:\n%s", got)
	}

	res := cli(t, env, "sandbox", "create", "web", "--name", "greedy", "--allow-out", "elsewhere.test", "--deny-out", "0.0.0.0/0")
	res.fails(t, "allow-out of a name the policy does not grant", `not granted to principal "greedy"`)
	if _, err := d.C.Sandbox(ctxT(t), "greedy"); err == nil {
		t.Error("a refused create left its sandbox")
	}
	if r := cli(t, env, "sandbox", "create", "web", "--name", "typo", "--deny-out", "mirror.test"); r.Code != 2 || !strings.Contains(r.Stderr, "takes addresses and CIDRs only (a name is matched by --allow-out)") {
		t.Errorf("a name in --deny-out: exit %d, stderr %q; want exit 2 saying why", r.Code, r.Stderr)
	}
	followUntilGone(t, env, wide.Name)
}

// followUntilGone follows sandbox name's egress log with the CLI, removes
// the sandbox, and checks the follow ends saying the sandbox is gone, exit
// 0 (a stream cut by a stop or a reload exits 1 instead, giving the
// command to go on: cmd/sandstormd's TestPrintEgress).
func followUntilGone(t *testing.T, env []string, name string) {
	t.Helper()
	dir := t.TempDir()
	stdout, stderr := filepath.Join(dir, "out"), filepath.Join(dir, "err")
	fo, _ := os.Create(stdout)
	fe, _ := os.Create(stderr)
	defer fo.Close()
	defer fe.Close()
	follow := exec.Command(sandstormdBin, "sandbox", "egress", name, "-f")
	follow.Env = append(os.Environ(), env...)
	follow.Stdout, follow.Stderr = fo, fe
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- follow.Wait() }()
	testenv.WaitFor(t, 30*time.Second, "the followed log's first page (its header)", func() bool {
		b, _ := os.ReadFile(stdout)
		return strings.HasPrefix(string(b), "SEQ ")
	})
	cli(t, env, "sandbox", "rm", name).ok(t, "sandbox rm")
	select {
	case err := <-done:
		b, _ := os.ReadFile(stderr)
		if err != nil || !strings.Contains(string(b), "the sandbox is gone") {
			t.Errorf("a follow of a removed sandbox: %v, stderr %q; want exit 0 saying it is gone", err, b)
		}
	case <-time.After(time.Minute):
		follow.Process.Kill()
		<-done
		t.Errorf("a follow of a removed sandbox still runs a minute after the removal")
	}
}

// checkEgressLog: the egress log of a sandbox with allow-out mirror.test
// and deny-out all lists its flows to mirror.test as allowed, with the
// address reached and bytes both ways, other.test as refused by name at
// its DNS (deny_out all and no address in allow_out: no lookup is made
// for it), and 198.51.100.10 dialled by address refused by deny_out; the
// CLI prints them. It answers the newest seq.
func checkEgressLog(t *testing.T, d *Daemon, env []string, id string) int64 {
	t.Helper()
	var b strings.Builder
	if err := d.C.EgressLog(ctxT(t), id, 0, 0, false, &b); err != nil {
		t.Fatal(err)
	}
	var p api.EgressPage
	if err := json.Unmarshal([]byte(b.String()), &p); err != nil {
		t.Fatalf("the egress log %q: %v", b.String(), err)
	}
	var allowed, refused, byAddress, byDNS int
	for _, f := range p.Items {
		switch {
		case f.Name == "198.51.100.10" && f.Outcome == "denied" && strings.Contains(f.Rule, "0.0.0.0/0"):
			byAddress++
		case f.Name == "elsewhere.test" && f.Route == api.EgressRouteDNS && f.Outcome == "denied":
			byDNS++
		case f.Name == "mirror.test" && f.Outcome == "allowed" && f.Addr != "" && f.BytesOut > 0 && f.BytesIn > 0 && strings.Contains(f.Rule, "allow_out"):
			allowed++
		case f.Name == "other.test" && f.Route == api.EgressRouteDNS && f.Outcome == "denied" && strings.Contains(f.Rule, "deny_out denies every address"):
			// Refused by name, before any lookup (egress.DeniesName).
			refused++
		}
	}
	// Two probes so far, one either side of a snapshot: the log outlives
	// the boundary's restarts.
	if allowed < 2 || refused < 1 || byAddress < 2 || byDNS < 1 {
		t.Errorf("egress log: %d allowed flows to mirror.test and %d to 198.51.100.10 refused by address, want 2 each; %d refusals of other.test by name and %d of elsewhere.test by DNS, want some:\n%s", allowed, byAddress, refused, byDNS, b.String())
	}
	r := cli(t, env, "sandbox", "egress", id)
	r.ok(t, "sandbox egress", "mirror.test:80", "other.test", "allowed", "denied")
	t.Logf("sandbox egress %s:\n%s", id, r.Stdout)
	return p.Next
}

// twoOutsideNames starts an outside network whose one HTTP server answers
// "outside ok" and a resolver giving it two names, mirror.test and
// other.test, and writes policy (YAML) to a file: what a test needs to
// show a name let out and another refused.
func twoOutsideNames(t *testing.T, policy string) (*testDNS, string) {
	t.Helper()
	out := newOutsideNet(t)
	resolver := startTestDNS(t)
	resolver.set("mirror.test", out.server)
	resolver.set("other.test", out.server)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	return resolver, path
}
