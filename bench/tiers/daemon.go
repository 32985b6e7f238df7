package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/internal/bench"
	"sandstorm/internal/client"
	"sandstorm/internal/netns"
)

// daemon is a sandstormd this program started.
type daemon struct {
	bin     string
	binHash string
	built   bool // bin was built by us (in a temp dir)
	dataDir string
	api     string
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	log     *os.File
	logPath string
}

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startDaemon starts `sandstormd serve --master --node` over a new
// temporary data dir, with the idle timers off (only the benchmark moves
// sandboxes between tiers), logging to logPath, and waits until its API
// answers.
func startDaemon(ctx context.Context, cfg config, logPath string) (*daemon, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("--start needs root: sandstormd creates network namespaces, veths, mounts and runsc sandboxes")
	}
	d := &daemon{bin: cfg.sandstormd, logPath: logPath, exited: make(chan struct{})}
	var err error
	if d.dataDir, err = os.MkdirTemp("", "sandstorm-bench-"); err != nil {
		return nil, err
	}
	// It passes --runsc itself: nothing to link beside a built one.
	b, err := bench.SandstormdBinary(ctx, cfg.repo, d.bin, d.dataDir, "")
	if err != nil {
		os.RemoveAll(d.dataDir)
		return nil, err
	}
	d.bin, d.built, d.binHash = b.Path, b.Built, b.SHA256
	port, err := freeLoopbackPort()
	if err != nil {
		os.RemoveAll(d.dataDir)
		return nil, err
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	d.api = "https://" + listen
	d.args = []string{"serve", "--master", "--node",
		"--data-dir", filepath.Join(d.dataDir, "data"), "--listen", listen,
		"--backend", cfg.backend, "--subnet", cfg.subnet, "--gateway-ports", cfg.gwPorts,
		"--freeze-after", "0", "--snapshot-after", "0", "--detach-after", "0",
	}
	if cfg.backend == "gvisor" {
		// The runsc and platform the raw series use too: a sandstormd built
		// into the temporary data dir finds no runsc next to itself, and the
		// comparison is only fair on the same binary and platform. (Before
		// --daemon-arg, so that an explicit one still wins; d.args records
		// what ran.)
		d.args = append(d.args, "--runsc", cfg.runsc, "--platform", cfg.platform)
	}
	d.args = append(d.args, cfg.daemonArgs...)
	if d.log, err = os.Create(logPath); err != nil {
		os.RemoveAll(d.dataDir)
		return nil, err
	}
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	// Its own process group: a terminal's Ctrl-C must not stop the daemon
	// before the benchmark has deleted its sandboxes through it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		d.log.Close()
		os.RemoveAll(d.dataDir)
		return nil, fmt.Errorf("start %s: %w", d.bin, err)
	}
	go func() {
		d.waitErr = d.cmd.Wait()
		close(d.exited)
	}()
	fmt.Fprintf(os.Stderr, "started sandstormd (pid %d) on %s, data dir %s, log %s\n", d.cmd.Process.Pid, d.api, d.dataDir, logPath)
	if err := d.waitReady(ctx, 30*time.Second); err != nil {
		d.stop()
		d.removeDataDir()
		return nil, err
	}
	return d, nil
}

// client returns an API client of d (its token appears at first start).
func (d *daemon) client() (*client.Client, error) {
	return client.ForDataDir(d.api, filepath.Join(d.dataDir, "data"))
}

func (d *daemon) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-d.exited:
			return fmt.Errorf("sandstormd exited at start-up (%v); its log:\n%s", d.waitErr, tail(d.logPath, 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		c, err := d.client()
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = c.Node(actx)
			cancel()
			if err == nil {
				return nil
			}
		}
		last = err
	}
	return fmt.Errorf("sandstormd API at %s did not answer within %s (last: %v); its log:\n%s", d.api, limit, last, tail(d.logPath, 20))
}

// stop sends SIGTERM and waits (SIGKILL after 15 s).
func (d *daemon) stop() error {
	defer d.log.Close()
	select {
	case <-d.exited:
		return fmt.Errorf("sandstormd had already exited: %v", d.waitErr)
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		return errors.New("sandstormd did not stop within 15 s of SIGTERM; killed")
	}
}

// leftovers lists what a stopped daemon left behind although every sandbox
// was deleted through the API: runsc containers, mounts under the data dir,
// and (when isolated, where every one is ours) sandbox namespaces.
func (d *daemon) leftovers(isolated bool) []string {
	var out []string
	runscRoot := filepath.Join(d.dataDir, "data", "runsc")
	if ents, err := os.ReadDir(runscRoot); err == nil {
		for _, e := range ents {
			// null-netns is the empty netns file the pinned runsc keeps
			// under its root for its gofers: no container's. Still
			// mounted, it shows among the mounts below.
			if e.Name() == "null-netns" {
				continue
			}
			out = append(out, "runsc state "+filepath.Join(runscRoot, e.Name()))
		}
	}
	for _, m := range bench.MountsUnder(d.dataDir) {
		out = append(out, "mount "+m)
	}
	if isolated {
		if ents, err := os.ReadDir(netns.Dir); err == nil {
			for _, e := range ents {
				out = append(out, "network namespace "+e.Name())
			}
		}
	}
	return out
}

// removeDataDir unmounts anything left under the data dir (lazily) and
// removes it, with the binary if we built it there.
func (d *daemon) removeDataDir() error {
	for _, m := range bench.MountsUnder(d.dataDir) {
		unix.Unmount(m, unix.MNT_DETACH)
	}
	if left := bench.MountsUnder(d.dataDir); len(left) > 0 {
		return fmt.Errorf("not removing %s: still mounted: %s", d.dataDir, strings.Join(left, ", "))
	}
	return os.RemoveAll(d.dataDir)
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
