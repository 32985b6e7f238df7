package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"sandstorm/internal/netns"
)

// IsolatedEnv is set in the environment of a benchmark's re-executed,
// isolated run (ReexecIsolated).
const IsolatedEnv = "SANDSTORM_BENCH_ISOLATED"

// ReexecIsolated runs this program again under `unshare --net --mount`, so
// that what the run starts — a daemon with its loopback API, gateway,
// veths and nftables table, a registry, another runtime's bridge and
// mounts — lives in namespaces of the run's own and goes with it: nothing
// collides with another sandstormd on the machine, and the run neither
// sees nor disturbs its traffic. prog names the benchmark in messages. It
// returns the exit code.
func ReexecIsolated(prog string) int {
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "%s: needs root: sandstormd creates network namespaces, veths, mounts and runsc sandboxes\n", prog)
		return 1
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: --isolate needs unshare(1) (apt-get install -y util-linux), or pass --isolate=false\n", prog)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		return 1
	}
	cmd := exec.Command(unshare, append([]string{"--net", "--mount", "--propagation", "private", "--", self}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), IsolatedEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// The child gets a terminal's SIGINT itself (same process group); pass
	// on the signals sent to this process alone, and wait for its cleanup.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: start the isolated run: %v\n", prog, err)
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
		fmt.Fprintf(os.Stderr, "%s: the isolated run: %v\n", prog, err)
		return 1
	}
	return 0
}

// SetupIsolation runs in the re-executed process: it brings the new
// network namespace's loopback up and puts a private tmpfs over
// /var/run/netns.
func SetupIsolation() error {
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
