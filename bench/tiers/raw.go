package main

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
	"sandstorm/internal/node"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/sandbox/gvisor"
	"sandstorm/internal/store"
)

// The raw series time runsc itself, outside sandstormd, on what sandstormd
// would run: the node's bundle layout (node.PrepareBundle: the rootfs
// overlay and the OCI spec writeSpec writes, with the daemon's memory limit
// for the template), the same runsc binary, platform and top-level flags
// (gvisor's Backend.Flags), a network namespace and veth made the way the
// node makes them (netns.Create), and the first answer polled with the same
// client and interval as the sandstormd series (runner.firstAnswer). What
// the node adds on top — API, store, admission, boundary, gateway,
// nftables, the launch shell that sets oom_score_adj — is what the ratio
// tables measure.
//
// Its runsc --root, namespace, veth and /16 are the benchmark's own, so a
// raw sandbox can neither meet the daemon's nor be cleaned up by it; the
// veth name does not start with the node's "ssv", so the node's firewall
// (which resets host connections into ssv* links) leaves it alone.

// rawEnv is what the raw series share. Every container started through it
// is tracked until removed, and cleanup removes whatever is left, on any
// exit.
type rawEnv struct {
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
	boxes   map[string]*rawBox // containers not yet removed, by ID
}

// rawBox is one raw container: its sandbox directory (laid out as the
// node's) and runsc container ID.
type rawBox struct {
	id     string
	dir    string
	bundle string
	log    string
	images int
}

func (b *rawBox) spec(e *rawEnv) sandbox.Spec {
	return sandbox.Spec{ID: b.id, Bundle: b.bundle, Netns: e.net.Path(), LogPath: b.log}
}

// rawCandidates are the /16s the raw network may take, the first that
// nothing in this network namespace uses: none is the node's default
// (10.219.0.0/16) nor the e2e tests'.
func rawCandidates() []netip.Prefix {
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

// rawRoot is the runsc --root under dir. It must stay short: runsc puts
// its control sockets there (gvisor.New refuses a root that leaves no room
// for them; see maxRootLen there).
func rawRoot(dir string) string { return filepath.Join(dir, "runsc") }

// newRawEnv makes the raw series' work dir, runsc root and network (a /16
// no host address or route uses, other than avoid); the namespace itself
// is created before each run or restore.
func newRawEnv(ctx context.Context, runsc, platform, runID string, avoid []netip.Prefix, timeout time.Duration) (*rawEnv, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the raw runsc series need root (network namespaces, mounts, runsc)")
	}
	// /tmp rather than $TMPDIR: the root must be short (see rawRoot).
	dir, err := os.MkdirTemp("/tmp", "ssraw-")
	if err != nil {
		return nil, err
	}
	be, err := gvisor.New(rawRoot(dir), runsc, platform)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	used, err := prefixesInUse()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("list this machine's addresses and routes: %w", err)
	}
	subnet, err := pickSubnet(rawCandidates(), append(used, avoid...))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	host, sb, err := netns.Pool{Prefix: subnet}.Addrs(0)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &rawEnv{
		be: be, dir: dir, timeout: timeout, runID: runID, boxes: map[string]*rawBox{},
		net: netns.Net{Name: "ssbench-raw-" + runID, HostIf: "sbraw" + runID, Host: host, Sandbox: sb},
	}, nil
}

// url is the sandbox's own address and port: the raw series talk to it
// directly, there is no gateway.
func (e *rawEnv) url(port int) string {
	return "http://" + netip.AddrPortFrom(e.net.Sandbox.Addr(), uint16(port)).String() + "/"
}

