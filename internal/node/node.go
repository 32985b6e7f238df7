// Package node is a Sandstorm node: the lifecycle of the sandboxes of one
// machine — create, list, delete, clone, live moves in and out, the
// master's fence, the start-up repair and a reload's handover — over its
// parts, each a package of its own with its own lock:
//
//   - tiering: each sandbox's in-memory state and its transitions between
//     tiers, the wakes and the idle timers;
//   - host: a sandbox's directory, network namespace, spec and boundary on
//     this machine (layout: the directory and the OCI spec; boundaries:
//     the sandboxes' ways out);
//   - reserve: the memory and disk reserves (admission's waits, pushes to
//     disk, the killed);
//   - warm: warm templates' images and pools; envdlink: envd in sandboxes;
//     livemove: a move's stream; internal/runtimes: the runsc builds kept.
//
// Its master reaches it through internal/nodeapi: in the same process or
// over mutual TLS, internal/nodeside is the node's side of that seam.
package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/gateway"
	"sandstorm/internal/logstamp"
	"sandstorm/internal/memguard"
	"sandstorm/internal/metrics"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/boundaries"
	"sandstorm/internal/node/envdlink"
	"sandstorm/internal/node/host"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/node/tiering"
	"sandstorm/internal/node/warm"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sam/boundary"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// The node's own cases of the errdefs kinds (the API's statuses come from
// errdefs.Table); a transition that does not apply is errdefs.ErrConflict,
// one the backend cannot do errdefs.ErrNotSupported.
var (
	// ErrFull: no address slot or gateway port left.
	ErrFull = host.ErrFull
	// ErrRefused: a wake or start that could not begin in time (no wake
	// or start slot, the sandbox busy with another transition).
	ErrRefused = tiering.ErrRefused
	// ErrMoving: anything that would run or change a sandbox while a move
	// of it is under way: 503, try again.
	ErrMoving = tiering.ErrMoving
	// ErrFirewall: the node's nftables table could not be installed; the
	// node must not run sandboxes without it (fail closed).
	ErrFirewall = errors.New("firewall not installed")
)

// Config configures a node.
type Config struct {
	// Name identifies the node in the store ("local" when master and node
	// share a process).
	Name    string
	DataDir string
	Backend sandbox.Backend
	Store   *store.Store
	Pool    netns.Pool
	// GatewayBind is the address gateway listeners bind; GatewayHost is the
	// host name put in endpoint URLs (defaults to GatewayBind).
	GatewayBind netip.Addr
	GatewayHost string
	// HostListen, when set, is the address of the gateway's one listener
	// routing by Host (http://<port>-<sandbox>.<HostDomain>:<its port>/),
	// beside the per-sandbox ports.
	HostListen, HostDomain string
	// PortMin and PortMax bound the gateway ports, inclusive (serve's
	// --gateway-ports).
	PortMin, PortMax int
	// MemReserveMiB: the node keeps this much MemAvailable (MiB) free: it
	// admits a create or a wake only if what is promised to starting
	// sandboxes still leaves it, and pushes the least-used sandboxes to
	// disk as it is approached (internal/node/reserve).
	MemReserveMiB int64
	// DefaultMemoryMiB is the memory limit of a sandbox whose template and
	// request set none (default 1024).
	DefaultMemoryMiB int64
	// DiskReserveMiB: the node keeps this much of its data dir's disk free
	// (internal/node/reserve); 0 disables. DiskFree overrides how it is read (tests).
	DiskReserveMiB int64
	DiskFree       func() (int64, error)
	// MaxWakes bounds wakes (cold starts, restores) running at once; the
	// rest wait, at most Admission, then are refused.
	MaxWakes int
	// Admission is how long a wake may wait to start (default 2 s).
	Admission time.Duration
	// MaxStarts bounds the runsc starts of creates and clones running at
	// once (default 4); the rest queue for as long as their caller waits.
	// Without a bound a burst of creates all run at once and all get
	// slower together: 200 at once on 2 cores took 76 s here, and under
	// CI's load 174 of them passed runsc run's 30 s deadline (TestConcurrentCreates).
	// A pooled create starts nothing and never queues; wakes have MaxWakes.
	MaxStarts int
	// Metrics are the node's Prometheus metrics (nil: none).
	Metrics *metrics.Node
	// Ready bounds how long the gateway retries the dial into a starting
	// sandbox (default 30 s).
	Ready  time.Duration
	Timers tier.Timers
	// Zswap: after freezing a sandbox, push its memory out to swap (zswap
	// when enabled), if the backend can (sandbox.Reclaimer).
	Zswap bool
	// SAM is how sandboxes reach the world (their boundaries).
	SAM SAM
	// MemAvailable overrides how free memory is read (tests); nil reads
	// /proc/meminfo.
	MemAvailable func() (int64, error)
	Log          *slog.Logger
	// Events receives what happens to the node's sandboxes (the
	// console's live view); nil: nobody watches.
	Events *events.Hub
	// Envd is the envd binary (cmd/sandstorm-envd, static) put in every
	// sandbox for the commands and files API (internal/node/envdlink); "" disables it.
	Envd string
	// Listen and ListenPacket, if set, open every listener of the node —
	// gateway, Host-routed listener, boundaries — and may return one
	// handed over by the process this one replaced (handover.go). Nil:
	// net.Listen, net.ListenPacket.
	Listen       func(network, address string, open func() (net.Listener, error)) (net.Listener, error)
	ListenPacket func(network, address string, open func() (net.PacketConn, error)) (net.PacketConn, error)
}

