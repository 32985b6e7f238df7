package boundary

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// sandboxNet is a network namespace standing in for a sandbox: a veth
// pair, the host end addressed, TCP to the synthetic pool redirected to the
// boundary's transparent port by an nftables table of the test's own.
type sandboxNet struct {
	ns, hostIf, table string
	host, peer        netip.Addr
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func newSandboxNet(t testing.TB, transparentPort int, outside ...netip.Prefix) *sandboxNet {
	t.Helper()
	var rb [2]byte
	rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	n := &sandboxNet{
		ns:     "sbt-" + id,
		hostIf: "sbt" + id + "h",
		table:  "sbtest" + id,
		host:   netip.AddrFrom4([4]byte{10, 254, rb[0], rb[1]&0xfc | 1}),
		peer:   netip.AddrFrom4([4]byte{10, 254, rb[0], rb[1]&0xfc | 2}),
	}
	peerIf := "sbt" + id + "s"
	t.Cleanup(func() {
		exec.Command("nft", "delete", "table", "ip", n.table).Run()
		exec.Command("ip", "link", "del", n.hostIf).Run()
		exec.Command("ip", "netns", "del", n.ns).Run()
	})
	run(t, "ip", "netns", "add", n.ns)
	run(t, "ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", peerIf, "netns", n.ns)
	run(t, "ip", "addr", "add", n.host.String()+"/30", "dev", n.hostIf)
	run(t, "ip", "link", "set", n.hostIf, "up")
	run(t, "ip", "-n", n.ns, "addr", "add", n.peer.String()+"/30", "dev", peerIf)
	run(t, "ip", "-n", n.ns, "link", "set", peerIf, "up")
	run(t, "ip", "-n", n.ns, "link", "set", "lo", "up")
	run(t, "ip", "-n", n.ns, "route", "add", DefaultSynthetic.String(), "via", n.host.String())
	// Addresses outside, dialled as themselves: routed to the host and
	// redirected to the boundary as the node's firewall does.
	var redirect strings.Builder
	for _, p := range append([]netip.Prefix{DefaultSynthetic}, outside...) {
		if p != DefaultSynthetic {
			run(t, "ip", "-n", n.ns, "route", "add", p.String(), "via", n.host.String())
		}
		fmt.Fprintf(&redirect, "\t\tiifname \"%s\" ip daddr %s tcp dport 1-65535 redirect to :%d\n", n.hostIf, p, transparentPort)
	}
	rules := fmt.Sprintf(`table ip %s {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
%s	}
}
`, n.table, redirect.String())
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	return n
}

// inside runs fn on a thread inside the namespace: sockets fn opens belong
// to the sandbox's network, exactly as a program in the sandbox would open
// them.
func (n *sandboxNet) inside(t testing.TB, fn func()) {
	t.Helper()
	done := make(chan struct{})
	var ferr error
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ferr = err
			return
		}
		defer orig.Close()
		h, err := netns.GetFromName(n.ns)
		if err != nil {
			ferr = err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ferr = err
			return
		}
		fn()
		if err := netns.Set(orig); err != nil {
			return // leave the thread locked: it dies with the goroutine
		}
		runtime.UnlockOSThread()
	}()
	<-done
	if ferr != nil {
		t.Fatal(ferr)
	}
}

