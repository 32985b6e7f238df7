// Package handoff passes a daemon's listening sockets across execve(2) to
// the binary that replaces it in the same process, the way nginx and Envoy
// upgrade themselves: nothing is closed, so a connection that arrives while
// the new binary starts waits in the kernel's accept backlog and is served
// by it, instead of being refused (issue 18 item 3).
//
// Every listener the daemon opens goes through a Registry (Listen,
// ListenPacket, File). At a handover, Pause keeps a duplicate of each
// descriptor and closes the Go side: every accept loop ends as if its
// listener were closed, while the socket stays bound and listening in the
// kernel. Exec writes a Record (descriptor numbers and what each is) to a
// 0600 file named by EnvVar, clears FD_CLOEXEC on exactly those
// descriptors and execs. The next process's Adopt reads the record, marks
// the descriptors close-on-exec again at once (no child of the new process
// may inherit them), and hands each to the first owner that asks for the
// same address; CloseUnclaimed closes what nobody asked for once the
// daemon has opened everything it will (a sandbox deleted meanwhile).
//
// Because execve keeps the PID, a service manager sees the same main
// process throughout, and the daemon's children (runsc sandboxes) stay its
// children.
package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/internal/secretfile"
)

// EnvVar names the file holding the Record the previous process left.
const EnvVar = "SANDSTORM_HANDOFF"

// Registry holds a process's listeners and what it inherited.
type Registry struct {
	log *slog.Logger

	mu sync.Mutex
	// inherited are the descriptors of the previous process not yet
	// claimed, by what they were asked for.
	inherited map[key]int
	// live are the listeners, packet sockets and files opened or
	// adopted here (closed ones are pruned now and then).
	live map[key]any
	// prunedAt is len(live) after the last prune.
	prunedAt int
	// paused: Pause has run; held are the duplicates it kept.
	paused bool
	held   []heldFD
	// from is the record this process was started with (zero: none).
	from Record
}

// heldFD is a descriptor kept for the next process.
type heldFD struct {
	entry Entry
	file  *os.File
}

// New returns a registry with nothing inherited.
func New(log *slog.Logger) *Registry {
	if log == nil {
		log = slog.Default()
	}
	return &Registry{log: log, inherited: map[key]int{}, live: map[key]any{}}
}

// Adopt returns the registry of a process started by Exec (EnvVar set), or
// an empty one. It must run before the process starts any child: the
// inherited descriptors are made close-on-exec here, and EnvVar is taken
// out of the environment. A record it cannot use is an error and every
// descriptor it names is closed: the daemon then stops rather than serve
// beside sockets it does not know (its service manager starts it afresh).
func Adopt(log *slog.Logger) (*Registry, error) {
	r := New(log)
	path := os.Getenv(EnvVar)
	if path == "" {
		return r, nil
	}
	os.Unsetenv(EnvVar)
	b, err := os.ReadFile(path)
	os.Remove(path)
	if err != nil {
		return r, fmt.Errorf("%s=%s: %w", EnvVar, path, err)
	}
	rec, err := Decode(b)
	if err != nil {
		closeNamed(b)
		return r, err
	}
	for _, e := range rec.Entries {
		if _, err := unix.FcntlInt(uintptr(e.FD), unix.F_GETFD, 0); err != nil {
			closeNamed(b)
			return r, fmt.Errorf("handoff: descriptor %d (%s) is not open: %w", e.FD, e.key(), err)
		}
		syscall.CloseOnExec(e.FD)
		r.inherited[e.key()] = e.FD
	}
	r.from = rec
	return r, nil
}

// closeNamed closes the descriptors a record names, even one that does
// not decode as a whole, so none stays open unclaimed.
func closeNamed(b []byte) {
	var loose struct {
		Entries []struct {
			FD int `json:"fd"`
		} `json:"entries"`
	}
	if json.Unmarshal(b, &loose) == nil {
		for _, e := range loose.Entries {
			if e.FD > 2 {
				unix.Close(e.FD)
			}
		}
	}
}

// From is the record this process was started with; its Nonce is empty
// when the process was not started by a handover.
func (r *Registry) From() Record { return r.from }

// Inherited reports how many inherited descriptors are still unclaimed.
func (r *Registry) Inherited() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.inherited)
}

// claim takes the inherited descriptor for k, if any.
func (r *Registry) claim(k key) (int, bool) {
	fd, ok := r.inherited[k]
	if ok {
		delete(r.inherited, k)
	}
	return fd, ok
}