// DefaultMaxStarts is MaxStarts when unset. 200 creates at once on this
// 2-core machine (TestConcurrentCreates, idle) took 76.3 s unbounded,
// 92.4 s eight at a time, 73.7 s four and 72.3 s two at a time: runsc run
// is mostly CPU, so more at once is not faster, only each start slower —
// which is what pushed them past the 30 s deadline under load. Four keeps
// a lone create from waiting behind a long queue of one-at-a-time starts.
const DefaultMaxStarts = 4

// Node runs the sandboxes of one machine: their lifecycle (create, list,
// delete, moves, clones, the fence and the start-up repair) over its tier
// machine (internal/node/tiering) and its host (internal/node/host).
type Node struct {
	cfg    Config
	st     *store.Store
	be     sandbox.Backend
	gw     *gateway.Gateway
	log    *slog.Logger
	starts chan struct{} // semaphore of MaxStarts

	// h lays sandboxes out on this machine; tiers holds them and moves
	// them between tiers.
	h     *host.Host
	tiers *tiering.Machine

	allocMu sync.Mutex // serialises slot and port allocation
	// reserved maps the address slots of pooled sandboxes (which have no
	// row yet) to their IDs. Under allocMu.
	reserved map[int]string
	// fence is the last fence the master set (fence.go). Under allocMu.
	fence fenceMark

	// warm is the warm templates' images, pool their pooled sandboxes
	// (warm.go).
	warm *warm.Images
	pool *warm.Pool
	// hosts is the Host-routed gateway listener (nil: none), served from
	// the start-up repair on.
	hosts *gateway.HostListener
	// stamps times the lines of running sandboxes' console logs (nil if
	// inotify is not available: logs then have no times).
	stamps *logstamp.Stamper

	// envd is the envd builds sandboxes mount (envd.go; nil: none).
	envd *envdlink.Builds
	// kept is the runsc builds the node keeps, and which sandbox needs
	// which (runsc.go; nil: the backend runs no binary runtime).
	kept *runtimes.Keeper
	// bounds is its sandboxes' boundaries (boundary.go).
	bounds *boundaries.Set

	// adm is the node's admission: memory promises, disk, descriptors;
	// guard keeps the memory and disk reserves (memory.go); settled is
	// what each template build's sandboxes settled at; diskFree reads the
	// data dir's free disk.
	adm      *admission.Admission
	guard    *reserve.Guard
	settled  *reserve.Settled
	diskFree func() (int64, error)

	// reconciling counts the sandboxes the start-up reconcile has yet to
	// repair.
	reconciling atomic.Int64

	stop chan struct{}
	done sync.WaitGroup
}