// A program in the sandbox that knows nothing of SOCKS: it asks the
// boundary's DNS, connects to the synthetic address, and the boundary
// handles the flow by name. Unknown addresses and denied names go nowhere.
func TestTransparent(t *testing.T) {
	const tport = 15001
	sn := newSandboxNet(t, tport)
	e := newEnv(t, "agent-a", sn.host, func(c *Config) { c.Peer = sn.peer })
	ln, accepted := echoServer(t, "127.0.0.1:0")
	dnsSrv := netip.AddrPortFrom(sn.host, DefaultDNSPort).String()

	type result struct {
		allowedIP, meshIP     net.IP
		deniedRcode           int
		echo                  string
		echoErr, afterBye     error
		meshStatus            int
		meshBody              string
		unknownErr, directErr error
		deniedConnErr         error
	}
	var r result
	sn.inside(t, func() {
		c := &dns.Client{Timeout: 5 * time.Second}
		q := func(name string) *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			resp, _, err := c.Exchange(m, dnsSrv)
			if err != nil {
				t.Errorf("DNS %s from the sandbox: %v", name, err)
				return new(dns.Msg)
			}
			return resp
		}
		if m := q("allowed.test."); len(m.Answer) == 1 {
			r.allowedIP = m.Answer[0].(*dns.A).A
		}
		if m := q("mesh.sam.alt."); len(m.Answer) == 1 {
			r.meshIP = m.Answer[0].(*dns.A).A
		}
		r.deniedRcode = q("denied.test.").Rcode

		// The allowed external name, by its synthetic address.
		if r.allowedIP != nil {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(r.allowedIP.String(), fmt.Sprint(portOf(t, ln))), 5*time.Second)
			if err != nil {
				r.echoErr = err
			} else {
				conn.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(conn)
				io.WriteString(conn, "from the sandbox\n")
				r.echo, r.echoErr = br.ReadString('\n')
				io.WriteString(conn, "bye\n")
				br.ReadString('\n')
				_, r.afterBye = br.ReadByte()
				conn.Close()
			}
		}
		// The mesh, by plain HTTP to its synthetic address.
		if r.meshIP != nil {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(r.meshIP.String(), "80"), 5*time.Second)
			if err == nil {
				conn.SetDeadline(time.Now().Add(10 * time.Second))
				io.WriteString(conn, "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Principal: root\r\nConnection: close\r\n\r\n")
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					r.meshStatus, r.meshBody = resp.StatusCode, string(b)
				}
				conn.Close()
			}
		}
		// A synthetic address nobody was answered, and the transparent
		// port addressed directly: both reset.
		read := func(addr string) error {
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			// The reset may arrive before the write, which then reports it.
			if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\n\r\n"); err != nil {
				return err
			}
			_, err = conn.Read(make([]byte, 1))
			return err
		}
		r.unknownErr = read("169.254.127.200:80")
		r.directErr = read(netip.AddrPortFrom(sn.host, tport).String())
	})

	if r.allowedIP == nil || r.meshIP == nil {
		t.Fatalf("no synthetic addresses: %+v", r)
	}
	if r.deniedRcode != dns.RcodeNameError {
		t.Errorf("denied.test: %s", dns.RcodeToString[r.deniedRcode])
	}
	if r.echo != "ECHO from the sandbox\n" || r.echoErr != nil {
		t.Errorf("allowed name through the transparent path: %q %v", r.echo, r.echoErr)
	}
	if !isReset(r.afterBye) {
		t.Errorf("after the far side closed: %v, want a reset", r.afterBye)
	}
	if r.meshStatus != 200 || !strings.Contains(r.meshBody, `"X-Sam-Principal":["agent-a"]`) {
		t.Errorf("mesh through the transparent path: %d %s", r.meshStatus, r.meshBody)
	}
	if !isReset(r.unknownErr) || !isReset(r.directErr) {
		t.Errorf("unknown synthetic address: %v; transparent port directly: %v; want resets", r.unknownErr, r.directErr)
	}
	if accepted.Load() != 1 {
		t.Errorf("echo server accepted %d connections, want 1", accepted.Load())
	}
	st := e.b.Stats()
	if st.Flows["transparent_unknown/refused"] != 2 || st.Flows["external/allowed"] != 1 || st.Flows["mesh/allowed"] != 1 {
		t.Errorf("stats: %v", st.Flows)
	}

	// Policy changes after the DNS answer: the flow is decided again, on
	// the name, and denied without being dialled.
	e.pol.Store(mustPolicy(t, "roles: [{name: r, egress: [other.test]}]\nbindings: [{principal: agent-a, roles: [r]}]"))
	_, dialledBefore := e.rec.touched()
	var deniedErr error
	sn.inside(t, func() {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(r.allowedIP.String(), fmt.Sprint(portOf(t, ln))), 5*time.Second)
		if err != nil {
			deniedErr = err
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, deniedErr = conn.Read(make([]byte, 1))
	})
	if !isReset(deniedErr) {
		t.Errorf("revoked name: %v, want a reset", deniedErr)
	}
	if _, dialled := e.rec.touched(); len(dialled) != len(dialledBefore) {
		t.Errorf("revoked name dialled: %v", dialled)
	}
	if st := e.b.Stats(); st.Flows["external/denied"] != 1 {
		t.Errorf("stats: %v", st.Flows)
	}
}