// Listen returns a stream listener for network ("tcp…" or "unix") and
// address: the one inherited for them if there is one, else open()'s
// (net.Listen when open is nil). An inherited descriptor that is not a
// listener bound there is closed and a new listener opened.
func (r *Registry) Listen(network, address string, open func() (net.Listener, error)) (net.Listener, error) {
	if open == nil {
		open = func() (net.Listener, error) { return net.Listen(network, address) }
	}
	k := key{KindListener, network, address}
	return reopen(r, k, func(fd int) (net.Listener, error) { return fileListener(fd, network, address) }, open,
		"handoff: an inherited descriptor is not the listener it was said to be; listening afresh", "listener", k)
}

// reopen is what Listen, ListenPacket and File share: under r.mu, the
// descriptor inherited under k as adopt makes it (an error: it is not what
// k says; the warning msg, with attrs, says so), else open's; either is
// tracked.
func reopen[T any](r *Registry, k key, adopt func(fd int) (T, error), open func() (T, error), msg string, attrs ...any) (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fd, ok := r.claim(k); ok {
		v, err := adopt(fd)
		if err == nil {
			r.track(k, v)
			return v, nil
		}
		r.log.Warn(msg, append(attrs, "err", err)...)
	}
	v, err := open()
	if err != nil {
		var none T
		return none, err
	}
	r.track(k, v)
	return v, nil
}

func fileListener(fd int, network, address string) (net.Listener, error) {
	f := os.NewFile(uintptr(fd), address)
	defer f.Close() // FileListener holds a duplicate
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	if !sameAddress(network, address, ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("descriptor %d is bound to %s", fd, ln.Addr())
	}
	return ln, nil
}

// ListenPacket is Listen for a datagram socket (UDP); open nil is
// net.ListenPacket.
func (r *Registry) ListenPacket(network, address string, open func() (net.PacketConn, error)) (net.PacketConn, error) {
	if open == nil {
		open = func() (net.PacketConn, error) { return net.ListenPacket(network, address) }
	}
	k := key{KindPacket, network, address}
	adopt := func(fd int) (net.PacketConn, error) {
		f := os.NewFile(uintptr(fd), address)
		pc, err := net.FilePacketConn(f)
		f.Close()
		if err == nil && !sameAddress(network, address, pc.LocalAddr()) {
			pc.Close()
			err = fmt.Errorf("descriptor %d is bound to %s", fd, pc.LocalAddr())
		}
		return pc, err
	}
	return reopen(r, k, adopt, open, "handoff: an inherited descriptor is not the socket it was said to be; opening afresh", "socket", k)
}

// File returns the open file path inherited, else open()'s. It is for a
// descriptor whose identity is the open file itself — a flock(2) lock
// belongs to the open file description, so the next process holds the
// data dir's lock without a moment in which another daemon could take it.
func (r *Registry) File(path string, open func() (*os.File, error)) (*os.File, error) {
	adopt := func(fd int) (*os.File, error) {
		f := os.NewFile(uintptr(fd), path)
		fi, err1 := f.Stat()
		want, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(fi, want) {
			return f, nil
		}
		f.Close()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("descriptor %d is another file", fd)
	}
	return reopen(r, key{KindFile, "", path}, adopt, open, "handoff: an inherited descriptor is not the file it was said to be; opening afresh", "file", path)
}

// track records v under k (under mu). While paused, a listener opened now
// is kept for the next process at once.
func (r *Registry) track(k key, v any) {
	if r.paused {
		if h, ok := hold(k, v); ok {
			r.held = append(r.held, h)
		}
		return
	}
	r.live[k] = v
	if len(r.live) > 2*r.prunedAt+64 {
		for k, v := range r.live {
			if isClosed(v) {
				delete(r.live, k)
			}
		}
		r.prunedAt = len(r.live)
	}
}

// isClosed reports whether a tracked socket or file was closed by its
// owner.
func isClosed(v any) bool {
	sc, ok := v.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}

// CloseUnclaimed closes the inherited descriptors nobody asked for and
// says which. Call it once the process has opened every listener it will.
func (r *Registry) CloseUnclaimed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, fd := range r.inherited {
		unix.Close(fd)
		r.log.Info("handoff: closed an inherited socket nothing here asked for (its sandbox went away during the handover)", "socket", k.String())
		n++
	}
	clear(r.inherited)
	return n
}

// Pause stops every accept loop while keeping every socket listening: it
// keeps a duplicate of each live descriptor for the next process, then
// closes the Go side of each listener (a Unix listener without removing
// its path) and stops reads on each datagram socket (a read deadline in
// the past; its owner's loop sees timeouts until the exec). From here
// connections wait in their listeners' backlogs, and datagrams in their
// sockets' receive queues, until the next process serves them. It returns
// how many descriptors it holds.
func (r *Registry) Pause() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.paused {
		return len(r.held)
	}
	r.paused = true
	for k, v := range r.live {
		if h, ok := hold(k, v); ok {
			r.held = append(r.held, h)
		}
	}
	clear(r.live)
	return len(r.held)
}

