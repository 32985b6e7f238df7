package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// Warm templates (the seed's "Sandstorm, warm template": 159 / 168 ms
// against 167 / 289 ms cold). The node starts a warm template once, waits
// for its probe, and checkpoints it: the warm image, under
// <data-dir>/warm/<template>/image. Each new sandbox of the template is then
// a restore of that image into the sandbox's own network namespace,
// overlay and bundle (hostname included), followed by the template's
// reseed. A current runsc takes the interfaces, addresses and routes of the
// namespace it restores into, not those saved in the image (the netstack's
// configuration is replaced on restore: gVisor pkg/tcpip/stack
// ReplaceConfig), and the hostname from the new spec (UTS RestoreSpecValues),
// so each sandbox has its own. Entropy: getrandom and /dev/urandom inside
// the sandbox are served by the sentry from the host's, so they differ in
// every sandbox; what the program drew before the checkpoint (a PRNG state)
// does not, and that is what the reseed is for.
//
// The build runs in the pool's last address slot, kept out of allocate for
// it, one build at a time. The template's process has no boundary while it
// warms up: it has no network but the probe (the firewall drops the rest).
// Whatever it writes to its filesystem before the checkpoint stays in the
// build's own volume, not in its sandboxes': a warm template's program
// should not write before it is ready.

// warmLayout is the directory of template name's warm image build.
func (n *Node) warmLayout(name string) layout.Dir {
	return layout.Dir(filepath.Join(n.cfg.DataDir, "warm", name))
}

// warmID is the container ID of template name's build: "w" and 11 hex
// digits of its name's SHA-256, 12 characters like a sandbox's ID (the
// names of its netns and veth derive from it).
func warmID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "w" + hex.EncodeToString(sum[:])[:11]
}

// warmSlot is the address slot warm builds use.
func (n *Node) warmSlot() int { return n.cfg.Pool.Size() - 1 }

// runtimeVersion names the runtime images are made with ("" if the backend
// cannot say).
func (n *Node) runtimeVersion() string {
	if v, ok := n.be.(interface{ RuntimeVersion() string }); ok {
		// With the build's key: two builds can claim one version, and
		// an image restores safely only on the build that wrote it.
		if k := n.kept.Current(); k != "" {
			return v.RuntimeVersion() + " " + string(k)
		}
		return v.RuntimeVersion()
	}
	return ""
}

// warmReady reports whether template name has a warm image this runtime
// can restore.
func (n *Node) warmReady(name string) bool {
	l := n.warmLayout(name)
	if _, err := os.Stat(l.WarmImage()); err != nil {
		return false
	}
	v, err := os.ReadFile(l.WarmVersion())
	return err == nil && string(v) == n.runtimeVersion()
}

