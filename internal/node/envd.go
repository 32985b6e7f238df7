package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sandstorm/internal/envd"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/gateway"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/sandbox"
)

// envd, the E2B API for commands and files, runs inside the sandbox
// (docs/ARCHITECTURE.md, "envd"): what it starts is confined exactly as
// the template's process is, its paths are the sandbox's, and the
// processes it runs are in every checkpoint with it. The node
//   - mounts the envd binary read-only at /.sandstorm in every sandbox
//     (a bind mount costs the sandbox nothing until it is used);
//   - starts envd with `runsc exec` on the first call that needs it — a
//     template that never uses it pays nothing — and envd detaches at
//     once, so no host process stays behind it;
//   - forwards calls to it on the sandbox's own address, never published
//     on the gateway: the only way to envd from outside is through the
//     API that checked the caller.

// The envd binary a sandbox mounts is fixed for the sandbox's life: its
// checkpoint images hold envd's memory, mapped from that file, and gVisor
// restores such a file only if it is the one that was saved (a warm image
// made before an upgrade of envd, restored with the new binary at its
// path, came back without its process: "sandbox process is gone", seen on
// this node). So each envd build has its own directory,
// <data-dir>/envd/<first 16 hex digits of its SHA-256>, a bundle's spec
// names the one it started with, and a restore mounts the same one again.
// A build no bundle names any more is removed when the node starts.

// envdDir is the host directory mounted at layout.EnvdMount in a sandbox started
// now: the current build's. "" without envd.
func (n *Node) envdDir() string { return n.envdCurrent }

// envdDirFor is the envd directory for a restore of an image made in
// layout l (the sandbox's own, its warm template's or its clone parent's):
// the one l's spec mounted, if it is still there, else the current one.
func (n *Node) envdDirFor(l layout.Dir) string {
	if n.cfg.Envd == "" {
		return ""
	}
	if src := l.EnvdSource(); src != "" {
		if _, err := os.Stat(filepath.Join(src, layout.EnvdBinary)); err == nil {
			return src
		}
	}
	return n.envdDir()
}

// installEnvd puts the configured envd binary in its build's directory
// (by a rename of a complete copy, so a crash leaves no half binary
// there), makes it current, and removes the builds no bundle mounts.
func (n *Node) installEnvd() error {
	if n.cfg.Envd == "" {
		return nil
	}
	src, err := os.ReadFile(n.cfg.Envd)
	if err != nil {
		return fmt.Errorf("envd binary: %w (build it with make build, or run with --envd none to serve no commands and files)", err)
	}
	sum := sha256.Sum256(src)
	root := filepath.Join(n.cfg.DataDir, "envd")
	dir := filepath.Join(root, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, layout.EnvdBinary)); err != nil {
		tmp := dir + ".new"
		os.RemoveAll(tmp)
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, layout.EnvdBinary), src, 0o755); err != nil {
			return err
		}
		if err := os.Rename(tmp, dir); err != nil {
			return err
		}
	}
	n.envdCurrent = dir
	n.removeUnusedEnvd(root)
	return nil
}

// removeUnusedEnvd removes the envd builds under root that neither the
// current build is nor any sandbox's or warm template's bundle mounts
// (a data dir from before builds had directories mounted root itself,
// with the binary in it: that one is kept while a bundle mounts it).
func (n *Node) removeUnusedEnvd(root string) {
	used := map[string]bool{n.envdCurrent: true}
	for _, pattern := range []string{"sandboxes", "warm"} {
		dirs, _ := filepath.Glob(filepath.Join(n.cfg.DataDir, pattern, "*"))
		for _, d := range dirs {
			if src := layout.Dir(d).EnvdSource(); src != "" {
				used[src] = true
			}
		}
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(root, e.Name())
		switch {
		case e.Name() == layout.EnvdBinary && !used[root]:
			os.Remove(p)
		case e.IsDir() && !used[p]:
			if err := os.RemoveAll(p); err == nil {
				n.log.Info("envd build removed: no sandbox mounts it", "dir", p)
			}
		}
	}
}

// ErrNoEnvd is a call for envd on a node that has none.
var ErrNoEnvd = errdefs.Refine(errdefs.ErrNotSupported, "this node serves no commands and files (started with --envd none, or with no sandstorm-envd beside sandstormd: make build puts it there)")

