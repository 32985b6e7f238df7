// Package raw runs runsc itself, outside sandstormd, on what sandstormd
// would run, for the benchmarks that time raw runsc beside sandstormd
// (bench/tiers): the node's bundle layout (layout.PrepareBundle: the rootfs
// overlay and the OCI spec writeSpec writes, with the memory limit the
// caller gives, the daemon's for the template), the same runsc binary,
// platform and top-level flags (gvisor's Backend.Flags), and a network
// namespace and veth made the way the node makes them (netns.Create). The
// caller polls the first answer itself, with the same client and interval
// as its sandstormd series. What the node adds on top — API, store,
// admission, boundary, gateway, nftables, the launch shell that sets
// oom_score_adj — is what the callers' ratio tables measure.
//
// Its runsc --root, namespace, veth and /16 are the benchmark's own, so a
// raw sandbox can neither meet the daemon's nor be cleaned up by it; the
// veth name does not start with the node's "ssv", so the node's firewall
// (which resets host connections into ssv* links) leaves it alone.
package raw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/sandbox/gvisor"
	"sandstorm/internal/store"
)

// NodeDefaultMemoryMiB is the node's default memory limit (node.Config's
// DefaultMemoryMiB when serve is given none), for a raw sandbox whose
// caller has no limit read from the daemon.
const NodeDefaultMemoryMiB = 1024

// Env is what the raw sandboxes of one run share. Every container started
// through it is tracked until removed, and Cleanup removes whatever is
// left, on any exit.
type Env struct {
	// be runs no timed command: it gives the flags, reads memory, and
	// removes containers and the root's null-netns mount robustly (runsc
	// delete -force, then kills by pid). The timed commands are exec'd
	// here, directly.
	be      *gvisor.Backend
	dir     string // bundles, images and logs; be.Root is dir/runsc
	net     netns.Net
	netUp   bool
	timeout time.Duration
	runID   string
	seq     int
	boxes   map[string]*Box // containers not yet removed, by ID
}

// Box is one raw container: its sandbox directory (laid out as the
// node's) and runsc container ID.
type Box struct {
	id     string
	dir    string
	bundle string
	log    string
	images int
}

// ID is b's runsc container ID.
func (b *Box) ID() string { return b.id }

// Bundle is b's OCI bundle directory.
func (b *Box) Bundle() string { return b.bundle }

// Log is the file every runsc command for b writes to, and b's sandbox
// its console output.
func (b *Box) Log() string { return b.log }

func (b *Box) spec(e *Env) sandbox.Spec {
	return sandbox.Spec{ID: b.id, Bundle: b.bundle, Netns: e.net.Path(), LogPath: b.log}
}

// candidates are the /16s the raw network may take, the first that
// nothing in this network namespace uses: none is the node's default
// (10.219.0.0/16) nor the e2e tests'.
func candidates() []netip.Prefix {
	var out []netip.Prefix
	for i := 180; i <= 187; i++ {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16))
	}
	return out
}

