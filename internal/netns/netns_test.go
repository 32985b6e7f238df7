package netns

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
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
	p, _ := ParsePool("10.196.0.0/24")
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
	p, _ := ParsePool("10.197.0.0/24")
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
	p, _ := ParsePool("10.198.0.0/24")
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

// TestConcurrentCreateDelete: many sandboxes' networks created and deleted
// at the same moment all succeed. Each Create and Delete changes the host's
// link and address tables, so a dump another one is reading at that moment
// comes back flagged NLM_F_DUMP_INTR (netlink's ErrDumpInterrupted, "results
// may be incomplete or inconsistent"); none of that may reach the caller.
func TestConcurrentCreateDelete(t *testing.T) {
	const n, rounds = 64, 3
	// Outside 10.200-254/16, which the end-to-end tests' daemons pick from.
	p, _ := ParsePool("10.199.0.0/24")
	nets := make([]Net, n)
	for i := range nets {
		h, s, err := p.Addrs(i)
		if err != nil {
			t.Fatal(err)
		}
		nets[i] = Net{Name: fmt.Sprintf("sstest-conc%02d", i), HostIf: fmt.Sprintf("sstestc%02d", i), Host: h, Sandbox: s}
		Delete(nets[i])
	}
	t.Cleanup(func() {
		for _, nw := range nets {
			Delete(nw)
		}
	})
	// Every goroutine creates, then deletes, its own network, rounds times,
	// all starting together, so creates overlap creates and deletes.
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
		start = make(chan struct{})
	)
	for _, nw := range nets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for r := 0; r < rounds; r++ {
				if err := Create(nw); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("round %d: Create %s: %w", r, nw.Name, err))
					mu.Unlock()
					return
				}
				if r == rounds-1 {
					return // the last round's networks are checked below
				}
				if err := Delete(nw); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("round %d: Delete %s: %w", r, nw.Name, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.Fatalf("%d of %d goroutines failed", len(errs), n)
	}
	// Every network is complete: both addresses on the right links.
	for _, nw := range nets {
		out, err := exec.Command("ip", "-4", "-o", "addr", "show", "dev", nw.HostIf).CombinedOutput()
		if err != nil || !strings.Contains(string(out), nw.Host.String()) {
			t.Errorf("%s: host side: %s %v", nw.Name, out, err)
		}
		out, err = exec.Command("ip", "-n", nw.Name, "-4", "-o", "addr", "show", "dev", SandboxIf).CombinedOutput()
		if err != nil || !strings.Contains(string(out), nw.Sandbox.String()) {
			t.Errorf("%s: sandbox side: %s %v", nw.Name, out, err)
		}
	}
	// And all go away together too.
	for _, nw := range nets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := Delete(nw); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	for _, nw := range nets {
		if nw.Exists() || linkExists(nw.HostIf) {
			t.Errorf("%s: still there after Delete", nw.Name)
		}
	}
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// TestDeleteAfterIPNetnsAdd: a sandbox network created before anyone ran
// `ip netns add` (an operator, `sandstormd doctor`, another test) can still
// be deleted after. When Dir is not a mount point, `ip netns add` binds it
// recursively onto itself, which mounts every namespace already there a
// second time, hidden under the new mount: Delete unmounted only the
// visible copy and the file could not be removed (EBUSY), and the hidden
// mount kept the namespace alive. The test runs itself again in a mount
// namespace of its own with a tmpfs over /run, where Dir is a plain
// directory as on a freshly booted machine.
func TestDeleteAfterIPNetnsAdd(t *testing.T) {
	p, _ := ParsePool("10.199.1.0/24")
	h, s, _ := p.Addrs(0)
	n := Net{Name: "sstest-ipadd", HostIf: "sstestipadd", Host: h, Sandbox: s}
	if os.Getenv("SSTEST_FRESH_RUN") == "" {
		Delete(n)
		// The veth lives in the host's network namespace: clean it here
		// should the run below fail half-way.
		t.Cleanup(func() { Delete(n) })
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--",
			os.Args[0], "-test.run=^TestDeleteAfterIPNetnsAdd$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "SSTEST_FRESH_RUN=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestDeleteAfterIPNetnsAdd") {
			t.Fatalf("in a mount namespace of its own: %v\n%s", err, out)
		}
		return
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%q: %v: %s", args, err, out)
		}
	}
	run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
	if err := Create(n); err != nil {
		t.Fatal(err)
	}
	run("ip", "netns", "add", "sstest-other")
	defer exec.Command("ip", "netns", "delete", "sstest-other").Run()
	if err := Delete(n); err != nil {
		t.Fatalf("Delete after ip netns add: %v", err)
	}
	if n.Exists() {
		t.Fatal("netns file still there")
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), "/"+n.Name+" ") {
		t.Fatalf("a mount of %s is left:\n%s", n.Name, mi)
	}
}

// TestDeleteHalfDeleted: a delete cut short between its unmount and its
// remove (the daemon killed there) leaves the namespace's file with
// nothing mounted on it; the next Delete removes it instead of failing
// with EINVAL, as it did in TestCrashRestart/mid_snapshot.
func TestDeleteHalfDeleted(t *testing.T) {
	n := Net{Name: "sstest-half", HostIf: "sstesthalf"}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		t.Fatalf("%s: %v (the netns tests run as root, as CI does)", Dir, err)
	}
	if err := os.WriteFile(n.Path(), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(n.Path())
	if err := Delete(n); err != nil {
		t.Fatalf("Delete of a namespace file with nothing mounted on it: %v", err)
	}
	if n.Exists() {
		t.Error("the file is still there")
	}
}
