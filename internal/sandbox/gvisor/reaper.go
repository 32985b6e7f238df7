package gvisor

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// StartReaper makes this process the child subreaper of the runsc sandboxes
// it starts and reaps them as soon as they exit.
//
// Why: `runsc run -detach` exits after starting a sandbox, so the sandbox
// and gofer processes are re-parented. Without a subreaper they go to init,
// which on the VMs we run on reaps about once a second, and `runsc delete`
// waits for the sandbox process to disappear: measured here, every delete
// right after a checkpoint took 1.1–1.2 s of waiting for a zombie. As their
// subreaper we reap them at once (delete after checkpoint: ~40 ms).
//
// Only zombies whose command name is "exe" are reaped: runsc starts its
// sandbox and gofer by executing /proc/self/exe, so that is their name in
// /proc/<pid>/stat (argv[0] says runsc-sandbox, but a zombie has no argv).
// The commands this daemon runs through os/exec (nsenter, runsc, ip, nft,
// sh) never carry that name, so os/exec never has a child taken from it.
//
// A child this process already has when StartReaper runs was not started
// by it: it was started by the binary this one replaced in the same PID (a
// reload, internal/handoff) — a runsc sandbox re-parented to it, or a
// runsc command it had in flight. Nothing here waits for those, so each
// is reaped when it exits, whatever its name.
func StartReaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	for _, pid := range children() {
		inherited.Store(pid, true)
	}
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGCHLD)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-sig:
			case <-tick.C:
			}
			reapRunsc()
		}
	}()
	return nil
}

// reapRunsc waits for every zombie child named "exe" (runsc's sandbox
// and gofer processes).
//
// It runs on every SIGCHLD, and a node has two such children per running
// sandbox: reading each one's /proc/<pid>/stat every time made it ≈ 10 %
// of the node's CPU samples with 330 hot sandboxes while creates went on
// (perf, bench/fill --awake). So a child is read once, to learn whether it
// is runsc's (its name does not change: runsc's processes do not exec
// again); after that a non-blocking wait4 on its pid alone says whether it
// has exited, and reaps it if so. Only we reap runsc's children, so a pid
// in runscKids stays that child until we reap it (or it is gone from the
// list, and forgotten).
func reapRunsc() {
	kids := children()
	present := make(map[int]bool, len(kids))
	for _, pid := range kids {
		present[pid] = true
		_, adopted := inherited.Load(pid)
		_, known := runscKids.Load(pid)
		if !known && !adopted {
			comm, state := procStat(pid)
			if comm != "exe" {
				continue // os/exec's: its Wait reaps it
			}
			runscKids.Store(pid, true)
			if state != 'Z' {
				continue
			}
		}
		var ws unix.WaitStatus
		if n, _ := unix.Wait4(pid, &ws, unix.WNOHANG, nil); n == pid {
			// Its PID may be given to a child os/exec starts next.
			inherited.Delete(pid)
			runscKids.Delete(pid)
		}
	}
	runscKids.Range(func(k, _ any) bool {
		if !present[k.(int)] {
			runscKids.Delete(k)
		}
		return true
	})
}

// runscKids holds the PIDs of children known to be runsc's (int → true).
var runscKids sync.Map

// inherited holds the PIDs of children StartReaper found (int → true).
var inherited sync.Map

// children lists this process's children (every thread's).
func children() []int {
	var out []int
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// procStat returns the command name and state letter of pid from
// /proc/<pid>/stat ("pid (comm) S ...").
func procStat(pid int) (string, byte) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0
	}
	s := string(data)
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open || close+2 >= len(s) {
		return "", 0
	}
	return s[open+1 : close], s[close+2]
}