// pickSubnet returns the first candidate that overlaps none of used.
func pickSubnet(cands, used []netip.Prefix) (netip.Prefix, error) {
	for _, c := range cands {
		free := true
		for _, u := range used {
			if c.Overlaps(u) {
				free = false
				break
			}
		}
		if free {
			return c, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("every candidate subnet for the raw runsc network (%v) overlaps an address or route of this machine", cands)
}

// prefixesInUse lists the IPv4 addresses (with their prefix) and route
// destinations of this network namespace; the default route is not
// counted (it overlaps everything and reaches nothing the benchmark
// makes). A dump interrupted by a concurrent change is retried: a partial
// list could miss the very address that makes a subnet taken.
func prefixesInUse() ([]netip.Prefix, error) {
	var addrs []netlink.Addr
	var routes []netlink.Route
	var err error
	for try := 0; try < 20; try++ {
		if addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
			if routes, err = netlink.RouteList(nil, netlink.FAMILY_V4); err == nil {
				break
			}
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			ones, _ := a.Mask.Size()
			out = append(out, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok {
			ones, _ := r.Dst.Mask.Size()
			if ones > 0 {
				out = append(out, netip.PrefixFrom(ip, ones).Masked())
			}
		}
	}
	return out, nil
}

// root is the runsc --root under dir. It must stay short: runsc puts its
// control sockets there (gvisor.New refuses a root that leaves no room
// for them; see maxRootLen there).
func root(dir string) string { return filepath.Join(dir, "runsc") }

// netFor is the namespace and veth of run runID, without addresses yet.
func netFor(runID string) netns.Net {
	return netns.Net{Name: "ssbench-raw-" + runID, HostIf: "sbraw" + runID}
}

// New makes the raw sandboxes' work dir, runsc root (runsc with platform)
// and network (a /16 no host address or route uses, other than avoid); the
// namespace itself is created before each run or restore. runID names
// the namespace, veth and containers: it must be short (the veth's name
// has 15 bytes, of which "sbraw" takes 5). Every runsc command is
// bounded by timeout.
func New(ctx context.Context, runsc, platform, runID string, avoid []netip.Prefix, timeout time.Duration) (*Env, error) {
	subnet, err := PickSubnet(avoid)
	if err != nil {
		return nil, err
	}
	return NewAt(ctx, runsc, platform, runID, subnet, 0, timeout)
}

// PickSubnet is the first raw candidate /16 that no address or route of
// this network namespace uses, nor avoid.
func PickSubnet(avoid []netip.Prefix) (netip.Prefix, error) {
	used, err := prefixesInUse()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("list this machine's addresses and routes: %w", err)
	}
	return pickSubnet(candidates(), append(used, avoid...))
}

// NewAt is New on address slot slot of subnet (from PickSubnet): several
// Envs on one subnet, each in its own slot, run raw sandboxes side by
// side, as the node's sandboxes share its subnet.
func NewAt(ctx context.Context, runsc, platform, runID string, subnet netip.Prefix, slot int, timeout time.Duration) (*Env, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the raw runsc series need root (network namespaces, mounts, runsc)")
	}
	// /tmp rather than $TMPDIR: the root must be short (see root).
	dir, err := os.MkdirTemp("/tmp", "ssraw-")
	if err != nil {
		return nil, err
	}
	be, err := gvisor.New(root(dir), runsc, platform)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return newEnv(be, dir, runID, subnet, slot, timeout)
}

func newEnv(be *gvisor.Backend, dir, runID string, subnet netip.Prefix, slot int, timeout time.Duration) (*Env, error) {
	host, sb, err := netns.Pool{Prefix: subnet}.Addrs(slot)
	if err != nil {
		be.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	nw := netFor(runID)
	nw.Host, nw.Sandbox = host, sb
	return &Env{be: be, dir: dir, timeout: timeout, runID: runID, boxes: map[string]*Box{}, net: nw}, nil
}

// Backend is the gvisor backend on e's runsc root: its Root and Flags are
// what every raw command runs with, and it reads a raw sandbox's memory
// (MemoryMiB). It is not for timed commands (Runsc is).
func (e *Env) Backend() *gvisor.Backend { return e.be }

// Net is e's network namespace, veth and their addresses.
func (e *Env) Net() netns.Net { return e.net }

// Addr is the sandbox's own address, which every raw sandbox of e takes in
// turn.
func (e *Env) Addr() netip.Addr { return e.net.Sandbox.Addr() }

// URL is the sandbox's own address and port: the raw sandboxes are talked
// to directly, there is no gateway.
func (e *Env) URL(port int) string {
	return "http://" + netip.AddrPortFrom(e.Addr(), uint16(port)).String() + "/"
}

// FreshNet (re)creates the namespace and veth with their addresses, as the
// node does before every start and restore (runsc takes the namespace's
// addresses into its netstack and leaves none behind). A fresh namespace
// each time, rather than the addresses put back into the old one, also
// keeps a sandbox process still exiting from seeing the next one's packets.
// Run and Restore call it.
func (e *Env) FreshNet() error {
	if e.netUp {
		if err := netns.Delete(e.net); err != nil {
			return err
		}
		e.netUp = false
	}
	if err := netns.Create(e.net); err != nil {
		netns.Delete(e.net)
		return fmt.Errorf("raw runsc network: %w", err)
	}
	e.netUp = true
	return nil
}

// Template is template t as the node's store holds it, which
// layout.PrepareBundle lays out.
func Template(t api.Template) store.Template {
	return store.Template{Name: t.Name, Rootfs: t.Rootfs, Process: t.Process, Ports: t.Ports, MemoryMiB: t.MemoryMiB}
}

// NewBox lays out a new container's directory from template t (node's
// layout: bundle/rootfs overlay, bundle/config.json) with memory limit
// limitMiB; name goes into its ID. envdDir is layout.PrepareBundle's: the
// directory holding the sandstorm-envd binary, which a template whose
// init is envd needs ("" for none). On error the box is returned all the
// same, for the caller to Remove what was made of it.
func (e *Env) NewBox(name string, t store.Template, limitMiB int64, envdDir string) (*Box, error) {
	e.seq++
	id := fmt.Sprintf("raw-%s-%s-%d", e.runID, name, e.seq)
	b := &Box{id: id, dir: filepath.Join(e.dir, "sandboxes", id)}
	b.log = filepath.Join(b.dir, "console.log")
	e.boxes[id] = b // before the mount, so that Cleanup unmounts a half-made one
	var err error
	if b.bundle, err = layout.PrepareBundle(b.dir, t, limitMiB, id, e.net.Path(), envdDir); err != nil {
		return b, fmt.Errorf("lay out the raw bundle: %w", err)
	}
	return b, nil
}

// Runsc runs one runsc command for b with the backend's flags and returns
// when it started and how long it took. Its output goes to b's log — a
// file, never a pipe: a detached sandbox inherits it and keeps it open, so
// a pipe would never reach EOF. It runs to its end even when ctx is
// cancelled (a run or restore cut short leaves a half-started sandbox),
// bounded by New's timeout.
func (e *Env) Runsc(ctx context.Context, b *Box, args ...string) (time.Time, time.Duration, error) {
	logf, err := os.OpenFile(b.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return time.Time{}, 0, err
	}
	defer logf.Close()
	off, _ := logf.Seek(0, io.SeekEnd)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, e.be.Runsc, append(e.be.Flags(), args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = sandbox.WaitDelay
	t0 := time.Now()
	err = cmd.Run()
	d := time.Since(t0)
	if err != nil {
		return t0, d, fmt.Errorf("runsc %s %s: %w: %s", args[0], b.id, err, lastLogLine(b.log, off))
	}
	return t0, d, nil
}

// lastLogLine is the last non-empty line path gained after offset off.
func lastLogLine(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	f.Seek(off, io.SeekStart)
	data, _ := io.ReadAll(io.LimitReader(f, 64<<10))
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return bench.OneLine(lines[len(lines)-1])
}

// Run starts b (runsc run -detach) in a fresh namespace, timed as Runsc
// times it.
func (e *Env) Run(ctx context.Context, b *Box) (time.Time, time.Duration, error) {
	if err := e.FreshNet(); err != nil {
		return time.Time{}, 0, err
	}
	return e.Runsc(ctx, b, "run", "-detach", "-bundle", b.bundle, b.id)
}

// Checkpoint writes b's state to a new image directory and returns it. The
// container is stopped afterwards, but its sandbox process lingers for a
// second or two: it is deleted right away (not timed), as the node does.
func (e *Env) Checkpoint(ctx context.Context, b *Box) (string, time.Duration, error) {
	b.images++
	image := filepath.Join(b.dir, "image-"+strconv.Itoa(b.images))
	if err := os.MkdirAll(image, 0o700); err != nil {
		return "", 0, err
	}
	_, d, err := e.Runsc(ctx, b, "checkpoint", "--image-path="+image, b.id)
	if err != nil {
		os.RemoveAll(image)
		return "", d, err
	}
	if err := e.be.Remove(ctx, b.spec(e)); err != nil {
		return image, d, fmt.Errorf("delete the checkpointed container: %w", err)
	}
	return image, d, nil
}

// Restore starts b again from image, in a fresh namespace with the same
// addresses; the image is dropped afterwards (each checkpoint gets a new
// one), as the node does.
func (e *Env) Restore(ctx context.Context, b *Box, image string) (time.Time, time.Duration, error) {
	defer os.RemoveAll(image)
	if err := e.FreshNet(); err != nil {
		return time.Time{}, 0, err
	}
	return e.Runsc(ctx, b, "restore", "-detach", "-image-path="+image, "-bundle", b.bundle, b.id)
}

// MemoryMiB is what the memory cgroup of container id under be's root
// holds now, read as the node reads its own sandboxes' (gvisor's
// Backend.Memory).
func MemoryMiB(ctx context.Context, be *gvisor.Backend, id string) (float64, error) {
	st, err := be.Memory(ctx, sandbox.Spec{ID: id})
	if err != nil {
		return 0, err
	}
	if st.Gone {
		return 0, fmt.Errorf("sandbox %s is gone", id)
	}
	if st.UsageBytes <= 0 {
		return 0, fmt.Errorf("sandbox %s: its memory cgroup reports no usage", id)
	}
	return float64(st.UsageBytes) / (1 << 20), nil
}

// Remove deletes b's container, unmounts its rootfs and removes its
// directory. It runs to its end whatever ctx says.
func (e *Env) Remove(ctx context.Context, b *Box) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if err := e.be.Remove(ctx, b.spec(e)); err != nil {
		errs = append(errs, err)
	}
	if err := layout.ReleaseBundle(b.dir); err != nil {
		errs = append(errs, err)
	} else if err := os.RemoveAll(b.dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		delete(e.boxes, b.id)
	}
	return errors.Join(errs...)
}

// Cleanup removes every container left, the namespace and veth, the
// null-netns runsc mounts under its root (gvisor's Close: unmounted until
// none is left), and the work dir, which is removed only once nothing is
// mounted under it any more.
func (e *Env) Cleanup(ctx context.Context) error {
	var errs []error
	for _, b := range e.boxes {
		if err := e.Remove(ctx, b); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", b.id, err))
		}
	}
	if err := netns.Delete(e.net); err != nil {
		errs = append(errs, err)
	}
	e.netUp = false
	e.be.Close()
	for _, m := range bench.MountsUnder(e.dir) {
		unix.Unmount(m, unix.MNT_DETACH)
	}
	if left := bench.MountsUnder(e.dir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("not removing %s: still mounted: %s", e.dir, strings.Join(left, ", ")))
	} else if err := os.RemoveAll(e.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
