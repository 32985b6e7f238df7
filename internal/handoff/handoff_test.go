package handoff

import (
	"bufio"
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
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/internal/testenv"
)

// The tests below run a helper process (this test binary, see TestMain)
// that listens through a Registry, pauses, and execs itself: a real
// execve(2) in the same PID, as sandstormd's reload does.

func TestMain(m *testing.M) {
	if os.Getenv("HANDOFF_HELPER") != "" {
		helperMain()
		return
	}
	os.Exit(m.Run())
}

// helperMain serves "gen=<generation> pid=<pid>" on a TCP and a Unix
// listener and a UDP socket, holds a flock on a lock file, and obeys
// commands on stdin: pause, exec, exit. Its generation is "1", or the
// nonce of the record it was started with.
func helperMain() {
	out := bufio.NewWriter(os.Stdout)
	say := func(f string, a ...any) { fmt.Fprintf(out, f+"\n", a...); out.Flush() }
	reg, err := Adopt(nil)
	if err != nil {
		say("adopt-failed %v", err)
		os.Exit(1)
	}
	gen := "1"
	if reg.From().Nonce != "" {
		gen = reg.From().Nonce
	}
	hello := fmt.Sprintf("gen=%s pid=%d\n", gen, os.Getpid())
	lockPath := os.Getenv("HANDOFF_LOCK")
	if _, err := reg.File(lockPath, func() (*os.File, error) {
		f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		}
		return f, err
	}); err != nil {
		say("lock-failed %v", err)
		os.Exit(1)
	}
	serve := func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed by Pause
			}
			io.WriteString(c, hello)
			c.Close()
		}
	}
	tcp, err := reg.Listen("tcp", os.Getenv("HANDOFF_TCP"), nil)
	if err != nil {
		say("listen-failed %v", err)
		os.Exit(1)
	}
	go serve(tcp)
	if gen == "1" || os.Getenv("HANDOFF_SKIP_UNIX") == "" {
		ul, err := reg.Listen("unix", os.Getenv("HANDOFF_UNIX"), nil)
		if err != nil {
			say("listen-failed %v", err)
			os.Exit(1)
		}
		go serve(ul)
	}
	pc, err := reg.ListenPacket("udp", os.Getenv("HANDOFF_UDP"), nil)
	if err != nil {
		say("listen-failed %v", err)
		os.Exit(1)
	}
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				time.Sleep(5 * time.Millisecond) // paused: the exec comes
				continue
			}
			if err != nil {
				return
			}
			pc.WriteTo([]byte(hello), from)
		}
	}()
	closed := reg.CloseUnclaimed()
	say("ready %s %d %d", gen, os.Getpid(), closed)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch cmd := in.Text(); cmd {
		case "pause":
			say("paused %d", reg.Pause())
		case "exec":
			err := reg.Exec(os.Getenv("HANDOFF_DIR"), "2", os.Args[0], os.Args, os.Environ())
			say("exec-failed %v", err)
		case "exit":
			os.Exit(0)
		}
	}
}

type helper struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *bufio.Scanner
	tcp     string
	unix    string
	udp     string
	lock    string
	dir     string
	exited  chan struct{}
	lastOut string
}

func startHelper(t *testing.T, extra ...string) *helper {
	dir := t.TempDir()
	h := &helper{t: t, dir: dir, tcp: testenv.FreeAddr(t), unix: filepath.Join(dir, "agent.sock"), lock: filepath.Join(dir, "lock")}
	// A free UDP port on loopback.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.udp = pc.LocalAddr().String()
	pc.Close()
	h.cmd = exec.Command(os.Args[0], "-test.run=^$")
	h.cmd.Env = append(os.Environ(), "HANDOFF_HELPER=1", "HANDOFF_TCP="+h.tcp, "HANDOFF_UNIX="+h.unix,
		"HANDOFF_UDP="+h.udp, "HANDOFF_LOCK="+h.lock, "HANDOFF_DIR="+dir)
	h.cmd.Env = append(h.cmd.Env, extra...)
	h.cmd.Stderr = os.Stderr
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.out = bufio.NewScanner(stdout)
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.exited = make(chan struct{})
	go func() { h.cmd.Wait(); close(h.exited) }()
	t.Cleanup(func() {
		h.in.Close()
		h.cmd.Process.Kill()
		<-h.exited
	})
	return h
}