// New makes a node. Call BeginReconcile before serving (FinishReconcile may run behind the API), and Run for the idle and
// memory loops.
func New(cfg Config) (*Node, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxWakes <= 0 {
		cfg.MaxWakes = 2
	}
	if cfg.Admission <= 0 {
		cfg.Admission = 2 * time.Second
	}
	if cfg.MaxStarts <= 0 {
		cfg.MaxStarts = DefaultMaxStarts
	}
	if cfg.GatewayHost == "" {
		cfg.GatewayHost = cfg.GatewayBind.String()
	}
	if cfg.SAM.Firewall.IfPrefix == "" {
		cfg.SAM.Firewall = netns.DefaultFirewall(VethPrefix)
	}
	if cfg.MemAvailable == nil {
		cfg.MemAvailable = memguard.AvailableMiB
	}
	if cfg.DefaultMemoryMiB <= 0 {
		cfg.DefaultMemoryMiB = 1024
	}
	if cfg.PortMin <= 0 || cfg.PortMax < cfg.PortMin || cfg.PortMax > 65535 {
		return nil, fmt.Errorf("gateway port range %d-%d is not valid", cfg.PortMin, cfg.PortMax)
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "sandboxes"), 0o700); err != nil {
		return nil, err
	}
	n := &Node{
		cfg: cfg, st: cfg.Store, be: cfg.Backend, log: cfg.Log,
		starts:   make(chan struct{}, cfg.MaxStarts),
		reserved: map[int]string{},
		stop:     make(chan struct{}),
	}
	fg, err := cfg.Store.Counter(context.Background(), fenceCounter)
	if err != nil {
		return nil, err
	}
	n.fence.gen = fg
	if n.envd, err = installEnvd(cfg.DataDir, cfg.Envd, cfg.Log); err != nil {
		return nil, err
	}
	if err := n.installRunsc(); err != nil {
		return nil, err
	}
	if st, err := logstamp.New(); err == nil {
		n.stamps = st
	} else {
		cfg.Log.Warn("console log lines get no times", "err", err)
	}
	n.newBoundaries()
	n.h = host.New(host.Config{DataDir: cfg.DataDir, Backend: cfg.Backend, Pool: cfg.Pool, Kept: n.kept, Bounds: n.bounds,
		Activity: func(id string) boundary.Activity { return n.tiers.Egress(id) }, DefaultMemoryMiB: cfg.DefaultMemoryMiB,
		Secrets: cfg.SAM.Secrets, SecretRoots: cfg.SAM.SecretRoots, Log: cfg.Log})
	n.newReserves()
	n.newWarm()
	n.tiers = tiering.New(tiering.Config{Node: cfg.Name, Store: cfg.Store, Backend: cfg.Backend, Host: n.h, Kept: n.kept, Envd: n.envd,
		Guard: n.guard, Adm: n.adm, Events: cfg.Events, Metrics: cfg.Metrics, Timers: cfg.Timers, Zswap: cfg.Zswap, MaxWakes: cfg.MaxWakes, Log: cfg.Log})
	n.gw = gateway.New(gateway.Config{Admission: cfg.Admission, Ready: cfg.Ready, Mark: cfg.SAM.Firewall.IngressMark, Listen: cfg.Listen}, n.tiers, cfg.Log)
	n.tiers.SetGateway(n.gw)
	if cfg.HostListen != "" {
		if n.hosts, err = gateway.OpenHostListener(cfg.HostListen, cfg.HostDomain, cfg.Listen); err != nil {
			if n.stamps != nil {
				n.stamps.Close()
			}
			return nil, err
		}
	}
	return n, nil
}

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Backend is the node's sandbox backend.
func (n *Node) Backend() sandbox.Backend { return n.be }

