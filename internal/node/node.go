// Package node is a Sandstorm node: it runs sandboxes with a backend, gives
// each its network namespace, moves them between tiers (transitions.go),
// wakes them on traffic through the gateway, protects itself from running
// out of memory, and reconciles with what is really there after a restart.
//
// The master talks to a node only through its exported methods, so the two
// can later live in different processes (the fleet issue) without the node
// changing.
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
	"sort"
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
	"sandstorm/internal/node/layout"
	"sandstorm/internal/node/reserve"
	"sandstorm/internal/node/warm"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// The node's own cases of the errdefs kinds (the API's statuses come from
// errdefs.Table); a transition that does not apply is errdefs.ErrConflict,
// one the backend cannot do errdefs.ErrNotSupported, a wake that could not
// start in time gateway.ErrRefused.
var (
	// ErrFull: no address slot or gateway port left.
	ErrFull = errdefs.Refine(errdefs.ErrNoRoom, "node full")
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
	// GatewayPorts is the inclusive range of gateway ports.
	PortMin, PortMax int
	// MemReserveMiB: the node keeps this much MemAvailable (MiB) free: it
	// admits a create or a wake only if what is promised to starting
	// sandboxes still leaves it, and pushes the least-used sandboxes to
	// disk as it is approached (memory.go).
	MemReserveMiB int64
	// DefaultMemoryMiB is the memory limit of a sandbox whose template and
	// request set none (default 1024).
	DefaultMemoryMiB int64
	// DiskReserveMiB: the node keeps this much of its data dir's disk free
	// (disk.go); 0 disables. DiskFree overrides how it is read (tests).
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
	// sandbox for the commands and files API (envd.go); "" disables it.
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

// Node runs the sandboxes of one machine.
type Node struct {
	cfg    Config
	st     *store.Store
	be     sandbox.Backend
	gw     *gateway.Gateway
	log    *slog.Logger
	wakes  chan struct{} // semaphore of MaxWakes
	starts chan struct{} // semaphore of MaxStarts

	allocMu sync.Mutex // serialises slot and port allocation
	// reserved maps the address slots of pooled sandboxes (which have no
	// row yet) to their IDs. Under allocMu.
	reserved map[int]string
	// warm is the warm templates' images, pool their pooled sandboxes
	// (warm.go).
	warm *warm.Images
	pool *warm.Pool
	// hostLn is the Host-routed gateway listener (nil: none), served
	// from the start-up repair on (hostOnce).
	hostLn   net.Listener
	hostOnce sync.Once
	// stamps times the lines of running sandboxes' console logs (nil if
	// inotify is not available: logs then have no times).
	stamps *logstamp.Stamper

	mu      sync.Mutex
	entries map[string]*entry

	// envd is the envd builds sandboxes mount (envd.go; nil: none);
	// renewed the warm templates whose image this run made again
	// (renewWarm).
	envd    *envdlink.Builds
	renewMu sync.Mutex
	renewed map[string]bool

	// kept is the runsc builds the node keeps, and which sandbox needs
	// which (runsc.go; nil: the backend runs no binary runtime).
	kept *runtimes.Keeper

	// bounds is its sandboxes' boundaries (boundary.go).
	bounds *boundaries.Set

	// adm is the node's admission: memory promises, disk, descriptors.
	adm *admission.Admission

	// fence is the last fence the master set (fence.go). Under allocMu.
	fence fenceMark

	// reconciling counts the sandboxes the start-up reconcile has yet to
	// repair.
	reconciling atomic.Int64

	// guard keeps the memory and disk reserves (memory.go); settled is
	// what each template build's sandboxes settled at; diskFree reads the
	// data dir's free disk.
	guard    *reserve.Guard
	settled  *reserve.Settled
	diskFree func() (int64, error)

	stop chan struct{}
	done sync.WaitGroup
	// finishing counts transitions' work left for after their answer
	// (transitionThen), each holding its sandbox's lock.
	finishing sync.WaitGroup
}

// entry is the node's in-memory view of one sandbox. The store has the
// durable copy; the entry adds what changes too often to write (activity)
// and the locks that serialise transitions.
type entry struct {
	id   string
	lock chan struct{} // held by a transition; a chan so waits can time out

	tier       atomic.Value // api.Tier
	tierSince  atomic.Int64 // unix ms
	lastActive atomic.Int64 // unix ms
	flushed    atomic.Int64 // lastActive last written to the store

	// lastUsageMiB is what it took from MemAvailable just before its
	// last checkpoint (heldMiB): what its restore is admitted at.
	lastUsageMiB atomic.Int64

	mu     sync.Mutex
	waking *wakeCall

	// envd is its link to the envd inside it: the calls in flight (they
	// keep the sandbox busy), cut before it loses its processes.
	envd envdlink.Link
	// egressCalls are its mesh requests in flight through its boundary:
	// an agent waiting on a model's answer is busy (egress.go).
	egressCalls atomic.Int32

	// timers are its own idle timers (nil: the node's).
	timers atomic.Pointer[tier.Timers]

	// moving: it is leaving by a move, or arrived by one not yet
	// confirmed (move.go): busy to the idle timers, the memory guard
	// and the disk reserve, whatever its tier.
	moving atomic.Bool
}

type wakeCall struct {
	done chan struct{}
	err  error
	// shared counts the callers waiting on it besides the one running
	// it (under the entry's mu): what the node's tests wait for.
	shared int
}

func (e *entry) getTier() api.Tier { t, _ := e.tier.Load().(api.Tier); return t }

func (e *entry) setTier(t api.Tier) {
	e.tier.Store(t)
	e.tierSince.Store(time.Now().UnixMilli())
	if t == api.TierSnapshot || t == api.TierDetached {
		// Its envd's connections died with its processes, however it
		// got here (a transition cuts them first; a sandbox whose
		// process exited is settled detached without one).
		e.envd.Drop()
	}
}

// acquire takes the transition lock, giving up when ctx ends.
func (e *entry) acquire(ctx context.Context) error {
	select {
	case e.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *entry) release() { <-e.lock }

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
		wakes:    make(chan struct{}, cfg.MaxWakes),
		starts:   make(chan struct{}, cfg.MaxStarts),
		entries:  map[string]*entry{},
		reserved: map[int]string{},
		stop:     make(chan struct{}),
	}
	n.newReserves()
	fg, err := cfg.Store.Counter(context.Background(), fenceCounter)
	if err != nil {
		return nil, err
	}
	n.fence.gen = fg
	if err := n.installEnvd(); err != nil {
		return nil, err
	}
	if err := n.installRunsc(); err != nil {
		return nil, err
	}
	n.newWarm()
	n.newBoundaries()
	if st, err := logstamp.New(); err == nil {
		n.stamps = st
	} else {
		cfg.Log.Warn("console log lines get no times", "err", err)
	}
	n.gw = gateway.New(gateway.Config{Admission: cfg.Admission, Ready: cfg.Ready, Mark: cfg.SAM.Firewall.IngressMark, Listen: cfg.Listen}, n, cfg.Log)
	if err := n.serveHosts(); err != nil {
		if n.stamps != nil {
			n.stamps.Close()
		}
		return nil, err
	}
	return n, nil
}

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Backend is the node's sandbox backend.
func (n *Node) Backend() sandbox.Backend { return n.be }