// expect reads the helper's next line and checks it starts with prefix.
func (h *helper) expect(prefix string) []string {
	h.t.Helper()
	if !h.out.Scan() {
		h.t.Fatalf("helper ended (%v) before %q; last line %q", h.out.Err(), prefix, h.lastOut)
	}
	h.lastOut = h.out.Text()
	if !strings.HasPrefix(h.lastOut, prefix) {
		h.t.Fatalf("helper said %q, want %q…", h.lastOut, prefix)
	}
	return strings.Fields(h.lastOut)
}

func (h *helper) send(cmd string) {
	h.t.Helper()
	if _, err := io.WriteString(h.in, cmd+"\n"); err != nil {
		h.t.Fatal(err)
	}
}

func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read from %s: %v", c.RemoteAddr(), err)
	}
	return string(b)
}

// TestHandoverAcrossExec: a TCP and a Unix connection and a UDP datagram
// sent while the process is paused are served by the binary it execs, in
// the same PID, and the flock on the lock file is never let go.
func TestHandoverAcrossExec(t *testing.T) {
	h := startHelper(t)
	ready := h.expect("ready 1 ")
	pid := ready[2]
	if pid != strconv.Itoa(h.cmd.Process.Pid) {
		t.Fatalf("helper says pid %s, started as %d", pid, h.cmd.Process.Pid)
	}
	c, err := net.Dial("tcp", h.tcp)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c); got != "gen=1 pid="+pid+"\n" {
		t.Fatalf("before: %q", got)
	}

	h.send("pause")
	if n := h.expect("paused ")[1]; n != "4" {
		t.Fatalf("paused %s descriptors, want 4 (tcp, unix, udp, lock)", n)
	}
	// Nothing accepts now, yet every socket is there: connects complete
	// in the kernel's backlog and wait.
	waitTCP, err := net.Dial("tcp", h.tcp)
	if err != nil {
		t.Fatalf("a connect while paused was refused: %v", err)
	}
	waitUnix, err := net.Dial("unix", h.unix)
	if err != nil {
		t.Fatalf("a connect to the Unix socket while paused failed: %v", err)
	}
	udp, err := net.Dial("udp", h.udp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := udp.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	// The lock is held throughout.
	lockBusy := func() bool {
		f, err := os.OpenFile(h.lock, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return errors.Is(syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), syscall.EWOULDBLOCK)
	}
	if !lockBusy() {
		t.Fatal("the lock was free while paused")
	}

	h.send("exec")
	ready = h.expect("ready 2 ")
	if ready[2] != pid {
		t.Fatalf("after the exec the helper is pid %s, want %s (the same process)", ready[2], pid)
	}
	want := "gen=2 pid=" + pid + "\n"
	if got := readAll(t, waitTCP); got != want {
		t.Fatalf("the TCP connection made while paused got %q, want %q", got, want)
	}
	if got := readAll(t, waitUnix); got != want {
		t.Fatalf("the Unix connection made while paused got %q, want %q", got, want)
	}
	// The datagram is answered, by the next process as a rule; the old one
	// may still take it if its reader was woken for it at the instant the
	// read deadline passed (Go's poller lets readiness win that race; seen
	// once in a few dozen runs of the package with -count=3).
	if got := readAll(t, udpConn{udp}); got != want && got != "gen=1 pid="+pid+"\n" {
		t.Fatalf("the datagram sent while paused got %q, want %q", got, want)
	}
	if !lockBusy() {
		t.Fatal("the lock was let go across the exec")
	}
	if _, err := os.Stat(filepath.Join(h.dir, "handoff.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the handoff record is still there after the exec: %v", err)
	}
	// The new binary's descriptors are close-on-exec again: a child of
	// it would not inherit them. /proc/<pid>/fdinfo says the flags.
	flags := fdFlags(t, pid, h.tcp)
	if flags&unix.O_CLOEXEC == 0 {
		t.Fatalf("the inherited TCP listener is not close-on-exec in the new process (flags %o)", flags)
	}
	h.send("exit")
}

// udpConn reads one datagram as if it were a stream.
type udpConn struct{ net.Conn }

func (u udpConn) Read(b []byte) (int, error) {
	n, err := u.Conn.Read(b)
	if err == nil {
		return n, io.EOF
	}
	return n, err
}