func newID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// Create starts a new sandbox from template t and returns it hot: taken
// from the template's warm pool when it has a sandbox ready and the create
// gives no name (internal/node/warm), else restored from its warm image if it has
// one, else a cold start. On any failure everything it made is removed and
// no row is left.
//
// gen is the master's number for this placement (0: none): the node
// stores it with the sandbox, and refuses a create that its master has
// already fenced off (fence.go).
//
// A create with secrets starts cold: its CA must be in its trust store
// before any of its processes reads it (secretbind.Install).
func (n *Node) Create(ctx context.Context, t store.Template, name, principal string, memoryMiB int, gen int64, egress *api.Egress, secrets []inject.Binding) (store.Sandbox, error) {
	how := "cold"
	var pre *warm.Pooled
	if name == "" && len(secrets) == 0 && memoryMiB >= 0 && t.Warm != nil && t.Warm.Pool > 0 {
		if p, ok := n.pool.Take(t.Name, n.LimitMiB(t, memoryMiB)); ok {
			pre, how = &p, "pooled"
		}
	}
	sb, err := n.create(ctx, t, name, principal, memoryMiB, gen, egress, pre, func(sb store.Sandbox) error {
		if pre != nil {
			return n.startPooled(sb, t)
		}
		if len(secrets) > 0 {
			if err := n.h.InstallSecrets(sb, t, secrets); err != nil {
				return err
			}
			return n.tiers.ColdStart(context.Background(), sb, t, false)
		}
		warm, err := n.warmStart(context.Background(), sb, t)
		if warm {
			how = "warm"
			return err
		}
		return n.tiers.ColdStart(context.Background(), sb, t, false)
	})
	n.tiers.CountCreate(how, err)
	if err == nil {
		n.log.Info("sandbox created", "id", sb.ID, "name", sb.Name, "template", t.Name, "ms", sb.LastWakeMs, "memory_mib", sb.MemoryMiB, "start", how)
		n.cfg.Events.Publish(events.Event{Kind: events.Create, ID: sb.ID, Name: sb.Name, Template: t.Name, To: string(api.TierHot), Ms: sb.LastWakeMs, Node: n.cfg.Name, Reason: how})
	} else if errors.Is(err, errdefs.ErrNoRoom) {
		// Turned away for want of room (memory, disk, descriptors, address
		// slots, ports, a start slot): a 503 for the client, logged too.
		n.log.Warn("create refused", "name", name, "template", t.Name, "why", err.Error())
		n.cfg.Events.Publish(events.Event{Kind: events.Refusal, Name: name, Template: t.Name, Node: n.cfg.Name, Reason: "create: " + err.Error()})
	} else if !errors.Is(err, errdefs.ErrBadInput) && !errors.Is(err, errdefs.ErrExists) {
		n.log.Warn("create failed", "name", name, "template", t.Name, "start", how, "err", err) // its caller may be gone
	}
	return sb, err
}

