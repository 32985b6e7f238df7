package meshlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one program of a lab, run inside its host's namespace, its
// output appended to Log. It can be killed and started again with the
// same arguments (and so the same data dir and key), as a supervisor
// would.
type Proc struct {
	Name string
	Log  string
	host Host
	bin  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs the program; its log grows from where it ended.
func (p *Proc) start() error {
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	c := p.host.Command(p.bin, p.args...)
	c.Stdout, c.Stderr = f, f
	if err := c.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { c.Wait(); f.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = c, done
	p.mu.Unlock()
	return nil
}

// PID is the running process's, or 0.
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// Kill ends the process with SIGKILL (kill -9) and waits for it.
func (p *Proc) Kill() { p.signal(syscall.SIGKILL, 0) }

// Stop asks the process to stop (SIGTERM), and kills it after 10 s.
func (p *Proc) Stop() { p.signal(syscall.SIGTERM, 10*time.Second) }

func (p *Proc) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	c, done := p.cmd, p.done
	p.mu.Unlock()
	if c == nil {
		return
	}
	c.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			c.Process.Kill()
		}
	}
	<-done
}

// Restart starts the process again, with the same arguments, and waits
// (within a minute) until its log says ready after the restart. It
// returns when it was asked to start and when it was ready.
func (p *Proc) Restart(ctx context.Context, ready string) (asked, up time.Time, err error) {
	off := size(p.Log)
	asked = time.Now()
	if err := p.start(); err != nil {
		return asked, time.Time{}, err
	}
	if err := waitLog(ctx, p.Log, off, ready, time.Minute); err != nil {
		return asked, time.Time{}, fmt.Errorf("%s: %w", p.Name, err)
	}
	return asked, time.Now(), nil
}

func size(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

// logAfter is path's content from offset on.
func logAfter(path string, offset int64) string {
	b, _ := os.ReadFile(path)
	if offset > int64(len(b)) {
		return ""
	}
	return string(b[offset:])
}

// waitLog waits until path holds s past offset, polling every 10 ms.
func waitLog(ctx context.Context, path string, offset int64, s string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for !strings.Contains(logAfter(path, offset), s) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%q not in %s within %v; its end:\n%s", s, path, d, tail(logAfter(path, offset), 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// wordWith is the first whitespace-separated word of path past offset
// that contains s, or "".
func wordWith(path string, offset int64, s string) string {
	for _, w := range strings.Fields(logAfter(path, offset)) {
		if strings.Contains(w, s) {
			return w
		}
	}
	return ""
}