// freshNet (re)creates the namespace and veth with their addresses, as the
// node does before every start and restore (runsc takes the namespace's
// addresses into its netstack and leaves none behind). A fresh namespace
// each time, rather than the addresses put back into the old one, also
// keeps a sandbox process still exiting from seeing the next one's packets.
func (e *rawEnv) freshNet() error {
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

// newBox lays out a new container's directory from template t (node's
// layout: bundle/rootfs overlay, bundle/config.json) with memory limit
// limitMiB. On error the box is returned all the same, for the caller to
// remove what was made of it.
func (e *rawEnv) newBox(name string, t store.Template, limitMiB int64) (*rawBox, error) {
	e.seq++
	id := fmt.Sprintf("raw-%s-%s-%d", e.runID, name, e.seq)
	b := &rawBox{id: id, dir: filepath.Join(e.dir, "sandboxes", id)}
	b.log = filepath.Join(b.dir, "console.log")
	e.boxes[id] = b // before the mount, so that cleanup unmounts a half-made one
	var err error
	if b.bundle, err = node.PrepareBundle(b.dir, t, limitMiB, id, e.net.Path()); err != nil {
		return b, fmt.Errorf("lay out the raw bundle: %w", err)
	}
	return b, nil
}

// runsc runs one runsc command for b with the backend's flags and returns
// when it started and how long it took. Its output goes to b's log — a
// file, never a pipe: a detached sandbox inherits it and keeps it open, so
// a pipe would never reach EOF. It runs to its end even when ctx is
// cancelled (a run or restore cut short leaves a half-started sandbox),
// bounded by --timeout.
func (e *rawEnv) runsc(ctx context.Context, b *rawBox, args ...string) (time.Time, time.Duration, error) {
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
	cmd.WaitDelay = gvisor.WaitDelay
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
	return oneLine(lines[len(lines)-1])
}

func (e *rawEnv) run(ctx context.Context, b *rawBox) (time.Time, time.Duration, error) {
	if err := e.freshNet(); err != nil {
		return time.Time{}, 0, err
	}
	return e.runsc(ctx, b, "run", "-detach", "-bundle", b.bundle, b.id)
}

// checkpoint writes b's state to a new image directory and returns it. The
// container is stopped afterwards, but its sandbox process lingers for a
// second or two: it is deleted right away (not timed), as the node does.
func (e *rawEnv) checkpoint(ctx context.Context, b *rawBox) (string, time.Duration, error) {
	b.images++
	image := filepath.Join(b.dir, "image-"+strconv.Itoa(b.images))
	if err := os.MkdirAll(image, 0o700); err != nil {
		return "", 0, err
	}
	_, d, err := e.runsc(ctx, b, "checkpoint", "--image-path="+image, b.id)
	if err != nil {
		os.RemoveAll(image)
		return "", d, err
	}
	if err := e.be.Remove(ctx, b.spec(e)); err != nil {
		return image, d, fmt.Errorf("delete the checkpointed container: %w", err)
	}
	return image, d, nil
}

// restore starts b again from image, in a fresh namespace with the same
// addresses; the image is dropped afterwards (each checkpoint gets a new
// one), as the node does.
func (e *rawEnv) restore(ctx context.Context, b *rawBox, image string) (time.Time, time.Duration, error) {
	defer os.RemoveAll(image)
	if err := e.freshNet(); err != nil {
		return time.Time{}, 0, err
	}
	return e.runsc(ctx, b, "restore", "-detach", "-image-path="+image, "-bundle", b.bundle, b.id)
}

// memoryMiB is what b's memory cgroup holds now, read as the node reads
// its own sandboxes' (gvisor's Backend.Memory).
func memoryMiB(ctx context.Context, be *gvisor.Backend, id string) (float64, error) {
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

// remove deletes b's container, unmounts its rootfs and removes its
// directory. It runs to its end whatever ctx says.
func (e *rawEnv) remove(ctx context.Context, b *rawBox) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if err := e.be.Remove(ctx, b.spec(e)); err != nil {
		errs = append(errs, err)
	}
	if err := node.ReleaseBundle(b.dir); err != nil {
		errs = append(errs, err)
	} else if err := os.RemoveAll(b.dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		delete(e.boxes, b.id)
	}
	return errors.Join(errs...)
}

// cleanup removes every container left, the namespace and veth, the
// null-netns runsc mounts under its root (gvisor's Close: unmounted until
// none is left), and the work dir, which is removed only once nothing is
// mounted under it any more.
func (e *rawEnv) cleanup(ctx context.Context) error {
	var errs []error
	for _, b := range e.boxes {
		if err := e.remove(ctx, b); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", b.id, err))
		}
	}
	if err := netns.Delete(e.net); err != nil {
		errs = append(errs, err)
	}
	e.netUp = false
	e.be.Close()
	for _, m := range mountsUnder(e.dir) {
		unix.Unmount(m, unix.MNT_DETACH)
	}
	if left := mountsUnder(e.dir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("not removing %s: still mounted: %s", e.dir, strings.Join(left, ", ")))
	} else if err := os.RemoveAll(e.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// rawTemplate is template t as the node's store holds it, which
// node.PrepareBundle lays out.
func rawTemplate(t api.Template) store.Template {
	return store.Template{Name: t.Name, Rootfs: t.Rootfs, Process: t.Process, Ports: t.Ports, MemoryMiB: t.MemoryMiB}
}

// nodeDefaultMemoryMiB is the node's default memory limit (node.Config's
// DefaultMemoryMiB when serve is given none), used for a raw sandbox only
// when no sandstormd sandbox of its template was seen to say its limit.
const nodeDefaultMemoryMiB = 1024

// ensureRaw sets up the raw environment on first use.
func (r *runner) ensureRaw(ctx context.Context) (*rawEnv, error) {
	if r.raw != nil {
		return r.raw, nil
	}
	var avoid []netip.Prefix
	if p, err := netip.ParsePrefix(r.cfg.subnet); err == nil {
		avoid = append(avoid, p.Masked())
	}
	e, err := newRawEnv(ctx, r.cfg.runsc, r.cfg.platform, r.runID, avoid, r.cfg.timeout)
	if err != nil {
		return nil, err
	}
	r.raw = e
	r.res.Params["raw"] = map[string]any{
		"runsc_root": e.be.Root, "flags": e.be.Flags(), "netns": e.net.Name, "veth": e.net.HostIf,
		"host_addr": e.net.Host.String(), "sandbox_addr": e.net.Sandbox.String(),
		"bundle":   "node.PrepareBundle: overlay of the template's rootfs, the node's OCI spec (writeSpec), the daemon's memory limit",
		"commands": "runsc <flags> run -detach -bundle B ID | pause ID | resume ID | checkpoint --image-path=I ID | restore -detach -image-path=I -bundle B ID, exec'd directly",
	}
	fmt.Fprintf(os.Stderr, "raw runsc: root %s, network %s (%s ↔ %s)\n", e.be.Root, e.net.Name, e.net.Host, e.net.Sandbox)
	return e, nil
}

// rawBoxFor lays out a new raw container of template t.
func (r *runner) rawBoxFor(e *rawEnv, purpose, t string) (*rawBox, error) {
	def, ok := r.tmplDef[t]
	if !ok {
		return nil, fmt.Errorf("template %s: its definition is unknown", t)
	}
	limit, ok := r.limitMiB[t]
	if !ok {
		limit = def.MemoryMiB
		if limit <= 0 {
			limit = nodeDefaultMemoryMiB
		}
		r.res.Note("raw %s/%s: no sandstormd sandbox of the template was seen before it, so its memory limit (%d MiB) is the template's or the node's default, not read from the daemon", purpose, t, limit)
		r.limitMiB[t] = limit
	}
	return e.newBox(t, rawTemplate(def), int64(limit))
}

// measureRawStart times runsc run -detach of a fresh container to its
// first answer, polled as measureStart polls the gateway, and reads its
// memory then.
func (r *runner) measureRawStart(ctx context.Context, t string) error {
	name := "raw-start/" + t
	cl := r.res.AddSeries(name+"/client",
		"runsc run -detach started → first HTTP 200 from the sandbox's own address (polled every "+r.cfg.poll.String()+", same client as the gateway series; no sandstormd)", "")
	cmdS := r.res.AddSeries(name+"/runsc",
		"the runsc run -detach command alone (it returns once the container runs, before the app listens)", "")
	s := &series{r: r, main: cl, name: name, n: r.upTo(r.cfg.startN)}
	e, err := r.ensureRaw(ctx)
	if err != nil {
		cl.Skipped = err.Error()
		return nil
	}
	url := e.url(r.cfg.port)
	mem := r.mem.get(t, "raw")
	for !s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := r.rawBoxFor(e, "start", t)
		var t0 time.Time
		var runD, d time.Duration
		var attempts int
		var body string
		if err == nil {
			t0, runD, err = e.run(ctx, b)
		}
		if err == nil {
			d, attempts, body, err = r.firstAnswer(ctx, url, t0)
		}
		if err == nil {
			mem.read(ctx, e.be, b.id)
		}
		if b != nil {
			if rerr := e.remove(ctx, b); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove: %w", rerr))
			}
		}
		if err != nil {
			if stop, serr := s.miss(ctx, "%v", err); stop {
				return serr
			}
			continue
		}
		s.ok()
		cl.AddDuration(d)
		cmdS.AddDuration(runD)
		if c, ok := parseCount(body); !ok || c != 1 {
			cl.Note("first answer %q: want count=1 from a fresh sandbox", oneLine(body))
		}
		r.progress(name, len(cl.SamplesMs), s.n, "first answer %s ms (runsc run %s ms, %d poll(s))",
			bench.FormatMs(bench.Ms(d)), bench.FormatMs(bench.Ms(runD)), attempts)
	}
	return nil
}

