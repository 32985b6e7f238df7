package bench

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
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