// create is what Create and Clone share: check the name and principal,
// admit the sandbox's memory and disk, allocate its address slot and
// gateway ports, record it, run start (which brings it up: a cold start,
// or a restore), open its gateway listeners and commit it hot. start runs
// to its end even if ctx is cancelled. With pre, the sandbox is that
// pooled one: its ID, slot and name are the pool's, its memory is already
// taken (no admission), and if create fails before start it is removed.
func (n *Node) create(ctx context.Context, t store.Template, name, principal string, memoryMiB int, gen int64, egress *api.Egress, pre *warm.Pooled, start func(store.Sandbox) error) (sb store.Sandbox, err error) {
	// A pooled sandbox is this create's to remove until its row is
	// recorded; from then on a failure is cleaned up as any create's.
	pooledOwned := pre != nil
	defer func() {
		if err != nil && pooledOwned {
			warmCore{n}.Discard(*pre)
		}
	}()
	if memoryMiB < 0 {
		return store.Sandbox{}, fmt.Errorf("%w: memory_mib %d is negative", errdefs.ErrBadInput, memoryMiB)
	}
	if err := n.adm.Disk("a new sandbox", 0); err != nil {
		return store.Sandbox{}, err
	}
	if err := n.adm.FDs(); err != nil {
		return store.Sandbox{}, err
	}
	id, slot := newID(), -1
	if pre != nil {
		id, slot = pre.ID, pre.Slot
	}
	limit := n.LimitMiB(t, memoryMiB)
	if pre == nil {
		if err := n.guard.Admit(ctx, id, func() error { return n.adm.Start(id, reserve.SizeKey(t), limit) }); err != nil {
			return store.Sandbox{}, err
		}
	}
	created := false
	defer func() {
		if !created {
			n.adm.Release(id)
		}
	}()
	if pre == nil {
		// Queue for a start slot before anything is recorded, so that a
		// caller that gives up while queued leaves nothing behind.
		select {
		case n.starts <- struct{}{}:
			defer func() { <-n.starts }()
		case <-ctx.Done():
			return store.Sandbox{}, fmt.Errorf("%w: the caller gave up while %d starts were running on this node and more were queued: %v", ErrRefused, n.cfg.MaxStarts, context.Cause(ctx))
		}
	}
	if name, principal, err = host.NamesOf(id, name, principal, t); err != nil {
		return store.Sandbox{}, err
	}
	now := time.Now()
	sb = store.Sandbox{ID: id, Name: name, Template: t.Name, Node: n.cfg.Name, Backend: n.be.Name(),
		Tier: api.TierDetached, Transition: api.TierHot, LastActive: now, CreatedAt: now, Principal: principal,
		MemoryMiB: int(limit), Slot: slot, Generation: gen, Runsc: string(n.kept.Current()), Egress: egress}
	// Allocate and record in one step so two creates never share a slot,
	// and none slips in behind a fence (Fence holds the same lock).
	n.allocMu.Lock()
	err = n.fenced(gen)
	if err == nil {
		err = n.allocate(ctx, &sb, t.Ports)
	}
	if err == nil {
		err = n.st.CreateSandbox(ctx, sb)
	}
	if err == nil && pre != nil {
		if n.reserved[pre.Slot] == pre.ID {
			delete(n.reserved, pre.Slot) // the row's from now on
		}
		pooledOwned = false
	}
	n.allocMu.Unlock()
	if err != nil {
		return store.Sandbox{}, err
	}
	e := n.tiers.Entry(id)
	e.SetLastActive(now.UnixMilli())
	e.Hold()
	defer e.Release()
	began := time.Now()
	// From here the start runs to the end even if the caller goes away: a
	// runsc run killed half-way leaves more to clean than it saves.
	if err := start(sb); err != nil {
		n.h.Teardown(context.Background(), sb, true)
		n.st.DeleteSandbox(context.Background(), id)
		n.tiers.Forget(id)
		return store.Sandbox{}, fmt.Errorf("start sandbox: %w", err)
	}
	if err := n.listen(sb); err != nil {
		n.h.Teardown(context.Background(), sb, true)
		n.st.DeleteSandbox(context.Background(), id)
		n.tiers.Forget(id)
		return store.Sandbox{}, err
	}
	ms := float64(time.Since(began).Microseconds()) / 1000
	n.h.Protect(sb)
	created = true
	return n.tiers.Commit(id, api.TierHot, func(s *store.Sandbox) { s.LastWakeMs, s.LastWakeFrom = ms, "" })
}

// SetEgress replaces sandbox id's egress rules (nil: none) in its row, so
// a wake, a move and a restart keep them, and in its boundary for new
// flows at once (open ones go on: boundary.SetEgress). Under the
// sandbox's lock, and never mid-move: the move's manifest is its rows.
func (n *Node) SetEgress(ctx context.Context, id string, e *api.Egress) (store.Sandbox, error) {
	rules, err := host.ParseEgress(e)
	if err != nil {
		return store.Sandbox{}, errdefs.Mark(errdefs.ErrBadInput, err)
	}
	ent := n.tiers.Entry(id)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ent.Acquire(actx); err != nil {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s is busy with a transition; try again when it is done", errdefs.ErrConflict, id)
	}
	defer ent.Release()
	sb, err := n.st.UpdateSandbox(ctx, id, func(s *store.Sandbox) error {
		if s.MoveOut != 0 || s.MoveIn {
			return fmt.Errorf("%w: sandbox %s is moving; set its rules when the move is done", errdefs.ErrConflict, s.Name)
		}
		s.Egress = e
		return nil
	})
	if err == nil {
		n.bounds.SetEgress(sb.ID, rules)
		n.cfg.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	}
	return sb, err
}