// rawReady starts a raw container of t for a series and waits for its
// first answer; it returns the container and the app's request counter.
func (r *runner) rawReady(ctx context.Context, e *rawEnv, purpose, t string) (*rawBox, int, error) {
	b, err := r.rawBoxFor(e, purpose, t)
	if err == nil {
		var t0 time.Time
		if t0, _, err = e.run(ctx, b); err == nil {
			var body string
			if _, _, body, err = r.firstAnswer(ctx, e.url(r.cfg.port), t0); err == nil {
				c, _ := parseCount(body)
				return b, c, nil
			}
		}
	}
	if b != nil {
		e.remove(ctx, b)
	}
	return nil, 0, fmt.Errorf("a raw %s sandbox never answered: %w", t, err)
}

// rawWake is one of the two raw wake measurements: the transition into
// the tier (pause, checkpoint) and the command that leaves it (resume,
// restore).
type rawWake struct {
	series string // raw-pause or raw-restore
	enter  string // runsc command into the tier: pause or checkpoint
	leave  string // and out of it: resume or restore
	tier   api.Tier
}

var (
	rawPause   = rawWake{"raw-pause", "pause", "resume", api.TierFrozen}
	rawRestore = rawWake{"raw-restore", "checkpoint", "restore", api.TierSnapshot}
)