// fdFlags returns the open flags (fdinfo's "flags:", octal) of the
// descriptor in process pid listening on addr.
func fdFlags(t *testing.T, pid, addr string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	inode := ""
	for _, line := range strings.Split(readFile(t, "/proc/net/tcp"), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && strings.HasSuffix(f[1], fmt.Sprintf(":%04X", atoi(t, port))) && f[3] == "0A" {
			inode = f[9]
		}
	}
	if inode == "" {
		t.Fatalf("no listener on %s in /proc/net/tcp", addr)
	}
	for _, e := range ents {
		link, _ := os.Readlink("/proc/" + pid + "/fd/" + e.Name())
		if link == "socket:["+inode+"]" {
			for _, l := range strings.Split(readFile(t, "/proc/"+pid+"/fdinfo/"+e.Name()), "\n") {
				if v, ok := strings.CutPrefix(l, "flags:"); ok {
					n, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
					if err != nil {
						t.Fatal(err)
					}
					return int(n)
				}
			}
		}
	}
	t.Fatalf("process %s holds no descriptor of socket %s", pid, inode)
	return 0
}

func readFile(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestUnclaimedAreClosed: a socket the next process does not ask for (a
// sandbox deleted during the handover) is closed once it has opened what
// it will, so a connection waiting on it ends rather than hangs.
func TestUnclaimedAreClosed(t *testing.T) {
	h := startHelper(t, "HANDOFF_SKIP_UNIX=1")
	h.expect("ready 1 ")
	h.send("pause")
	h.expect("paused 4")
	waiting, err := net.Dial("unix", h.unix)
	if err != nil {
		t.Fatal(err)
	}
	h.send("exec")
	if closed := h.expect("ready 2 ")[3]; closed != "1" {
		t.Fatalf("the new process closed %s unclaimed sockets, want 1 (the Unix one)", closed)
	}
	waiting.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := waiting.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection waiting on the unclaimed socket read %d, %v; want it ended", n, err)
	}
	if _, err := net.Dial("unix", h.unix); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial of the unclaimed socket's path: %v, want connection refused", err)
	}
	h.send("exit")
}

// TestExecFailure: an exec that fails leaves the descriptors close-on-exec
// again and no record behind.
func TestExecFailure(t *testing.T) {
	dir := t.TempDir()
	r := New(nil)
	ln, err := r.Listen("tcp", testenv.FreeAddr(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if n := r.Pause(); n != 1 {
		t.Fatalf("Pause held %d, want 1", n)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Pause: %v, want net.ErrClosed (the Go side is closed)", err)
	}
	err = r.Exec(dir, "x", filepath.Join(dir, "no-such-binary"), []string{"x"}, os.Environ())
	if err == nil || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("Exec of a missing binary: %v", err)
	}
	for _, e := range r.Held() {
		fl, err := unix.FcntlInt(uintptr(e.FD), unix.F_GETFD, 0)
		if err != nil || fl&unix.FD_CLOEXEC == 0 {
			t.Fatalf("descriptor %d after a failed exec: flags %d, %v; want close-on-exec", e.FD, fl, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "handoff.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("record left after a failed exec: %v", err)
	}
}

// TestAdoptRefusesABadRecord: a record this binary cannot use is an error,
// and the descriptors it names are closed, not left open unclaimed.
func TestAdoptRefusesABadRecord(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	fd := int(f.Fd())
	rec := filepath.Join(dir, "handoff.json")
	if err := os.WriteFile(rec, []byte(fmt.Sprintf(`{"version":99,"nonce":"n","entries":[{"fd":%d,"kind":"listener","network":"tcp","address":"127.0.0.1:1"}]}`, fd)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar, rec)
	if _, err := Adopt(nil); err == nil || !strings.Contains(err.Error(), "version 99") {
		t.Fatalf("Adopt of a version-99 record: %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("descriptor %d named by the bad record is still open (%v)", fd, err)
	}
	if os.Getenv(EnvVar) != "" {
		t.Fatalf("%s left in the environment", EnvVar)
	}
}

// TestAdoptRefusesAWrongDescriptor: a record that names a descriptor bound
// elsewhere than it says is not served: the listener is opened afresh.
func TestAdoptRefusesAWrongDescriptor(t *testing.T) {
	dir := t.TempDir()
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := other.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	want := testenv.FreeAddr(t)
	rec := filepath.Join(dir, "handoff.json")
	os.WriteFile(rec, []byte(fmt.Sprintf(`{"version":1,"nonce":"n","entries":[{"fd":%d,"kind":"listener","network":"tcp","address":%q}]}`, f.Fd(), want)), 0o600)
	t.Setenv(EnvVar, rec)
	r, err := Adopt(nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := r.Listen("tcp", want, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if ln.Addr().String() != want {
		t.Fatalf("listening on %s, want %s", ln.Addr(), want)
	}
}
