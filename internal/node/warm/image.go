// Package warm is a Sandstorm node's warm templates: the image each warm
// template's sandboxes are restored from (Images), and the pools of its
// sandboxes restored ahead of demand (Pool). The node's core starts,
// checkpoints and removes sandboxes; this package decides when, and keeps
// the images and pools, each with its own lock.
package warm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/gateway"
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
// The build runs in the pool's last address slot, kept out of the node's
// allocation for it, one build at a time. The template's process has no
// boundary while it warms up: it has no network but the probe (the
// firewall drops the rest). Whatever it writes to its filesystem before
// the checkpoint stays in the build's own volume, not in its sandboxes': a
// warm template's program should not write before it is ready.

// ImagesConfig is what Images builds with.
type ImagesConfig struct {
	DataDir string
	// Backend starts, checkpoints and removes a build.
	Backend sandbox.Backend
	// Net is the network of a build's container (the node's warm slot).
	Net func(id string) (netns.Net, error)
	// Mark is the firewall mark that lets the probe into the build.
	Mark int
	// Ready bounds the wait for the probe.
	Ready time.Duration
	// Runtime names the runtime images are made with ("" if the backend
	// cannot say): an image restores only on the runtime that wrote it.
	Runtime func() string
	Log     *slog.Logger
}

// Images is a node's warm images.
type Images struct {
	cfg ImagesConfig
	mu  sync.Mutex // one build at a time (they share a slot)

	renewMu sync.Mutex
	renewed map[string]bool // templates whose image this run made again
}

// NewImages keeps the warm images under cfg.DataDir/warm.
func NewImages(cfg ImagesConfig) *Images {
	return &Images{cfg: cfg, renewed: map[string]bool{}}
}

// Dir is the directory of template name's warm image build.
func (im *Images) Dir(name string) layout.Dir {
	return layout.Dir(filepath.Join(im.cfg.DataDir, "warm", name))
}

// ID is the container ID of template name's build: "w" and 11 hex
// digits of its name's SHA-256, 12 characters like a sandbox's ID (the
// names of its netns and veth derive from it).
func ID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "w" + hex.EncodeToString(sum[:])[:11]
}

// Ready reports whether template name has a warm image this runtime can
// restore.
func (im *Images) Ready(name string) bool {
	l := im.Dir(name)
	if _, err := os.Stat(l.WarmImage()); err != nil {
		return false
	}
	v, err := os.ReadFile(l.WarmVersion())
	return err == nil && string(v) == im.cfg.Runtime()
}

