package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A program is one of the seed's two: the demo web server, or the 64 MiB
// numpy app, as a rootfs and the command that runs it there.
type program struct {
	Name   string // "web" or "app64"
	Rootfs string
	Args   []string
	Env    []string
}

// A runtime runs copies of a program, each answering HTTP at its own URL.
// Every runtime runs the same rootfs and command; only what runs it
// differs.
type runtime interface {
	// Name is the row's name in the tables.
	Name() string
	// Version says what ran: each component's version.
	Version(ctx context.Context) string
	// Prepare readies prog (an image imported, a template made).
	Prepare(ctx context.Context, prog program) error
	// Start starts copy i of prog and returns the URL its GET / answers
	// at, without waiting for the answer.
	Start(ctx context.Context, prog program, i int) (instance, error)
	// Stop ends one copy.
	Stop(ctx context.Context, in instance) error
	// Close stops every copy still running and undoes Prepare.
	Close(ctx context.Context) error
}

// An instance is one running copy.
type instance struct {
	ID  string
	URL string
}

// basePort is copy 0's port on the host; copy i listens on basePort+i
// (each program honours PORT). Below the ephemeral range.
const basePort = 31000

func copyPort(i int) int { return basePort + i }

// processes tracks the host processes a runtime started (each in its own
// process group), so that Close ends whatever is left.
type processes struct {
	mu    sync.Mutex
	procs map[string]*exec.Cmd
}

func (p *processes) start(cmd *exec.Cmd, id string) error {
	cmd.SysProcAttr = mergeSys(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		return err
	}
	go cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.procs == nil {
		p.procs = map[string]*exec.Cmd{}
	}
	p.procs[id] = cmd
	return nil
}

func mergeSys(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Setpgid = true
	// The benchmark killed: its copies die with it.
	a.Pdeathsig = syscall.SIGKILL
	return a
}

func (p *processes) stop(id string) error {
	p.mu.Lock()
	cmd := p.procs[id]
	delete(p.procs, id)
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("no copy %s", id)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return nil
}

func (p *processes) stopAll() {
	p.mu.Lock()
	ids := make([]string, 0, len(p.procs))
	for id := range p.procs {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		p.stop(id)
	}
}

// copyEnv is prog's environment for copy i.
func copyEnv(prog program, i int) []string {
	return append(append([]string{}, prog.Env...), "PORT="+strconv.Itoa(copyPort(i)))
}

func localURL(i int) string { return fmt.Sprintf("http://127.0.0.1:%d/", copyPort(i)) }

// plain runs the program as a plain process, chrooted into the rootfs so
// that it runs the same Python and libraries as every other runtime.
type plain struct{ processes }

func (*plain) Name() string { return "process" }

func (*plain) Version(ctx context.Context) string { return "Linux " + kernelRelease() }

func (*plain) Prepare(context.Context, program) error { return nil }

func (r *plain) Start(_ context.Context, prog program, i int) (instance, error) {
	cmd := exec.Command(prog.Args[0], prog.Args[1:]...)
	cmd.Env = copyEnv(prog, i)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: prog.Rootfs}
	id := strconv.Itoa(i)
	if err := r.start(cmd, id); err != nil {
		return instance{}, err
	}
	return instance{ID: id, URL: localURL(i)}, nil
}

func (r *plain) Stop(_ context.Context, in instance) error { return r.stop(in.ID) }

func (r *plain) Close(context.Context) error { r.stopAll(); return nil }

// bwrap runs the program under bubblewrap: the rootfs read-only as /, its
// own /proc, /dev and /tmp, and its own PID, IPC and UTS namespaces; the
// network is the host's (as Docker's and Podman's --network host are
// here), so every runtime's copy is reached the same way.
type bwrap struct {
	processes
	bin string
}

func (*bwrap) Name() string { return "bubblewrap" }

func (r *bwrap) Version(ctx context.Context) string { return commandVersion(ctx, r.bin, "--version") }

func (r *bwrap) Prepare(context.Context, program) error {
	p, err := exec.LookPath("bwrap")
	if err != nil {
		return errors.New("bubblewrap is not installed: make bench-baselines-deps (apt-get install bubblewrap)")
	}
	r.bin = p
	return nil
}

func (r *bwrap) Start(_ context.Context, prog program, i int) (instance, error) {
	args := []string{"--ro-bind", prog.Rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--chdir", "/", "--"}
	cmd := exec.Command(r.bin, append(args, prog.Args...)...)
	cmd.Env = copyEnv(prog, i)
	id := strconv.Itoa(i)
	if err := r.start(cmd, id); err != nil {
		return instance{}, err
	}
	return instance{ID: id, URL: localURL(i)}, nil
}

func (r *bwrap) Stop(_ context.Context, in instance) error { return r.stop(in.ID) }

func (r *bwrap) Close(context.Context) error { r.stopAll(); return nil }

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// commandVersion is the first line of `bin args...`, or why not.
func commandVersion(ctx context.Context, bin string, args ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		return fmt.Sprintf("%s: %v %s", filepath.Base(bin), err, line)
	}
	return line
}