// allocate picks a free address slot (unless sb has one: a pooled
// sandbox's) and one free gateway port per template port. Caller holds
// allocMu.
func (n *Node) allocate(ctx context.Context, sb *store.Sandbox, ports []int) error {
	if sb.Slot < 0 {
		slot, err := n.freeSlot(ctx)
		if err != nil {
			return err
		}
		sb.Slot = slot
	}
	_, used, err := n.st.UsedSlots(ctx, n.cfg.Name)
	if err != nil {
		return err
	}
	sb.HostPorts = map[int]int{}
	p := n.cfg.PortMin
	for _, port := range ports {
		for ; p <= n.cfg.PortMax && used[p]; p++ {
		}
		if p > n.cfg.PortMax {
			return fmt.Errorf("%w: no free gateway port in %d-%d", ErrFull, n.cfg.PortMin, n.cfg.PortMax)
		}
		sb.HostPorts[port] = p
		used[p] = true
	}
	return nil
}

// listen opens the gateway listeners of sb.
func (n *Node) listen(sb store.Sandbox) error {
	nw, err := n.h.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	return n.gw.Listen(sb.ID, n.cfg.GatewayBind, nw.Sandbox.Addr(), sb.HostPorts)
}

// Get returns the sandbox id (or name) as the API shows it.
func (n *Node) Get(ctx context.Context, ref string) (store.Sandbox, error) {
	sb, err := n.st.GetSandbox(ctx, ref)
	if err != nil {
		return sb, err
	}
	if e, ok := n.tiers.Lookup(sb.ID); ok {
		if la := e.LastActive(); la > sb.LastActive.UnixMilli() {
			sb.LastActive = time.UnixMilli(la).UTC()
		}
	}
	return sb, nil
}

// Endpoints maps each template port of sb to its gateway URL.
func (n *Node) Endpoints(sb store.Sandbox) map[string]string {
	out := map[string]string{}
	for sport, hport := range sb.HostPorts {
		out[strconv.Itoa(sport)] = "http://" + netip.AddrPortFrom(mustAddr(n.cfg.GatewayHost), uint16(hport)).String()
	}
	return out
}

// HostEndpoints returns, per sandbox port, its URL on the Host-routed
// listener (nil when there is none).
func (n *Node) HostEndpoints(sb store.Sandbox) map[string]string {
	return n.hosts.Endpoints(sb.Name, sb.HostPorts)
}

func mustAddr(host string) netip.Addr {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.IPv4Unspecified()
	}
	return a
}

// Delete removes sandbox id and everything it had: container, namespace,
// veth, mounts, volume, snapshot and row. Once it has begun it runs to the
// end whatever happens to ctx (a client that gives up mid-way must not
// leave a runsc sandbox, netns and veth behind: issue 7), and it is
// idempotent: a delete of a sandbox another delete is removing waits for
// that one and succeeds.
func (n *Node) Delete(ctx context.Context, id string) error {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	// Recorded first, so a crash part-way is finished by Reconcile.
	if err := n.tiers.Begin(sb.ID, transitionDelete); err != nil {
		return err
	}
	n.tiers.CutEnvd(sb.ID, tiering.CutDeleted)
	n.gw.Close(sb.ID)
	e := n.tiers.Entry(sb.ID)
	// A transition holding the lock (a checkpoint, a wake) finishes first;
	// each of those is bounded by the backend's deadlines.
	bg, cancel := context.WithTimeout(context.Background(), deleteWait)
	defer cancel()
	if err := e.Acquire(bg); err != nil {
		return fmt.Errorf("%w: sandbox %s: another transition held it for %v; the delete is recorded and finishes at the next start", errdefs.ErrConflict, sb.ID, deleteWait)
	}
	defer e.Release()
	if _, err := n.st.GetSandbox(bg, sb.ID); errors.Is(err, errdefs.ErrNotFound) {
		return nil // a concurrent delete finished it
	}
	// Again under the lock: a transition that held it cleared the mark
	// when it committed.
	if err := n.tiers.Begin(sb.ID, transitionDelete); err != nil {
		return err
	}
	if err := n.h.Teardown(bg, sb, true); err != nil {
		return err
	}
	if err := n.st.DeleteSandbox(bg, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	n.tiers.Forget(sb.ID)
	n.cfg.SAM.Flows.Drop(sb.ID)
	n.adm.Release(sb.ID)
	n.kept.Changed(runtimes.Key(sb.Runsc))
	n.log.Info("sandbox deleted", "id", sb.ID)
	n.cfg.Metrics.Delete()
	n.cfg.Events.Publish(events.Event{Kind: events.Delete, ID: sb.ID, Name: sb.Name, Node: n.cfg.Name})
	return nil
}

// deleteWait bounds how long a delete waits for a transition in progress.
const deleteWait = 5 * time.Minute

// transitionDelete is stored in Transition while a delete is in progress.
const transitionDelete api.Tier = "deleted"

// List returns every sandbox on this node.
func (n *Node) List(ctx context.Context) ([]store.Sandbox, error) {
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if e, ok := n.tiers.Lookup(all[i].ID); ok {
			if la := e.LastActive(); la > all[i].LastActive.UnixMilli() {
				all[i].LastActive = time.UnixMilli(la).UTC()
			}
		}
	}
	return all, nil
}