// ServeEnvd forwards r to the envd of sandbox id as a call of path (e.g.
// /process.Process/Start, /files), streaming the answer back. The sandbox
// is woken from whatever tier it is in first, as traffic wakes it, and
// envd is started in it if it is not running. While the call lasts the
// sandbox counts as busy (a command someone waits on keeps it hot); a
// snapshot, detach or delete cuts the call (cutEnvd). An error is
// returned only when nothing was written.
func (n *Node) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	if n.cfg.Envd == "" {
		return ErrNoEnvd
	}
	e, ok := n.lookup(id)
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found on node %s", id, n.cfg.Name)
	}
	e.envdCalls.Add(1)
	defer e.envdCalls.Add(-1)
	defer n.Touch(id)
	n.Touch(id)
	if err := n.Wake(r.Context(), id); err != nil {
		return err
	}
	tr, err := n.envdTransportOf(r.Context(), e)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(r.Context())
	key := new(int)
	e.envdCuts.Store(key, cancel)
	defer func() {
		e.envdCuts.Delete(key)
		cancel()
	}()
	// The request's body is still being forwarded when the answer starts
	// (a stream's first event): an HTTP/1 server would otherwise make the
	// body unreadable at the first flush ("the request body may be
	// unavailable", net/http ResponseWriter), and the call would die
	// half-way. (HTTP/2 is full duplex already: the error is ignored.)
	http.NewResponseController(w).EnableFullDuplex()
	var failed error
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = tr.target.String()
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = tr.target.String()
		},
		Transport:     tr,
		FlushInterval: -1, // server streams: every event at once
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			failed = err
		},
	}
	proxy.ServeHTTP(w, r.WithContext(ctx))
	var starting *envdStartError
	if errors.As(failed, &starting) {
		return starting.err // envd could not be started or did not answer: its own error
	}
	if failed != nil && !errors.Is(ctx.Err(), context.Canceled) {
		// Not ErrUnavailable: that says the node is down, and the node
		// answers; the sandbox's envd did not (500, with why).
		return fmt.Errorf("envd of sandbox %s did not answer: %w (sandstormd sandbox logs %s may say why)", id, failed, id)
	}
	return nil
}

// envdDialer dials envd inside sandboxes: a short dial (the address is
// the sandbox's own, on its veth), with the mark the firewall lets into a
// sandbox (as the gateway's connections are).
func (n *Node) envdDialer(timeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: timeout}
	if m := n.cfg.SAM.Firewall.IngressMark; m != 0 {
		d.Control = gateway.MarkSocket(m)
	}
	return d
}

// envdTransport is the way to one sandbox's envd: HTTP/1.1 on its own
// address, no proxy from the environment, connections kept between calls
// and closed by cutEnvd before the sandbox is checkpointed, detached or
// deleted (an established connection would be in the checkpoint, where
// gVisor cannot keep it, and dead after a cold start; the gateway drains
// its own for the same reason). A kept connection saves a handshake into
// the sandbox's netstack on every call: a GET /health took 2.4 ms on a
// new connection and 0.7–1.0 ms on a kept one (this node, p50 of 50).
type envdTransport struct {
	*http.Transport
	target netip.AddrPort
}

// envdStartError is envd failing to start or answer, as the transport's
// dial met it: ServeEnvd returns its error as it is (a 504 for an init
// envd that does not answer, a 500 for one that would not start).
type envdStartError struct{ err error }

func (e *envdStartError) Error() string { return e.err.Error() }
func (e *envdStartError) Unwrap() error { return e.err }

