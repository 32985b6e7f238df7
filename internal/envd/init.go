package envd

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// gVisor kills every process that `runsc exec` started, and every process
// those started, when it restores a checkpoint: "the caller is no longer
// connected" (runsc/boot/restore.go, the loop over OriginExec thread
// groups; a task's origin is inherited by its children,
// pkg/sentry/kernel/task_clone.go). So an envd started with runsc exec,
// and the commands it runs, survive a freeze but not a snapshot. A
// template that wants its commands to survive every tier runs envd as
// its sandbox's init instead (api.Process.Envd): envd is then PID 1, the
// template's process its child, and both are the container's own.

// reaper tracks the children envd waits for itself (exec.Cmd.Wait), so
// that as PID 1 it reaps only the others: orphans reparented to it.
var reaper struct {
	mu   sync.Mutex
	ours map[int]bool
}

// started runs start (which starts a child) with the reaper held, and
// records the child as envd's own, so the reaper cannot take its exit
// before its Wait does.
func started(start func() (int, error)) error {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	pid, err := start()
	if err == nil {
		if reaper.ours == nil {
			reaper.ours = map[int]bool{}
		}
		reaper.ours[pid] = true
	}
	return err
}

// waited forgets pid once its Wait returned.
func waited(pid int) {
	reaper.mu.Lock()
	delete(reaper.ours, pid)
	reaper.mu.Unlock()
}

// reapOrphans waits for every exited child of envd that is not its own:
// zombies of processes whose parents died. It reads /proc to find them
// (wait4(-1) would take the exits Wait is waiting for too).
func reapOrphans() {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	me := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || reaper.ours[pid] {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 || f[0] != "Z" || f[1] != strconv.Itoa(me) {
			continue
		}
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}

// forwarded are the signals init passes on to the template's process: a
// stop (runsc kill, SIGTERM), and the warm templates' reseed signals.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Init is envd as the sandbox's PID 1: it runs args (the template's
// process) as its child with envd's own stdio (the sandbox's console),
// serves s on addr beside it, passes on signals, reaps orphans, and ends
// with the child's exit status, as the container would have. With no
// args it serves alone until a stop signal: a template build's step runs
// its command through envd in an image that may have no program of its
// own to keep the sandbox alive (FROM scratch).
func Init(args []string, addr string, s *Server) int {
	if len(args) == 0 {
		return serveAlone(addr, s)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := started(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	}); err != nil {
		fmt.Fprintf(os.Stderr, "sandstorm-envd --init: start %s: %v\n", args[0], err)
		return 127
	}
	go func() {
		if err := ListenAndServe(addr, s); err != nil {
			// Commands and files are gone; the sandbox's own process is
			// not, and goes on.
			fmt.Fprintf(os.Stderr, "sandstorm-envd: %v\n", err)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGCHLD {
				reapOrphans()
				continue
			}
			cmd.Process.Signal(sig)
		case err := <-done:
			waited(cmd.Process.Pid)
			var ee *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &ee):
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ee.ExitCode()
			}
			return 1
		}
	}
}

// serveAlone is Init with no process: envd serves, reaps orphans, and
// ends on a stop signal.
func serveAlone(addr string, s *Server) int {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)
	failed := make(chan error, 1)
	go func() { failed <- ListenAndServe(addr, s) }()
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGCHLD:
				reapOrphans()
			case syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT:
				return 128 + int(sig.(syscall.Signal))
			}
		case err := <-failed:
			fmt.Fprintf(os.Stderr, "sandstorm-envd --init: %v\n", err)
			return 1
		}
	}
}