// Status is the node's headroom.
func (n *Node) Status(ctx context.Context) (api.NodeStatus, error) {
	avail, err := n.cfg.MemAvailable()
	if err != nil {
		return api.NodeStatus{}, err
	}
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return api.NodeStatus{}, err
	}
	counts := map[api.Tier]int{api.TierHot: 0, api.TierFrozen: 0, api.TierSnapshot: 0, api.TierDetached: 0}
	for _, sb := range all {
		counts[sb.Tier]++
	}
	return api.NodeStatus{Name: n.cfg.Name, Backend: n.be.Name(), MemAvailableMiB: avail, MemReserveMiB: n.cfg.MemReserveMiB, Sandboxes: counts,
		Reconciling: int(n.reconciling.Load()), WarmPool: n.pool.Sizes(), PromisedMiB: n.adm.Promised(), State: "ready", Transitions: transitionsTo(n.cfg.Metrics)}, nil
}

// Dir is sandbox id's directory on the node (its console log, its
// overlay's upper layer: internal/node/layout).
func (n *Node) Dir(id string) layout.Dir { return n.h.Dir(id) }

// Close stops the loops and the gateway. Sandboxes keep running: a
// restarted daemon adopts them.
func (n *Node) Close() {
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	n.done.Wait()
	n.tiers.Finishing().Wait()
	// Pooled sandboxes are not state: a restarted node refills its pools.
	n.pool.Drain("")
	n.hosts.Close()
	n.gw.CloseAll()
	if n.stamps != nil {
		defer n.stamps.Close()
	}
	n.bounds.Close()
	n.tiers.FlushActivity()
}

// The sandbox's network and tiers, as the seam (internal/nodeside) and the
// gateway ask for them: the host's and the tier machine's.

// Names of kernel objects (host.NetnsPrefix, host.VethPrefix).
const (
	NetnsPrefix = host.NetnsPrefix
	VethPrefix  = host.VethPrefix
)

// PrincipalOf is who sb is: its own principal, else its name.
func PrincipalOf(sb store.Sandbox) string { return host.PrincipalOf(sb) }

// Address returns the sandbox's own address.
func (n *Node) Address(sb store.Sandbox) string { return n.h.Address(sb) }

// LimitMiB is the memory limit a new sandbox of t gets (host.LimitMiB).
func (n *Node) LimitMiB(t store.Template, override int) int64 { return n.h.LimitMiB(t, override) }

// Wake brings sandbox id to hot from any tier (tiering.Machine.Wake).
func (n *Node) Wake(ctx context.Context, id string) error { return n.tiers.Wake(ctx, id) }

// Freeze pauses a hot sandbox in place.
func (n *Node) Freeze(ctx context.Context, id string) (store.Sandbox, error) {
	return n.tiers.Freeze(ctx, id)
}

// Snapshot checkpoints a hot or frozen sandbox to the node's disk.
func (n *Node) Snapshot(ctx context.Context, id string) (store.Sandbox, error) {
	return n.tiers.Snapshot(ctx, id)
}

// Detach removes a sandbox's processes, namespace and snapshot, keeping
// its volume.
func (n *Node) Detach(ctx context.Context, id string) (store.Sandbox, error) {
	return n.tiers.Detach(ctx, id)
}

// SetIdle gives sandbox id idle timers of its own (nil: the node's).
func (n *Node) SetIdle(ctx context.Context, id string, idle *api.IdleTimers) error {
	return n.tiers.SetIdle(ctx, id, idle)
}
