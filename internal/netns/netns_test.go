package netns

import (
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPoolSlots(t *testing.T) {
	p, err := ParsePool("10.213.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	if p.Size() != 16384 {
		t.Fatalf("Size = %d", p.Size())
	}
	h, s, err := p.Addrs(1)
	if err != nil || h != netip.MustParsePrefix("10.213.0.5/30") || s != netip.MustParsePrefix("10.213.0.6/30") {
		t.Fatalf("slot 1 = %v %v %v", h, s, err)
	}
	h, s, _ = p.Addrs(16383)
	if h != netip.MustParsePrefix("10.213.255.253/30") || s != netip.MustParsePrefix("10.213.255.254/30") {
		t.Fatalf("last slot = %v %v", h, s)
	}
	if _, _, err := p.Addrs(16384); err == nil {
		t.Fatal("slot past the end accepted")
	}
	for _, bad := range []string{"10.0.0.0/30", "fd00::/64", "nonsense", "10.0.0.0/4"} {
		if _, err := ParsePool(bad); err == nil {
			t.Errorf("ParsePool(%q) accepted", bad)
		}
	}
}

// TestCreateDelete makes a real namespace and veth, checks both ends carry
// their addresses and answer each other, that Create is idempotent, and that
// Delete leaves nothing.
func TestCreateDelete(t *testing.T) {
	p, _ := ParsePool("10.231.0.0/24")
	h, s, _ := p.Addrs(2)
	n := Net{Name: "sstest-netns", HostIf: "sstestveth0", Host: h, Sandbox: s}
	Delete(n)
	t.Cleanup(func() { Delete(n) })
	if err := Create(n); err != nil {
		t.Fatal(err)
	}
	if err := Create(n); err != nil {
		t.Fatalf("second Create: %v", err)
	}
	out, err := exec.Command("ip", "-n", n.Name, "-4", "addr", "show", "dev", SandboxIf).CombinedOutput()
	if err != nil || !strings.Contains(string(out), s.String()) {
		t.Fatalf("sandbox side: %s %v", out, err)
	}
	// The sandbox side reaches the host end of its own link.
	if out, err := exec.Command("ip", "netns", "exec", n.Name, "ping", "-c", "1", "-W", "2", h.Addr().String()).CombinedOutput(); err != nil {
		t.Fatalf("ping host end: %s %v", out, err)
	}
	if err := Delete(n); err != nil {
		t.Fatal(err)
	}
	if n.Exists() {
		t.Fatal("netns still there")
	}
	if out, _ := exec.Command("ip", "link", "show", n.HostIf).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Fatalf("veth still there: %s", out)
	}
	if err := Delete(n); err != nil {
		t.Fatalf("Delete of absent: %v", err)
	}
}

// TestFirewallSandboxCannotReachHost: with the firewall installed, a
// connection from inside a sandbox namespace to a host listener on the host
// end of its veth is dropped, while the host can still connect into the
// namespace (the gateway's direction).
func TestFirewallSandboxCannotReachHost(t *testing.T) {
	if err := EnsureFirewall("ssv"); err != nil {
		t.Fatal(err)
	}
	p, _ := ParsePool("10.232.0.0/24")
	h, s, _ := p.Addrs(0)
	n := Net{Name: "sstest-fw", HostIf: "ssvtestfw00", Host: h, Sandbox: s}
	Delete(n)
	t.Cleanup(func() { Delete(n) })
	if err := Create(n); err != nil {
		t.Fatal(err)
	}
	// Host listener on the host end; a client in the namespace must not
	// get through (timeout, since the SYN is dropped).
	ln, err := net.Listen("tcp", netip.AddrPortFrom(h.Addr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host\n"))
			c.Close()
		}
	}()
	out, err := exec.Command("ip", "netns", "exec", n.Name, "timeout", "3", "bash", "-c",
		"exec 3<>/dev/tcp/"+h.Addr().String()+"/"+portOf(ln.Addr())+" && cat <&3").CombinedOutput()
	if err == nil || strings.Contains(string(out), "host") {
		t.Fatalf("sandbox reached a host listener: %q %v", out, err)
	}
	// The other way: a listener inside the namespace answers the host.
	srv := exec.Command("ip", "netns", "exec", n.Name, "python3", "-c",
		"import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('"+s.Addr().String()+"',7777));s.listen();c,_=s.accept();c.sendall(b'sandbox\\n');c.close()")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	target := netip.AddrPortFrom(s.Addr(), 7777).String()
	// Wait until the listener is up (a marked probe that is closed unused
	// would use up its single accept, so probe with ss instead).
	for i := 0; i < 100; i++ {
		out, _ := exec.Command("ip", "netns", "exec", n.Name, "ss", "-ltn").CombinedOutput()
		if strings.Contains(string(out), ":7777") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Unmarked, the host is refused at once (a reset) although the
	// listener is up: only the gateway's marked sockets may open
	// connections into a sandbox.
	if _, err := net.DialTimeout("tcp", target, 2*time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("an unmarked host connection into the sandbox: err = %v, want connection refused", err)
	}
	var c net.Conn
	for i := 0; i < 100; i++ {
		var mc net.Conn
		mc, err = markedDialer(0x5353).Dial("tcp", target)
		if err == nil {
			c = mc
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the marked host socket could not reach the namespace: %v", err)
	}
	defer c.Close()
	b, _ := io.ReadAll(c)
	if string(b) != "sandbox\n" {
		t.Fatalf("got %q", b)
	}
}

func markedDialer(mark int) *net.Dialer {
	return &net.Dialer{Timeout: time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, mark) })
		return serr
	}}
}

func portOf(a net.Addr) string {
	return strconv.Itoa(a.(*net.TCPAddr).Port)
}

// TestCreateRefusesTakenSubnet: a second network whose /30 is already on
// another host link is refused instead of silently sharing its route.
func TestCreateRefusesTakenSubnet(t *testing.T) {
	p, _ := ParsePool("10.233.0.0/24")
	h, s, _ := p.Addrs(0)
	a := Net{Name: "sstest-a", HostIf: "sstesta", Host: h, Sandbox: s}
	b := Net{Name: "sstest-b", HostIf: "sstestb", Host: h, Sandbox: s}
	t.Cleanup(func() { Delete(a); Delete(b) })
	if err := Create(a); err != nil {
		t.Fatal(err)
	}
	err := Create(b)
	if err == nil || !strings.Contains(err.Error(), "already on host link sstesta") {
		t.Fatalf("Create over a taken /30: err = %v", err)
	}
	if b.Exists() {
		t.Fatal("refused Create left a namespace behind")
	}
}