// measureRawWake puts one raw container into the tier and brings it back
// again and again: it times the command into the tier, and the command
// out of it to the first answer (polled, same client). Like measureWake it
// checks that the app's counter survived.
func (r *runner) measureRawWake(ctx context.Context, t string, w rawWake) error {
	leaveName := "raw-" + w.leave + "/" + t
	cl := r.res.AddSeries(leaveName+"/client",
		fmt.Sprintf("runsc %s started → first HTTP 200 from the sandbox's own address (polled every %s, same client as the gateway series; no sandstormd); compare wake-%s/%s/client", w.leave, r.cfg.poll, w.tier, t), "")
	leave := r.res.AddSeries(leaveName+"/runsc", fmt.Sprintf("the runsc %s command alone", w.leave), "")
	enter := r.res.AddSeries("raw-"+w.enter+"/"+t+"/runsc", fmt.Sprintf("the runsc %s command alone (hot → %s)", w.enter, w.tier), "")
	s := &series{r: r, main: cl, name: leaveName, n: r.upTo(r.cfg.wakeN)}
	e, err := r.ensureRaw(ctx)
	if err != nil {
		cl.Skipped = err.Error()
		return nil
	}
	url := e.url(r.cfg.port)
	b, prev, err := r.rawReady(ctx, e, w.series, t)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		cl.Skipped = err.Error()
		return nil
	}
	defer func() {
		if b != nil {
			e.remove(ctx, b)
		}
	}()
	for !s.done() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := sleep(ctx, r.cfg.settle); err != nil {
			return err
		}
		var enterD, leaveD, d time.Duration
		var t0 time.Time
		var body string
		var image string
		if w.enter == "pause" {
			_, enterD, err = e.runsc(ctx, b, "pause", b.id)
		} else {
			image, enterD, err = e.checkpoint(ctx, b)
		}
		if err == nil {
			err = sleep(ctx, r.cfg.dwell)
		}
		if err == nil {
			if w.leave == "resume" {
				t0, leaveD, err = e.runsc(ctx, b, "resume", b.id)
			} else {
				t0, leaveD, err = e.restore(ctx, b, image)
			}
		}
		if err == nil {
			d, _, body, err = r.firstAnswer(ctx, url, t0)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			stop := s.fail("%v", err)
			// Start over from a fresh container: this one's state is
			// unknown (a failed checkpoint kills it, for one).
			e.remove(ctx, b)
			if stop {
				b = nil
				return nil
			}
			if b, prev, err = r.rawReady(ctx, e, w.series, t); err != nil {
				b = nil
				cl.Skipped = err.Error()
				return nil
			}
			continue
		}
		s.ok()
		cl.AddDuration(d)
		leave.AddDuration(leaveD)
		enter.AddDuration(enterD)
		count, ok := parseCount(body)
		switch {
		case !ok:
			cl.Note("answer %q has no count=N", oneLine(body))
		case prev > 0 && count != prev+1:
			cl.Note("memory state lost: the app's counter went %d → %d across the %s", prev, count, w.leave)
		}
		if ok {
			prev = count
		} else {
			prev = -1
		}
		r.progress(leaveName, len(cl.SamplesMs), s.n, "first answer %s ms (runsc %s %s ms, %s %s ms)",
			bench.FormatMs(bench.Ms(d)), w.leave, bench.FormatMs(bench.Ms(leaveD)), w.enter, bench.FormatMs(bench.Ms(enterD)))
	}
	return nil
}