// PrepareWarm makes template t's warm image (see above), replacing any
// older one. It fails when the backend cannot checkpoint, or when the
// probe does not answer within the node's ready timeout (errdefs.ErrBadInput: the
// template is at fault), and leaves nothing running either way.
func (n *Node) PrepareWarm(ctx context.Context, t store.Template) error {
	if t.Warm == nil {
		return nil
	}
	if !n.be.Capabilities().Checkpoint {
		return fmt.Errorf("%w: the %s backend cannot checkpoint, so it has no warm templates", errdefs.ErrBadInput, n.be.Name())
	}
	n.warmMu.Lock()
	defer n.warmMu.Unlock()
	// The pool of an older image (a template registered again) goes.
	n.drainPool(t.Name)
	l := n.warmLayout(t.Name)
	id := warmID(t.Name)
	nw, err := n.Net(id, n.warmSlot())
	if err != nil {
		return err
	}
	spec := sandbox.Spec{ID: id, Bundle: l.Bundle(), Netns: nw.Path(), LogPath: l.Log()}
	bg := context.WithoutCancel(ctx)
	cleanup := func() {
		n.be.Remove(bg, spec)
		netns.Delete(nw)
		l.UnmountRootfs()
	}
	cleanup() // a build cut short by a crash
	ok := false
	defer func() {
		// Deferred first, so it runs last: after cleanup has unmounted the
		// build's overlay. Nothing of a failed build stays (the template
		// is not registered).
		if !ok {
			os.RemoveAll(string(l))
		}
	}()
	defer cleanup()
	tmp := l.WarmImage() + ".tmp"
	for _, p := range []string{tmp, l.Upper(), l.Work()} {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	if err := l.MountRootfs(t.Rootfs); err != nil {
		return err
	}
	if err := netns.Create(nw); err != nil {
		return err
	}
	if err := l.WriteSpec(t, n.LimitMiB(t, 0), t.Name, nw.Path(), n.envd.Current()); err != nil {
		return err
	}
	start := time.Now()
	if err := n.be.Start(bg, spec); err != nil {
		return fmt.Errorf("start template %s to warm it: %w", t.Name, err)
	}
	port := t.Warm.Probe.Port
	if port == 0 {
		port = t.Ports[0]
	}
	target := netip.AddrPortFrom(nw.Sandbox.Addr(), uint16(port))
	if err := n.probe(ctx, target, t.Warm.Probe.Path); err != nil {
		return fmt.Errorf("%w: template %s: its probe (%s%s) did not succeed within %s (last: %v; its output: %s)",
			errdefs.ErrBadInput, t.Name, target, t.Warm.Probe.Path, n.cfg.Ready, err, tail(l.Log(), 400))
	}
	ready := time.Since(start)
	if err := n.be.Checkpoint(bg, spec, tmp); err != nil {
		return fmt.Errorf("checkpoint template %s: %w", t.Name, err)
	}
	if err := os.WriteFile(l.WarmVersion()+".tmp", []byte(n.runtimeVersion()), 0o644); err != nil {
		return err
	}
	os.RemoveAll(l.WarmImage())
	if err := os.Rename(tmp, l.WarmImage()); err != nil {
		return err
	}
	if err := os.Rename(l.WarmVersion()+".tmp", l.WarmVersion()); err != nil {
		return err
	}
	n.log.Info("warm image made", "template", t.Name, "ready_ms", ready.Milliseconds(), "total_ms", time.Since(start).Milliseconds())
	ok = true
	n.kickPool()
	return nil
}

// removeOrphanWarm removes warm build directories no template owns (a
// template deleted while the node was down, or a build cut short by a
// crash before its template was refused).
func (n *Node) removeOrphanWarm(ctx context.Context) {
	ents, err := os.ReadDir(filepath.Join(n.cfg.DataDir, "warm"))
	if err != nil {
		return
	}
	for _, e := range ents {
		t, err := n.st.GetTemplate(ctx, e.Name())
		if err == nil && t.Warm != nil {
			continue
		}
		if errors.Is(err, errdefs.ErrNotFound) || err == nil {
			n.log.Info("reconcile: removing a warm image no template owns", "template", e.Name())
			n.DropWarm(e.Name())
		}
	}
}

// DropWarm removes template name's warm image and build directory.
func (n *Node) DropWarm(name string) {
	n.drainPool(name)
	n.warmMu.Lock()
	defer n.warmMu.Unlock()
	l := n.warmLayout(name)
	l.UnmountRootfs()
	os.RemoveAll(string(l))
}

// probe polls target until it answers: an HTTP GET of path answered 2xx,
// or (path "") a TCP connect. Polls are 5 ms apart, bounded by the node's
// ready timeout. Its connections carry the gateway's mark (the firewall
// admits no other into a sandbox) and are reset, not closed.
func (n *Node) probe(ctx context.Context, target netip.AddrPort, path string) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Ready)
	defer cancel()
	d := n.markedDialer()
	var last error
	for {
		last = probeOnce(ctx, d, target, path)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// markedDialer dials into a sandbox with the gateway's mark, the only
// connections from the host the firewall lets in.
func (n *Node) markedDialer() *net.Dialer {
	d := &net.Dialer{Timeout: time.Second}
	if mark := n.cfg.SAM.Firewall.IngressMark; mark != 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, mark)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	return d
}

func probeOnce(ctx context.Context, d *net.Dialer, target netip.AddrPort, path string) error {
	c, err := d.DialContext(ctx, "tcp", target.String())
	if err != nil {
		return err
	}
	defer func() {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}()
	if path == "" {
		return nil
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return c, nil }, DisableKeepAlives: true}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+target.String()+path, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s answered %s", path, resp.Status)
	}
	return nil
}

// warmStart is coldStart for a warm template: the sandbox's own overlay,
// network and bundle, then a restore of the template's warm image and the
// reseed. It reports false (and does nothing) when there is no image this
// runtime can restore; the caller then starts cold.
func (n *Node) warmStart(ctx context.Context, sb store.Sandbox, t store.Template) (bool, error) {
	if t.Warm == nil || !n.warmReady(t.Name) {
		return false, nil
	}
	if err := n.prepare(sb, t, n.envd.For(n.warmLayout(t.Name))); err != nil {
		return true, err
	}
	d := n.dir(sb.ID)
	d.Mark("started from the warm image of template %s (its memory is the template's, reseeded; its volume new)", t.Name)
	spec := n.spec(sb)
	if err := n.be.Restore(ctx, spec, n.warmLayout(t.Name).WarmImage()); err != nil {
		return true, fmt.Errorf("restore the warm image of %s: %w", t.Name, err)
	}
	if err := n.reseed(ctx, spec, t); err != nil {
		return true, fmt.Errorf("reseed: %w", err)
	}
	return true, nil
}

// reseed runs template t's reseed in the sandbox of spec.
func (n *Node) reseed(ctx context.Context, spec sandbox.Spec, t store.Template) error {
	r := t.Warm.Reseed
	if r.Signal != "" {
		sig, ok := api.ReseedSignal(r.Signal)
		s, can := n.be.(sandbox.Signaller)
		if !ok || !can {
			return fmt.Errorf("cannot send %s here", r.Signal)
		}
		return s.Signal(ctx, spec, sig)
	}
	x, ok := n.be.(sandbox.Execer)
	if !ok {
		return errors.New("this backend cannot run a command in a sandbox")
	}
	_, err := x.Exec(ctx, spec, r.Command)
	return err
}

// tail is the last n bytes of the file at path, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return strconv.Quote(string(b))
}