func (n *Node) dir(id string) layout.Dir {
	return layout.Dir(filepath.Join(n.cfg.DataDir, "sandboxes", id))
}

// Net returns the network of a sandbox in address slot slot.
func (n *Node) Net(id string, slot int) (netns.Net, error) {
	host, sb, err := n.cfg.Pool.Addrs(slot)
	if err != nil {
		return netns.Net{}, err
	}
	return netns.Net{Name: NetnsPrefix + id, HostIf: VethPrefix + id, Host: host, Sandbox: sb}, nil
}

// Names of kernel objects: "ss-<id>" namespaces and "ssv<id>" host veths
// (3 + 12 = 15 bytes, the limit for an interface name). VethPrefix also
// tells the firewall and the boundaries' address guard what a sandbox's
// link is; the benchmarks look for both.
const (
	NetnsPrefix = "ss-"
	VethPrefix  = "ssv"
)

func (n *Node) spec(sb store.Sandbox) sandbox.Spec {
	d := n.dir(sb.ID)
	return sandbox.Spec{ID: sb.ID, Bundle: d.Bundle(), Netns: filepath.Join(netns.Dir, NetnsPrefix+sb.ID), LogPath: d.Log(),
		Runtime: n.kept.PathOf(runtimes.Key(sb.Runsc))}
}