// envdTransportOf is sandbox e's envdTransport, made on its first call. Its
// dial tries the sandbox's envd first and starts envd (or waits for the
// one that is the sandbox's init) only when that is refused: a call to an
// envd that runs — every call but a sandbox's first, and its first after
// a restore — costs no probe before it.
func (n *Node) envdTransportOf(ctx context.Context, e *entry) (*envdTransport, error) {
	e.envdMu.Lock()
	defer e.envdMu.Unlock()
	if e.envdTr != nil {
		return e.envdTr, nil
	}
	sb, err := n.st.GetSandbox(ctx, e.id)
	if err != nil {
		return nil, err
	}
	nw, err := n.Net(sb.ID, sb.Slot)
	if err != nil {
		return nil, err
	}
	t, err := n.st.GetTemplate(ctx, sb.Template)
	if err != nil {
		return nil, err
	}
	target := netip.AddrPortFrom(nw.Sandbox.Addr(), envd.Port)
	initEnvd := t.Process.Envd != nil
	dialer := n.envdDialer(5 * time.Second)
	tr := &envdTransport{target: target}
	tr.Transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, "tcp", target.String())
			if err == nil || ctx.Err() != nil {
				return c, err
			}
			if initEnvd {
				err = n.awaitEnvd(ctx, target)
			} else {
				err = n.ensureEnvd(ctx, e, n.spec(sb), target)
			}
			if err != nil {
				return nil, &envdStartError{err}
			}
			return dialer.DialContext(ctx, "tcp", target.String())
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	e.envdTr = tr
	return tr, nil
}

// ensureEnvd starts envd in the sandbox unless it already answers at
// target. It answers after a snapshot's restore or a freeze's thaw (it is
// in the sandbox's memory); a cold start (after a detach) starts it again.
func (n *Node) ensureEnvd(ctx context.Context, e *entry, spec sandbox.Spec, target netip.AddrPort) error {
	e.envdStart.Lock()
	defer e.envdStart.Unlock()
	if n.envdAnswers(ctx, target) {
		return nil
	}
	x, ok := n.be.(sandbox.Execer)
	if !ok {
		return errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot run commands in a sandbox", n.be.Name())
	}
	t0 := time.Now()
	var out []byte
	var err error
	// Right after a restore the envd the checkpoint held is being killed
	// (gVisor ends exec'd processes at a restore) and may still hold the
	// port for a moment: a few tries, each refused at once.
	for try := 0; try < 5; try++ {
		out, err = x.Exec(ctx, spec, []string{filepath.Join(layout.EnvdMount, layout.EnvdBinary), "--detach", "--addr", ":" + strconv.Itoa(envd.Port)})
		if err == nil || !strings.Contains(string(out), "address already in use") {
			break
		}
		time.Sleep(time.Duration(20<<try) * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("start envd in sandbox %s: %w: %s", spec.ID, err, out)
	}
	n.log.Info("envd started", "id", spec.ID, "ms", time.Since(t0).Milliseconds())
	return nil
}

// awaitEnvd waits for the envd that is the sandbox's init to answer: a
// sandbox just started or restored opens its listeners a moment after
// runsc returns (the gateway's dial retries for the same reason).
func (n *Node) awaitEnvd(ctx context.Context, target netip.AddrPort) error {
	deadline := time.Now().Add(n.readyWait())
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if n.envdAnswers(ctx, target) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errdefs.New(errdefs.ErrTimeout, "envd of the sandbox at %s did not answer within %v (its template runs envd as its init: sandstormd sandbox logs says why)", target, n.readyWait())
		}
		time.Sleep(pause)
	}
}

func (n *Node) readyWait() time.Duration {
	if n.cfg.Ready > 0 {
		return n.cfg.Ready
	}
	return 30 * time.Second
}

func (n *Node) envdAnswers(ctx context.Context, target netip.AddrPort) bool {
	c, err := n.envdDialer(500*time.Millisecond).DialContext(ctx, "tcp", target.String())
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// cutEnvd ends the calls forwarded to sandbox id's envd and closes the
// connections kept to it: before a snapshot, a detach or a delete, whose
// sandbox will not answer them. The next call makes a new transport.
func (n *Node) cutEnvd(id string) {
	e, ok := n.lookup(id)
	if !ok {
		return
	}
	e.envdCuts.Range(func(_, v any) bool {
		v.(context.CancelFunc)()
		return true
	})
	e.dropEnvdTransport()
}

// dropEnvdTransport closes the connections kept to e's envd; the next call
// makes a new transport.
func (e *entry) dropEnvdTransport() {
	e.envdMu.Lock()
	tr := e.envdTr
	e.envdTr = nil
	e.envdMu.Unlock()
	if tr != nil {
		tr.CloseIdleConnections()
	}
}
