package node

import (
	"context"
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

	"sandstorm/api"
	"sandstorm/internal/envd"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/gateway"
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

// envdMount is where the envd binary's directory is inside a sandbox.
const envdMount = "/.sandstorm"

// envdBinary is the binary's name in that directory.
const envdBinary = "sandstorm-envd"

// envdDir is the host directory mounted at envdMount: the node's own copy
// of the envd binary, so that replacing the binary the daemon was given
// does not change a file running sandboxes have mounted. "" without envd.
func (n *Node) envdDir() string {
	if n.cfg.Envd == "" {
		return ""
	}
	return filepath.Join(n.cfg.DataDir, "envd")
}

// installEnvd copies the configured envd binary to envdDir when it
// differs, by a rename, so that a sandbox with the old one mounted keeps
// the old inode.
func (n *Node) installEnvd() error {
	if n.cfg.Envd == "" {
		return nil
	}
	src, err := os.ReadFile(n.cfg.Envd)
	if err != nil {
		return fmt.Errorf("envd binary: %w (build it with make build, or run with --envd none to serve no commands and files)", err)
	}
	dir := n.envdDir()
	dst := filepath.Join(dir, envdBinary)
	if old, err := os.ReadFile(dst); err == nil && string(old) == string(src) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, src, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// envdInitArgs is the command line of a sandbox whose init is envd: envd,
// then the template's process after "--".
func envdInitArgs(e api.Envd, args []string) []string {
	out := []string{filepath.Join(envdMount, envdBinary), "--init", "--addr", ":" + strconv.Itoa(envd.Port)}
	if e.User != "" {
		out = append(out, "--user", e.User)
	}
	if e.Workdir != "" {
		out = append(out, "--workdir", e.Workdir)
	}
	return append(append(out, "--"), args...)
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
	sb, err := n.st.GetSandbox(r.Context(), id)
	if err != nil {
		return err
	}
	nw, err := n.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	target := netip.AddrPortFrom(nw.Sandbox.Addr(), envd.Port)
	t, err := n.st.GetTemplate(r.Context(), sb.Template)
	if err != nil {
		return err
	}
	if t.Process.Envd != nil {
		err = n.awaitEnvd(r.Context(), target)
	} else {
		err = n.ensureEnvd(r.Context(), e, n.spec(sb), target)
	}
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
			pr.Out.URL.Host = target.String()
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = target.String()
		},
		Transport:     n.envdTransport(),
		FlushInterval: -1, // server streams: every event at once
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			failed = err
		},
	}
	proxy.ServeHTTP(w, r.WithContext(ctx))
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

// envdTransport is the node's transport to envds: no proxy from the
// environment, and no connection kept between calls. A kept one would be
// an established endpoint in the sandbox at its next checkpoint (which
// gVisor cannot save; the gateway drains its own for this reason), and
// dead after a cold start that reuses the address. A new connection on
// the sandbox's veth costs a fraction of a millisecond.
func (n *Node) envdTransport() *http.Transport {
	n.envdOnce.Do(func() {
		n.envdTr = &http.Transport{
			DialContext:       n.envdDialer(5 * time.Second).DialContext,
			DisableKeepAlives: true,
		}
	})
	return n.envdTr
}

// ensureEnvd starts envd in the sandbox unless it already answers at
// target. It answers after a snapshot's restore or a freeze's thaw (it is
// in the sandbox's memory); a cold start (after a detach) starts it again.
func (n *Node) ensureEnvd(ctx context.Context, e *entry, spec sandbox.Spec, target netip.AddrPort) error {
	e.envdMu.Lock()
	defer e.envdMu.Unlock()
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
		out, err = x.Exec(ctx, spec, []string{filepath.Join(envdMount, envdBinary), "--detach", "--addr", ":" + strconv.Itoa(envd.Port)})
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

// cutEnvd ends the calls forwarded to sandbox id's envd: before a
// snapshot, a detach or a delete, whose sandbox will not answer them.
func (n *Node) cutEnvd(id string) {
	if e, ok := n.lookup(id); ok {
		e.envdCuts.Range(func(_, v any) bool {
			v.(context.CancelFunc)()
			return true
		})
	}
}