// Build makes template t's warm image (see above), replacing any older
// one: its process with memory limit limitMiB and envd build envdDir,
// started, probed and checkpointed. It fails when the probe does not
// answer within Ready (errdefs.ErrBadInput: the template is at fault),
// and leaves nothing running either way.
func (im *Images) Build(ctx context.Context, t store.Template, limitMiB int64, envdDir string) error {
	im.mu.Lock()
	defer im.mu.Unlock()
	be := im.cfg.Backend
	l := im.Dir(t.Name)
	id := ID(t.Name)
	nw, err := im.cfg.Net(id)
	if err != nil {
		return err
	}
	spec := sandbox.Spec{ID: id, Bundle: l.Bundle(), Netns: nw.Path(), LogPath: l.Log()}
	bg := context.WithoutCancel(ctx)
	cleanup := func() {
		be.Remove(bg, spec)
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
	if err := l.WriteSpec(t, limitMiB, t.Name, nw.Path(), envdDir); err != nil {
		return err
	}
	start := time.Now()
	if err := be.Start(bg, spec); err != nil {
		return fmt.Errorf("start template %s to warm it: %w", t.Name, err)
	}
	if err := im.probe(ctx, t, spec, nw, l); err != nil {
		return err
	}
	ready := time.Since(start)
	if err := be.Checkpoint(bg, spec, tmp); err != nil {
		return fmt.Errorf("checkpoint template %s: %w", t.Name, err)
	}
	if err := im.install(l, tmp); err != nil {
		return err
	}
	im.cfg.Log.Info("warm image made", "template", t.Name, "ready_ms", ready.Milliseconds(), "total_ms", time.Since(start).Milliseconds())
	ok = true
	return nil
}

// probe waits for the build's probe to succeed.
func (im *Images) probe(ctx context.Context, t store.Template, spec sandbox.Spec, nw netns.Net, l layout.Dir) error {
	if cmd := t.Warm.Probe.Command; len(cmd) > 0 {
		if err := ProbeCommand(ctx, im.cfg.Backend, spec, cmd, im.cfg.Ready); err != nil {
			return fmt.Errorf("%w: template %s: its ready command %q did not exit 0 within %s (last: %v; its output: %s)",
				errdefs.ErrBadInput, t.Name, cmd, im.cfg.Ready, err, tail(l.Log(), 400))
		}
		return nil
	}
	port := t.Warm.Probe.Port
	if port == 0 {
		port = t.Ports[0]
	}
	target := netip.AddrPortFrom(nw.Sandbox.Addr(), uint16(port))
	if err := Probe(ctx, MarkedDialer(im.cfg.Mark), target, t.Warm.Probe.Path, im.cfg.Ready); err != nil {
		return fmt.Errorf("%w: template %s: its probe (%s%s) did not succeed within %s (last: %v; its output: %s)",
			errdefs.ErrBadInput, t.Name, target, t.Warm.Probe.Path, im.cfg.Ready, err, tail(l.Log(), 400))
	}
	return nil
}

// install puts the checkpoint at tmp in place as l's image, with the
// runtime that wrote it beside it.
func (im *Images) install(l layout.Dir, tmp string) error {
	if err := os.WriteFile(l.WarmVersion()+".tmp", []byte(im.cfg.Runtime()), 0o644); err != nil {
		return err
	}
	os.RemoveAll(l.WarmImage())
	if err := os.Rename(tmp, l.WarmImage()); err != nil {
		return err
	}
	return os.Rename(l.WarmVersion()+".tmp", l.WarmVersion())
}

// Drop removes template name's warm image and build directory.
func (im *Images) Drop(name string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	l := im.Dir(name)
	l.UnmountRootfs()
	os.RemoveAll(string(l))
}

// Names lists the templates that have a warm build directory.
func (im *Images) Names() []string {
	ents, err := os.ReadDir(filepath.Join(im.cfg.DataDir, "warm"))
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// Stale says why template t's warm image must be made again ("" if it
// need not): it was made by another runtime (which cannot restore here:
// the template would start cold from now on), or holds another envd build
// than current (it restores, with the old envd, and would keep it in
// every new sandbox); envdOf is the envd build a layout mounts. Each
// template is said stale once per run of the node: what an upgrade of
// either needs, not a rebuild loop when the new build fails.
func (im *Images) Stale(t store.Template, envdOf func(layout.Dir) string, current string) string {
	if t.Warm == nil {
		return ""
	}
	l := im.Dir(t.Name)
	if _, err := os.Stat(l.WarmImage()); err != nil {
		return ""
	}
	why := ""
	switch {
	case !im.Ready(t.Name):
		why = "made by another runsc"
	case envdOf(l) != current:
		why = "holds another envd build"
	default:
		return ""
	}
	im.renewMu.Lock()
	defer im.renewMu.Unlock()
	if im.renewed[t.Name] {
		return ""
	}
	im.renewed[t.Name] = true
	// Not ready while it is made (creates start cold meanwhile): a
	// restore must not take the old image with the new build's spec.
	os.Remove(l.WarmVersion())
	return why
}

// Probe polls target until it answers: an HTTP GET of path answered 2xx,
// or (path "") a TCP connect. Polls are 5 ms apart, bounded by ready.
// Its connections are d's (with the mark the firewall admits into a
// sandbox) and are reset, not closed.
func Probe(ctx context.Context, d *net.Dialer, target netip.AddrPort, path string, ready time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, ready)
	defer cancel()
	var last error
	for {
		last = ProbeOnce(ctx, d, target, path)
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

// ProbeCommand runs cmd in the sandbox of spec until it exits 0, within
// ready. A run is not cut short on its own: E2B's waitForTimeout is a
// sleep that must be let end.
func ProbeCommand(ctx context.Context, be sandbox.Backend, spec sandbox.Spec, cmd []string, ready time.Duration) error {
	x, ok := be.(sandbox.Execer)
	if !ok {
		return errors.New("this backend cannot run a command in a sandbox")
	}
	ctx, cancel := context.WithTimeout(ctx, ready)
	defer cancel()
	for {
		out, err := x.Exec(ctx, spec, cmd)
		if err == nil {
			return nil
		}
		if len(out) > 0 {
			err = fmt.Errorf("%w: %s", err, strconv.Quote(string(tailBytes(out, 200))))
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// MarkedDialer dials into a sandbox with mark, the gateway's: the only
// connections from the host the firewall lets in.
func MarkedDialer(mark int) *net.Dialer {
	d := &net.Dialer{Timeout: time.Second}
	if mark != 0 {
		d.Control = gateway.MarkSocket(mark)
	}
	return d
}

// leave ends a connect-only probe's connection as a client that asked
// nothing: a FIN, then the server's own close awaited (briefly), so that
// the server reads an end, not a reset, which some log as an error
// (Python's http.server: a ConnectionResetError traceback in every
// clone's log, when a clone's readiness was this probe), and no socket
// of it is left in the sandbox for a checkpoint to keep. A server that
// does not close in time is reset, as before.
func leave(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok || tc.CloseWrite() != nil {
		return
	}
	tc.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
	io.Copy(io.Discard, io.LimitReader(tc, 64<<10))
}

// ProbeOnce is one poll of Probe.
func ProbeOnce(ctx context.Context, d *net.Dialer, target netip.AddrPort, path string) error {
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
		leave(c)
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

// Reseed runs template t's reseed in the sandbox of spec: the signal it
// names, else its command.
func Reseed(ctx context.Context, be sandbox.Backend, spec sandbox.Spec, t store.Template) error {
	r := t.Warm.Reseed
	if r.Signal != "" {
		sig, ok := api.ReseedSignal(r.Signal)
		s, can := be.(sandbox.Signaller)
		if !ok || !can {
			return fmt.Errorf("cannot send %s here", r.Signal)
		}
		return s.Signal(ctx, spec, sig)
	}
	x, ok := be.(sandbox.Execer)
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
