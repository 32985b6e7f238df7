package gvisor

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
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
func StartReaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
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
func reapRunsc() {
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if comm, state := procStat(pid); state == 'Z' && comm == "exe" {
				var ws unix.WaitStatus
				unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			}
		}
	}
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
