package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"sandstorm/internal/client"
)

// Sandstormd is a daemon a benchmark started for itself.
type Sandstormd struct {
	Cmd    *exec.Cmd
	Client *client.Client
	// API is its address, host:port on loopback.
	API string
}

// StartSandstormd starts `bin serve --master --node --data-dir dataDir
// --listen <a free loopback port> args...` with its output in logPath, and
// waits (at most a minute) until it answers with the token it wrote and has
// finished its start-up repair.
func StartSandstormd(ctx context.Context, bin, dataDir, logPath string, args ...string) (*Sandstormd, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	api := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	full := append([]string{"serve", "--master", "--node", "--data-dir", dataDir, "--listen", api}, args...)
	cmd := exec.Command(bin, full...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own: a Ctrl-C at the terminal reaches the
	// benchmark, which deletes its sandboxes through this daemon before it
	// stops it, rather than the daemon at once, leaving them running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Sandstormd{Cmd: cmd, API: api}
	for deadline := time.Now().Add(time.Minute); ; {
		if c, err := client.ForDataDir("https://"+api, dataDir); err == nil {
			s.Client = c
			if st, err := s.Client.Node(ctx); err == nil && st.Reconciling == 0 {
				return s, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.Stop()
			return nil, errors.New("sandstormd did not answer within a minute; see " + logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop asks the daemon to stop (SIGTERM) and waits for it.
func (s *Sandstormd) Stop() {
	s.Cmd.Process.Signal(syscall.SIGTERM)
	s.Cmd.Wait()
}

// SDKDaemon is the sandstormd an SDK benchmark (bench/e2b,
// bench/interpreter) drives: run's binary with envd beside it, on its own
// subnet and gateway ports, no idle timers (the series move sandboxes
// between tiers themselves), logging into the results directory.
type SDKDaemon struct {
	*Sandstormd
	Data string
	Args []string
	// Stop stops it and removes what it leaves on the host.
	Stop func()
}

// StartSDKDaemon starts run's SDKDaemon.
func StartSDKDaemon(ctx context.Context, run *Run, subnet, gwPorts string) (*SDKDaemon, error) {
	envdBin := filepath.Join(filepath.Dir(run.Binary.Path), "sandstorm-envd")
	if _, err := os.Stat(envdBin); err != nil {
		return nil, fmt.Errorf("no sandstorm-envd beside %s (make build puts it there)", run.Binary.Path)
	}
	data := filepath.Join(run.Work, "d")
	args := []string{"--runsc", run.Runsc, "--subnet", subnet, "--gateway-ports", gwPorts, "--log-level", "info",
		"--envd", envdBin, "--freeze-after", "0", "--snapshot-after", "0", "--detach-after", "0"}
	sd, err := StartSandstormd(ctx, run.Binary.Path, data, filepath.Join(run.Dir.Path, "sandstormd.log"), args...)
	if err != nil {
		return nil, err
	}
	return &SDKDaemon{Sandstormd: sd, Data: data, Args: args, Stop: func() {
		sd.Stop()
		for syscall.Unmount(filepath.Join(data, "runsc", "null-netns"), syscall.MNT_DETACH) == nil {
		}
		exec.Command("ip", "route", "del", "unreachable", subnet).Run()
	}}, nil
}

// SDKEnv is the environment that points an E2B SDK at d as team key's.
func (d *SDKDaemon) SDKEnv(key string) []string {
	apiURL := "https://" + d.API
	return append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+apiURL+"/e2b", "E2B_SANDBOX_URL="+apiURL,
		"E2B_DOMAIN=sandbox.localhost", "NODE_EXTRA_CA_CERTS="+filepath.Join(d.Data, "pki", "ca.pem"))
}