// hold duplicates v's descriptor and closes v's Go side (a file stays
// as it is). ok is false for something already closed.
func hold(k key, v any) (heldFD, bool) {
	switch v := v.(type) {
	case *os.File:
		if isClosed(v) {
			return heldFD{}, false
		}
		return heldFD{Entry{FD: int(v.Fd()), Kind: k.kind, Address: k.address}, v}, true
	case interface{ File() (*os.File, error) }:
		f, err := v.File()
		if err != nil {
			return heldFD{}, false // closed by its owner
		}
		switch v := v.(type) {
		case net.PacketConn:
			// Not closed: a datagram its reader took just now must still
			// get its answer out (UDP has no backlog to leave it in). A
			// read deadline in the past stops the reading; what arrives
			// from here stays queued for the next process — all but one
			// that arrives as the deadline passes, which a reader woken
			// for it may still take and answer (Go's poller lets
			// readiness win): answered by this process, or lost if the
			// exec comes first, as a datagram may be.
			v.SetReadDeadline(time.Unix(1, 0))
		case *net.UnixListener:
			// The path must stay: the next process serves it.
			v.SetUnlinkOnClose(false)
			v.Close()
		case interface{ Close() error }:
			v.Close()
		}
		fd, err := rawFD(f)
		if err != nil {
			f.Close()
			return heldFD{}, false
		}
		return heldFD{Entry{FD: fd, Kind: k.kind, Network: k.network, Address: k.address}, f}, true
	}
	return heldFD{}, false
}

// rawFD is f's descriptor number, read without f.Fd(): Fd puts the
// descriptor in blocking mode, and a dup shares that flag with the socket
// it came from (one open file description). A paused UDP socket's reader
// would then block in recvfrom past its read deadline and take a
// datagram meant for the next process (TestHandoverAcrossExec saw the
// old process answer one, run with -count=3).
func rawFD(f *os.File) (int, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	fd := -1
	if err := sc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		return 0, err
	}
	return fd, nil
}

// Held is the entries Pause kept, in descriptor order.
func (r *Registry) Held() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Entry, 0, len(r.held))
	for _, h := range r.held {
		out = append(out, h.entry)
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.FD - b.FD })
	return out
}

// Exec replaces this process with binary (argv args, environment env plus
// EnvVar), passing every descriptor Pause kept. The record goes to
// dir/handoff.json (0600); nonce names the exec. Exec returns only on
// failure, with the descriptors close-on-exec again; the caller then
// stops as it would on SIGTERM (the sockets are closed with it).
func (r *Registry) Exec(dir, nonce, binary string, args, env []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.paused {
		return errors.New("handoff: Exec before Pause")
	}
	rec := Record{Version: Version, Nonce: nonce, FromPID: os.Getpid()}
	for _, h := range r.held {
		rec.Entries = append(rec.Entries, h.entry)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "handoff.json")
	if err := secretfile.Write(path, b); err != nil {
		return fmt.Errorf("handoff record: %w", err)
	}
	env = append(slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return len(kv) > len(EnvVar) && kv[:len(EnvVar)+1] == EnvVar+"="
	}), EnvVar+"="+path)
	// No fork may happen between clearing FD_CLOEXEC and the exec, or a
	// child (a runsc command) would keep the listeners open for its life:
	// os/exec forks under ForkLock's read lock.
	syscall.ForkLock.Lock()
	defer syscall.ForkLock.Unlock()
	for _, h := range r.held {
		if _, err := unix.FcntlInt(uintptr(h.entry.FD), unix.F_SETFD, 0); err != nil {
			r.cloexecAll()
			os.Remove(path)
			return fmt.Errorf("handoff: descriptor %d (%s): clear close-on-exec: %w", h.entry.FD, h.entry.key(), err)
		}
	}
	err = syscall.Exec(binary, args, env)
	r.cloexecAll()
	os.Remove(path)
	return fmt.Errorf("handoff: exec %s: %w", binary, err)
}

func (r *Registry) cloexecAll() {
	for _, h := range r.held {
		syscall.CloseOnExec(h.entry.FD)
	}
}

// Describe is a one-line account of what is held, for logs.
func Describe(entries []Entry) string {
	n := map[string]int{}
	for _, e := range entries {
		n[e.Kind+"/"+e.Network]++
	}
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s := ""
	for _, k := range keys {
		if s != "" {
			s += ", "
		}
		s += strconv.Itoa(n[k]) + " " + k
	}
	return s
}
