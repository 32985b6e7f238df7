package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"sandstorm/internal/netns"
)

// isolatedEnv is set in the environment of the re-executed, isolated run.
const isolatedEnv = "SANDSTORM_BENCH_ISOLATED"

// reexecIsolated runs this program again under `unshare --net --mount`,
// as bench/tiers does: the daemon, the registry, podman's bridge and
// firewall rules and every mount the tools make live in namespaces of
// the run's own, and go with it; nothing collides with another
// sandstormd on the machine. It returns the exit code.
func reexecIsolated() int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "images: needs root: sandstormd creates network namespaces, mounts and runsc sandboxes")
		return 1
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		fmt.Fprintln(os.Stderr, "images: --isolate needs unshare(1) (apt-get install -y util-linux), or pass --isolate=false")
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		return 1
	}
	cmd := exec.Command(unshare, append([]string{"--net", "--mount", "--propagation", "private", "--", self}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "images: start the isolated run:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "images: the isolated run:", err)
		return 1
	}
	return 0
}

// setupIsolation runs in the re-executed process: loopback up, and a
// private tmpfs over /var/run/netns.
func setupIsolation() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("isolation: loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("isolation: set loopback up: %w", err)
	}
	if err := os.MkdirAll(netns.Dir, 0o755); err != nil {
		return fmt.Errorf("isolation: %w", err)
	}
	if err := unix.Mount("tmpfs", netns.Dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("isolation: tmpfs on %s: %w", netns.Dir, err)
	}
	return nil
}

// strays are the processes whose command line names dir: what a tool the
// benchmark ran under dir left running (a runsc sandbox whose container
// podman could not remove).
func strays(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}