func (n *Node) entry(id string) *entry {
	n.mu.Lock()
	defer n.mu.Unlock()
	e := n.entries[id]
	if e == nil {
		e = &entry{id: id, lock: make(chan struct{}, 1)}
		e.setTier(api.TierDetached)
		n.entries[id] = e
	}
	return e
}

func (n *Node) lookup(id string) (*entry, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.entries[id]
	return e, ok
}

func (n *Node) forget(id string) {
	n.mu.Lock()
	delete(n.entries, id)
	n.mu.Unlock()
}

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
func (n *Node) Create(ctx context.Context, t store.Template, name, principal string, memoryMiB int, gen int64) (store.Sandbox, error) {
	how := "cold"
	var pre *warm.Pooled
	if name == "" && memoryMiB >= 0 && t.Warm != nil && t.Warm.Pool > 0 {
		if p, ok := n.pool.Take(t.Name, n.LimitMiB(t, memoryMiB)); ok {
			pre, how = &p, "pooled"
		}
	}
	sb, err := n.create(ctx, t, name, principal, memoryMiB, gen, pre, func(sb store.Sandbox) error {
		if pre != nil {
			return n.startPooled(sb, t)
		}
		warm, err := n.warmStart(context.Background(), sb, t)
		if warm {
			how = "warm"
			return err
		}
		return n.coldStart(context.Background(), sb, t, false)
	})
	n.countCreate(how, err)
	if err == nil {
		n.log.Info("sandbox created", "id", sb.ID, "name", sb.Name, "template", t.Name, "ms", sb.LastWakeMs, "memory_mib", sb.MemoryMiB, "start", how)
		n.cfg.Events.Publish(events.Event{Kind: events.Create, ID: sb.ID, Name: sb.Name, Template: t.Name, To: string(api.TierHot), Ms: sb.LastWakeMs, Node: n.cfg.Name, Reason: how})
	} else if errors.Is(err, errdefs.ErrNoRoom) {
		// Turned away for want of room (memory, disk, descriptors, address
		// slots or ports, a start slot): the answer is a 503 the client
		// sees, and the node's log says it too, with the same reason.
		n.log.Warn("create refused", "name", name, "template", t.Name, "why", err.Error())
		n.cfg.Events.Publish(events.Event{Kind: events.Refusal, Name: name, Template: t.Name, Node: n.cfg.Name, Reason: "create: " + err.Error()})
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
func (n *Node) create(ctx context.Context, t store.Template, name, principal string, memoryMiB int, gen int64, pre *warm.Pooled, start func(store.Sandbox) error) (sb store.Sandbox, err error) {
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
		if err := n.guard.Admit(ctx, id, func() error { return n.adm.Start(id, sizeKey(t), limit) }); err != nil {
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
			return store.Sandbox{}, fmt.Errorf("%w: the caller gave up while %d starts were running on this node and more were queued: %v", gateway.ErrRefused, n.cfg.MaxStarts, context.Cause(ctx))
		}
	}
	if name == "" {
		name = warm.PooledName(id)
	}
	if !api.ValidName(name) {
		return store.Sandbox{}, fmt.Errorf("%w: name %q: use 1-63 of a-z, 0-9 and '-'", errdefs.ErrBadInput, name)
	}
	if principal == "" {
		principal = t.Principal
	}
	if principal != "" && !api.ValidPrincipal(principal) {
		return store.Sandbox{}, fmt.Errorf("%w: principal %q: use 1-128 of a-z, A-Z, 0-9 and '._-'", errdefs.ErrBadInput, principal)
	}
	now := time.Now()
	sb = store.Sandbox{ID: id, Name: name, Template: t.Name, Node: n.cfg.Name, Backend: n.be.Name(),
		Tier: api.TierDetached, Transition: api.TierHot, LastActive: now, CreatedAt: now, Principal: principal,
		MemoryMiB: int(limit), Slot: slot, Generation: gen, Runsc: string(n.kept.Current())}
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
	e := n.entry(id)
	e.lastActive.Store(now.UnixMilli())
	e.lock <- struct{}{}
	defer e.release()
	began := time.Now()
	// From here the start runs to the end even if the caller goes away: a
	// runsc run killed half-way leaves more to clean than it saves.
	if err := start(sb); err != nil {
		n.teardown(context.Background(), sb, true)
		n.st.DeleteSandbox(context.Background(), id)
		n.forget(id)
		return store.Sandbox{}, fmt.Errorf("start sandbox: %w", err)
	}
	if err := n.listen(sb); err != nil {
		n.teardown(context.Background(), sb, true)
		n.st.DeleteSandbox(context.Background(), id)
		n.forget(id)
		return store.Sandbox{}, err
	}
	ms := float64(time.Since(began).Microseconds()) / 1000
	n.protect(sb)
	created = true
	return n.commit(id, api.TierHot, func(s *store.Sandbox) { s.LastWakeMs, s.LastWakeFrom = ms, "" })
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
	nw, err := n.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	return n.gw.Listen(sb.ID, n.cfg.GatewayBind, nw.Sandbox.Addr(), sb.HostPorts)
}

// commit records that sandbox id is now in tier to (clearing its
// transition) and applies extra changes to the row in the same write.
func (n *Node) commit(id string, to api.Tier, extra func(*store.Sandbox)) (store.Sandbox, error) {
	e := n.entry(id)
	var released string
	sb, err := n.st.UpdateSandbox(context.Background(), id, func(s *store.Sandbox) error {
		s.Tier, s.Transition = to, ""
		if to == api.TierDetached {
			// Its memory is gone, and with it the need for its runsc build.
			released, s.Runsc = s.Runsc, ""
		}
		if la := e.lastActive.Load(); la > s.LastActive.UnixMilli() {
			s.LastActive = time.UnixMilli(la)
		}
		if extra != nil {
			extra(s)
		}
		return nil
	})
	if err == nil {
		e.setTier(to)
		e.flushed.Store(sb.LastActive.UnixMilli())
		n.kept.Changed(runtimes.Key(released))
	}
	return sb, err
}

// begin records that a transition of id towards to has started.
func (n *Node) begin(id string, to api.Tier) error {
	_, err := n.st.UpdateSandbox(context.Background(), id, func(s *store.Sandbox) error {
		s.Transition = to
		return nil
	})
	return err
}

// Get returns the sandbox id (or name) as the API shows it.
func (n *Node) Get(ctx context.Context, ref string) (store.Sandbox, error) {
	sb, err := n.st.GetSandbox(ctx, ref)
	if err != nil {
		return sb, err
	}
	if e, ok := n.lookup(sb.ID); ok {
		if la := e.lastActive.Load(); la > sb.LastActive.UnixMilli() {
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
	if n.hostLn == nil {
		return nil
	}
	_, lport, _ := net.SplitHostPort(n.hostLn.Addr().String())
	out := map[string]string{}
	for sport := range sb.HostPorts {
		out[strconv.Itoa(sport)] = "http://" + strconv.Itoa(sport) + "-" + sb.Name + "." + n.cfg.HostDomain + ":" + lport
	}
	return out
}

// serveHosts opens the Host-routed listener, if configured.
func (n *Node) serveHosts() error {
	if n.cfg.HostListen == "" {
		return nil
	}
	if n.cfg.HostDomain == "" {
		n.cfg.HostDomain = "sandbox.localhost"
	}
	open := func() (net.Listener, error) { return net.Listen("tcp", n.cfg.HostListen) }
	var ln net.Listener
	var err error
	if n.cfg.Listen != nil {
		ln, err = n.cfg.Listen("tcp", n.cfg.HostListen, open)
	} else {
		ln, err = open()
	}
	if err != nil {
		return fmt.Errorf("gateway host listener: %w", err)
	}
	n.hostLn = ln
	return nil
}

// serveHostsLoop starts the Host-routed listener's accept loop (if there is
// one), once: from planReconcile, when every known sandbox is marked as
// being repaired, so that a request for one waits for its repair (below)
// instead of finding no such sandbox. Until then connections wait in the
// listener's backlog (one handed over by a reload included).
func (n *Node) serveHostsLoop() {
	if n.hostLn == nil {
		return
	}
	n.hostOnce.Do(func() { go n.serveHostsAccept(n.hostLn) })
}

func (n *Node) serveHostsAccept(ln net.Listener) {
	n.gw.ServeHosts(ln, n.cfg.HostDomain, func(ref string) (string, bool) {
		sb, err := n.st.GetSandbox(context.Background(), ref)
		if err != nil || sb.Node != n.cfg.Name {
			return "", false
		}
		// After a start or a reload the gateway knows a sandbox once it is
		// repaired (reconcileOne opens its listeners under its lock): a
		// request for it waits for that, as one to its own port waits in
		// the listener's backlog, rather than being told 404.
		if n.Reconciling() > 0 {
			if e, ok := n.lookup(sb.ID); ok {
				ctx, cancel := context.WithTimeout(context.Background(), reconcileEach)
				if e.acquire(ctx) == nil {
					e.release()
				}
				cancel()
			}
		}
		return sb.ID, true
	})
}

func mustAddr(host string) netip.Addr {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.IPv4Unspecified()
	}
	return a
}

// Address returns the sandbox's own address.
func (n *Node) Address(sb store.Sandbox) string {
	nw, err := n.Net(sb.ID, sb.Slot)
	if err != nil {
		return ""
	}
	return nw.Sandbox.Addr().String()
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
	if err := n.begin(sb.ID, transitionDelete); err != nil {
		return err
	}
	n.cutEnvd(sb.ID)
	n.gw.Close(sb.ID)
	e := n.entry(sb.ID)
	// A transition holding the lock (a checkpoint, a wake) finishes first;
	// each of those is bounded by the backend's deadlines.
	bg, cancel := context.WithTimeout(context.Background(), deleteWait)
	defer cancel()
	if err := e.acquire(bg); err != nil {
		return fmt.Errorf("%w: sandbox %s: another transition held it for %v; the delete is recorded and finishes at the next start", errdefs.ErrConflict, sb.ID, deleteWait)
	}
	defer e.release()
	if _, err := n.st.GetSandbox(bg, sb.ID); errors.Is(err, errdefs.ErrNotFound) {
		return nil // a concurrent delete finished it
	}
	// Again under the lock: a transition that held it cleared the mark
	// when it committed.
	if err := n.begin(sb.ID, transitionDelete); err != nil {
		return err
	}
	if err := n.teardown(bg, sb, true); err != nil {
		return err
	}
	if err := n.st.DeleteSandbox(bg, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	n.forget(sb.ID)
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

// teardown removes the container, namespace, veth and rootfs mount of sb;
// with all, also its directory (volume and snapshot). Each step runs even
// if an earlier one failed; the errors are joined.
func (n *Node) teardown(ctx context.Context, sb store.Sandbox, all bool) error {
	var errs []error
	n.bounds.Down(sb.ID)
	if err := n.be.Remove(ctx, n.spec(sb)); err != nil {
		errs = append(errs, err)
	}
	if nw, err := n.Net(sb.ID, sb.Slot); err == nil {
		if err := netns.Delete(nw); err != nil {
			errs = append(errs, err)
		}
	}
	d := n.dir(sb.ID)
	if err := d.UnmountRootfs(); err != nil {
		errs = append(errs, err)
	}
	if all {
		if err := os.RemoveAll(string(d)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// List returns every sandbox on this node.
func (n *Node) List(ctx context.Context) ([]store.Sandbox, error) {
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if e, ok := n.lookup(all[i].ID); ok {
			if la := e.lastActive.Load(); la > all[i].LastActive.UnixMilli() {
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
		Reconciling: n.Reconciling(), WarmPool: n.pool.Sizes(), PromisedMiB: n.adm.Promised(), State: "ready", Transitions: n.transitionsTo()}, nil
}

// SetIdle gives sandbox id idle timers of its own (over the node's; nil:
// the node's again), kept with it across restarts.
func (n *Node) SetIdle(ctx context.Context, id string, idle *api.IdleTimers) error {
	own, err := n.cfg.Timers.With(idle)
	if err != nil {
		return errdefs.Mark(errdefs.ErrBadInput, err)
	}
	if _, err := n.st.UpdateSandbox(ctx, id, func(sb *store.Sandbox) error { sb.Idle = idle; return nil }); err != nil {
		return err
	}
	n.useIdle(id, idle, own)
	return nil
}

func (n *Node) useIdle(id string, idle *api.IdleTimers, own tier.Timers) {
	if e, ok := n.lookup(id); ok {
		if idle == nil {
			e.timers.Store(nil)
		} else {
			e.timers.Store(&own)
		}
	}
}

// LogPath is the file holding sandbox id's console output.
func (n *Node) LogPath(id string) string { return n.dir(id).Log() }

// Touch implements gateway.Waker.
func (n *Node) Touch(id string) {
	if e, ok := n.lookup(id); ok {
		e.lastActive.Store(time.Now().UnixMilli())
	}
}

// Unreachable implements gateway.Waker: if the sandbox's container is no
// longer running (its process exited), it is settled as detached with a note,
// so the next request cold-starts it instead of timing out again.
func (n *Node) Unreachable(id string) {
	e, ok := n.lookup(id)
	if !ok {
		return
	}
	select {
	case e.lock <- struct{}{}:
	default:
		return // a transition is running; it will settle the tier
	}
	defer e.release()
	if e.getTier() != api.TierHot {
		return
	}
	sb, err := n.st.GetSandbox(context.Background(), id)
	if err != nil {
		return
	}
	if st, err := n.be.State(context.Background(), n.spec(sb)); err == nil && st != sandbox.StateRunning && st != sandbox.StatePaused {
		n.log.Warn("sandbox process is gone; detaching it so the next request cold-starts it", "id", id, "state", st)
		n.settleAfterFailure(sb, api.TierHot, "its process exited (see its logs); the next request cold-starts it")
	}
}

// IsHot implements gateway.Waker.
//
// A sandbox in the middle of a transition is not hot, even while its
// stored tier still says so: a snapshot lets the gateway's held requests
// go once its checkpoint is done, before it records the new tier, and a
// request let through then must wake the sandbox, not dial a network
// namespace that is already gone.
func (n *Node) IsHot(id string) bool {
	e, ok := n.lookup(id)
	return ok && e.getTier() == api.TierHot && !e.busy()
}

// views returns the tier policy's view of every sandbox.
func (n *Node) views() []tier.View {
	n.mu.Lock()
	es := make([]*entry, 0, len(n.entries))
	for _, e := range n.entries {
		es = append(es, e)
	}
	n.mu.Unlock()
	out := make([]tier.View, 0, len(es))
	for _, e := range es {
		// Open but quiet connections do not keep a sandbox hot: freezing
		// keeps them, and their next byte thaws it (gateway.copy).
		// A call forwarded to envd (a command someone waits on) does,
		// and so does a mesh request its agent waits on (egress.go).
		// An HTTP request in flight through the gateway (a client waiting
		// on an answer being worked out) does too.
		busy := len(e.lock) > 0 || e.envd.Busy() || e.egressCalls.Load() > 0 || e.moving.Load() || n.gw.Busy(e.id)
		out = append(out, tier.View{
			ID: e.id, Tier: e.getTier(), Busy: busy, Timers: e.timers.Load(),
			LastActive: time.UnixMilli(e.lastActive.Load()),
			TierSince:  time.UnixMilli(e.tierSince.Load()),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Close stops the loops and the gateway. Sandboxes keep running: a
// restarted daemon adopts them.
func (n *Node) Close() {
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	n.done.Wait()
	n.finishing.Wait()
	// Pooled sandboxes are not state: a restarted node refills its pools.
	n.pool.Drain("")
	if n.hostLn != nil {
		n.hostLn.Close()
	}
	n.gw.CloseAll()
	if n.stamps != nil {
		defer n.stamps.Close()
	}
	n.bounds.Close()
	n.flushActivity()
}

// busy reports whether a transition (or a start-up repair) holds the
// sandbox's lock.
func (e *entry) busy() bool { return len(e.lock) > 0 }