// The transparent path goes through the same address check: a program in
// the sandbox that resolves an allowed name (answered a synthetic address)
// whose real address is the node's loopback or its metadata address is
// reset, and the listener there sees nothing.
func TestTransparentAddressGuard(t *testing.T) {
	const tport = 15001
	sn := newSandboxNet(t, tport)
	e := newRebindEnv(t, sn.host, func(c *Config) { c.Peer = sn.peer })
	ln, accepted := echoServer(t, "127.0.0.1:0")
	dnsSrv := netip.AddrPortFrom(sn.host, DefaultDNSPort).String()
	names := []string{"loopback.rebind.test.", "metadata.rebind.test.", "node.rebind.test.", "sandbox.rebind.test."}
	errs := map[string]error{}
	var goodEcho string
	sn.inside(t, func() {
		c := &dns.Client{Timeout: 5 * time.Second}
		dial := func(name string) (net.Conn, error) {
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			resp, _, err := c.Exchange(m, dnsSrv)
			if err != nil || len(resp.Answer) != 1 {
				return nil, fmt.Errorf("DNS %s: %v %v", name, err, resp)
			}
			ip := resp.Answer[0].(*dns.A).A
			return net.DialTimeout("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(portOf(t, ln))), 5*time.Second)
		}
		for _, name := range names {
			conn, err := dial(name)
			if err != nil {
				errs[name] = err
				continue
			}
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			errs[name] = err
			conn.Close()
		}
		if conn, err := dial("good.test."); err == nil {
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(conn, "hi\n")
			goodEcho, _ = bufio.NewReader(conn).ReadString('\n')
			conn.Close()
		}
	})
	for _, name := range names {
		if !isReset(errs[name]) {
			t.Errorf("%s through the transparent path: %v, want a reset", name, errs[name])
		}
	}
	if goodEcho != "ECHO hi\n" {
		t.Errorf("a good name through the transparent path: %q", goodEcho)
	}
	if accepted.Load() != 1 {
		t.Errorf("the listener accepted %d connections, want only the good one", accepted.Load())
	}
	st := e.b.Stats()
	if st.AddressRefusals["loopback"] != 1 || st.AddressRefusals["link_local"] != 1 || st.AddressRefusals["node"] != 1 || st.AddressRefusals["sandbox"] != 1 {
		t.Errorf("refusals: %v", st.AddressRefusals)
	}
	// From the host, the sandbox-facing listeners answer nobody: the
	// connection comes from the host's own address, not the sandbox's.
	c, err := net.DialTimeout("tcp", netip.AddrPortFrom(sn.host, DefaultProxyPort).String(), 5*time.Second)
	if err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if !isReset(err) && err != io.EOF {
		t.Errorf("the host connecting to the boundary's proxy port: %v, want a reset", err)
	}
	testenv.WaitFor(t, 10*time.Second, "one foreign flow counted", func() bool { return e.b.Stats().Foreign == 1 })
}

// A program that dials an address itself, not a name: the node sends the
// connection to its boundary as well, which decides it on the address as
// a SOCKS5 CONNECT to it — an exact-IP grant goes out, an address the
// policy does not name is reset without a dial — and both are in the
// egress log.
func TestTransparentLiteral(t *testing.T) {
	const tport = 15001
	sn := newSandboxNet(t, tport, netip.MustParsePrefix("198.51.100.0/24"))
	var mu sync.Mutex
	var flows []api.EgressFlow
	newEnv(t, "agent-a", sn.host, func(c *Config) {
		c.Peer = sn.peer
		c.Flows = func(f api.EgressFlow) { mu.Lock(); flows = append(flows, f); mu.Unlock() }
	})
	ln, accepted := echoServer(t, "127.0.0.2:0") // 198.51.100.2 (outside)
	port := fmt.Sprint(portOf(t, ln))
	var echo string
	var echoErr, refusedErr, selfErr error
	// dialRead connects and reads: a refused flow is reset after the
	// boundary completes the handshake.
	dialRead := func(host, port string) error {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		return err
	}
	sn.inside(t, func() {
		// 198.51.100.2 is granted by itself (testPolicy).
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("198.51.100.2", port), 5*time.Second)
		if err != nil {
			echoErr = err
		} else {
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(conn, "by address\n")
			echo, echoErr = bufio.NewReader(conn).ReadString('\n')
			conn.Close()
		}
		// 198.51.100.1 is where granted names lead, but no grant names
		// the address itself.
		refusedErr = dialRead("198.51.100.1", port)
		// The transparent port dialled as itself, not redirected: it
		// names no destination.
		selfErr = dialRead(sn.host.String(), fmt.Sprint(tport))
	})
	if !isReset(selfErr) {
		t.Errorf("the transparent port dialled as itself: %v, want a reset", selfErr)
	}
	if echo != "ECHO by address\n" || echoErr != nil {
		t.Errorf("a granted address dialled from the sandbox: %q, %v", echo, echoErr)
	}
	if !isReset(refusedErr) {
		t.Errorf("an address no grant names: %v, want a reset", refusedErr)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("the server accepted %d connections, want 1", n)
	}
	testenv.WaitFor(t, 10*time.Second, "three flows logged", func() bool { mu.Lock(); defer mu.Unlock(); return len(flows) >= 3 })
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, f := range flows {
		got = append(got, f.Name+" "+f.Outcome)
	}
	// An allowed flow is logged when it ends, a refused one at once: in
	// either order.
	want := []string{"198.51.100.2 allowed", "198.51.100.1 denied", sn.host.String() + " refused"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("egress log %q", got)
	}
}
