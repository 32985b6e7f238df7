package envd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"
)

// readyEnv names the descriptor a detached envd reports it listens on.
const readyEnv = "SANDSTORM_ENVD_READY_FD"

// savedProcs keeps what GOMAXPROCS was before LeanEnv set it for envd:
// "=" and the value, or "" for none.
const savedProcs = "SANDSTORM_ENVD_GOMAXPROCS"

// LeanEnv is env for envd itself: one P (GOMAXPROCS=1), the value it had
// kept aside for what envd starts (RestoreEnv). envd idles in every
// sandbox that uses it, and in gVisor each thread of a process costs the
// sandbox memory (the sentry's task, its systrap stub's state): with one P
// the Go runtime makes fewer threads, and a sandbox with envd as its init
// held 2.9 MiB more than one without envd instead of 4.1 MiB, its snapshot
// image 1.7 MiB more instead of 2.6 (the web demo, this node, n = 4). Set
// in the environment, not by runtime.GOMAXPROCS from main: by then the
// runtime has started its threads (that measured 3.3 and 2.1 MiB). envd
// is I/O-bound; one P is enough for it.
func LeanEnv(env []string) []string {
	saved := ""
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GOMAXPROCS="); ok {
			saved = "=" + v
			continue
		}
		if strings.HasPrefix(kv, savedProcs+"=") {
			return env // already lean
		}
		out = append(out, kv)
	}
	return append(out, "GOMAXPROCS=1", savedProcs+"="+saved)
}

// RestoreEnv puts back the GOMAXPROCS that LeanEnv kept aside (and drops
// what it kept it in), so that the process envd runs as init and the
// commands it starts have the environment they were given. envd calls it
// first.
func RestoreEnv() {
	saved, ok := os.LookupEnv(savedProcs)
	if !ok {
		return
	}
	if v, set := strings.CutPrefix(saved, "="); set {
		os.Setenv("GOMAXPROCS", v)
	} else {
		os.Unsetenv("GOMAXPROCS")
	}
	os.Unsetenv(savedProcs)
}

// Detach starts envd again with args, in a session of its own with its
// stdio on the sandbox's /dev/null, and returns once it listens (or with
// why it did not). The node starts envd with `runsc exec`, whose host
// process lives as long as the process it started and hands it the host's
// stdio; a detached envd lets that host process end at once, so a sandbox
// with envd costs no process on the host, and holds no host descriptor
// that would have to be handed back at a restore.
func Detach(args []string) error {
	null, err := os.OpenFile("/dev/null", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	env := append(LeanEnv(os.Environ()), readyEnv+"=3")
	p, err := os.StartProcess(self, append([]string{self}, args...), &os.ProcAttr{
		Env:   env,
		Files: []*os.File{null, null, null, w},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	w.Close()
	if err != nil {
		return err
	}
	p.Release()
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	if s := strings.TrimSpace(string(msg)); s != "listening" {
		if s == "" {
			s = "it exited before it listened"
		}
		return errors.New("envd did not start: " + s)
	}
	return nil
}

// ListenAndServe serves s on addr until the listener fails. A detached
// envd (Detach) reports on its ready descriptor that it listens, or why it
// cannot.
func ListenAndServe(addr string, s *Server) error {
	var ready *os.File
	if os.Getenv(readyEnv) == "3" {
		ready = os.NewFile(3, "ready")
		os.Unsetenv(readyEnv)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if ready != nil {
			fmt.Fprintf(ready, "listen %s: %v\n", addr, err)
			ready.Close()
		}
		return err
	}
	if ready != nil {
		io.WriteString(ready, "listening\n")
		ready.Close()
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second}
	return srv.Serve(ln)
}
