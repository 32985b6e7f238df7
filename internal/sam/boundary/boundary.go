// Package boundary is the egress boundary of one principal: flow 3 of the
// architecture map. A sandbox reaches the world only through its boundary,
// which knows who the sandbox *is* (its principal) and decides every flow
// for that principal on the destination's name, before anything is dialled.
//
// A boundary accepts flows as SOCKS5 (RFC 1928, CONNECT only; RFC 1929
// username/password when Config.Users is set) and HTTP CONNECT (RFC 9110
// §9.3.6) on a Unix socket and on the sandbox-facing address of its veth,
// where it also answers the sandbox's DNS (names it may reach get stable
// synthetic link-local addresses, others NXDOMAIN; nothing is forwarded
// upstream) and takes the sandbox's TCP connections to synthetic addresses,
// which the node redirects to it with nftables (the original destination is
// read with SO_ORIGINAL_DST and mapped back to the name).
//
// Destinations:
//   - mesh.sam.alt and <svc>.<mcp|inference>.sam.alt are not spliced: the
//     boundary terminates HTTP/1.1 itself and forwards only the agent-facing
//     paths to the local sam-node (Config.Mesh), always setting
//     X-Sam-Principal and stripping every identity or credential header the
//     agent sent;
//   - any other name (or an IP literal) is external: it passes only if the
//     principal's egress allowlist names it, is resolved by the boundary
//     (Config.Resolve), and is dialled only at an address the guard
//     (internal/sam/dialguard) allows — checked before the dial and again on the
//     socket itself — then spliced. A name is a claim the resolver makes;
//     the address is what a flow reaches.
//
// The listeners on the sandbox-facing address serve only their own sandbox:
// a connection (or DNS datagram) from any other source — another sandbox's
// flow spliced by some other boundary, a process on the host — is reset and
// counted, so no path lets one principal's traffic arrive at another's
// boundary. The Unix socket is for tools on the node and is guarded by its
// file mode.
//
// The sandbox's side of every flow is closed with RST (SO_LINGER 0), never
// with a FIN that could leave the sandbox's endpoint in TIME_WAIT: gVisor
// cannot checkpoint a sandbox holding one. Before a checkpoint the node calls
// CloseFlows.
//
// Many boundaries can live in one process: each costs its listeners and
// their accept loops, two small maps and a few counters; Metrics is shared.
package boundary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httputil"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"sandstorm/api"
	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/ingressroute"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/sam/refusals"
	"sandstorm/internal/sam/synthaddr"
	"sandstorm/internal/sam/tcpsock"
)

// Defaults of Config.
const (
	DefaultProxyPort        = 1080
	DefaultDNSPort          = 53
	DefaultTransparentPort  = 15001
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultDialTimeout      = 10 * time.Second
)

// ownMeshIdle is the idle connections kept by a boundary with a pool of
// its own (Config.MeshPool nil): one agent's concurrency.
const ownMeshIdle = 4

// DefaultSynthetic is the pool of synthetic addresses DNS answers from.
var DefaultSynthetic = netip.MustParsePrefix("169.254.64.0/18")

// Header names the boundary sets on requests to the mesh.
const (
	// HeaderPrincipal names who the sandbox is. The boundary always sets
	// it and never passes on one the agent sent.
	HeaderPrincipal = "X-Sam-Principal"
	// HeaderService names the mesh service a <svc>.<type>.sam.alt flow was
	// opened to ("inference://<svc>", "mcp://<svc>").
	HeaderService = "X-Sam-Service"
)

// Config configures one boundary.
type Config struct {
	// Principal is who the sandbox IS; every flow is decided for it.
	Principal string
	// Policy returns the policy in force; it may change between flows.
	// A nil func or a nil result is policy.Empty() (deny all).
	Policy func() *policy.Policy
	// Mesh dials the local sam-node's agent listener. nil: the mesh is
	// unreachable (allowed flows to mesh names fail as "unreachable").
	Mesh func(ctx context.Context) (net.Conn, error)
	// MeshPool, if set, is the connections to the node this boundary
	// shares with the other boundaries of its process (it then dials with
	// the pool's dialer, not Mesh); nil with Mesh set: a pool of its own,
	// of at most ownMeshIdle idle connections.
	MeshPool *MeshPool
	// SocketPath, if set, is a Unix socket accepting SOCKS5 and HTTP
	// CONNECT (the first byte decides: 0x05 is SOCKS5, else HTTP).
	SocketPath string
	// ListenAddr, if valid, is the sandbox-facing address (the host side
	// of the sandbox's veth): SOCKS5 and CONNECT on ProxyPort, DNS over
	// UDP and TCP on DNSPort, the transparent listener on TransparentPort.
	ListenAddr netip.Addr
	// Peer is the sandbox's own address: the only source the listeners on
	// ListenAddr accept. Required with ListenAddr.
	Peer netip.Addr
	// Ports on ListenAddr; 0 means the default (1080, 53, 15001).
	ProxyPort, DNSPort, TransparentPort int
	// Synthetic is the IPv4 pool DNS answers from; default 169.254.64.0/18.
	Synthetic netip.Prefix
	// Resolve resolves allowed external names before they are dialled;
	// default net.DefaultResolver. It is never called for a denied name.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Guard checks every address an allowed external name resolved to
	// before it is dialled; nil is a dialguard.Guard with no sandbox
	// subnets (loopback, link-local, private, the node's own addresses and
	// the rest are still refused).
	Guard dialguard.Checker
	// Egress are the sandbox's own egress rules (E2B's allowOut and
	// denyOut), applied after the policy and the guard: they only narrow
	// what those allow. nil: none. SetEgress replaces them.
	Egress *egress.Rules
	// Secrets, if set, are the sandbox's bound secrets (internal/sam/inject):
	// a TLS flow to one of their names is ended here and re-opened to the
	// real server, each request's markers replaced. nil: every flow is
	// spliced untouched.
	Secrets *inject.Set
	// Ingress, if set, carries flows to the names of its node's sandboxes
	// (<port>-<id>.<domain>) to the node's own ingress, neither resolved
	// nor guarded: that address is the node's (internal/sam/ingressroute).
	Ingress *ingressroute.Route
	// Dial opens allowed external destinations ("tcp", "ip:port") at an
	// address Guard allowed; default a net.Dialer whose Control hook asks
	// Guard again on the socket about to connect. It is never called for a
	// denied destination. (Tests replace it; the check before it stays.)
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Users, if non-empty, is required: SOCKS5 clients must authenticate
	// with RFC 1929 username/password, CONNECT clients with
	// Proxy-Authorization: Basic. Empty: no authentication.
	Users map[string]string
	// HandshakeTimeout bounds a SOCKS5 or CONNECT handshake; default 10 s.
	HandshakeTimeout time.Duration
	// DialTimeout bounds resolving and opening the upstream; default 10 s.
	DialTimeout time.Duration
	// Metrics is shared by all boundaries of a process; nil: none.
	Metrics *Metrics
	// Refusals, if set, counts every refusal by principal, target and
	// reason (shared by the boundaries of a process, like Metrics, and
	// reported to sam-node: internal/sam/refusals); nil: counted only in
	// Stats and Metrics.
	Refusals *refusals.Table
	// Activity, if set, is told of the sandbox's use of its way out
	// (activity.go); nil: nobody is (sam-box, which has no tiers).
	Activity Activity
	// Flows, if set, is handed every flow once it is decided (refused)
	// or done (allowed): the sandbox's egress log (internal/sam/egresslog).
	Flows func(api.EgressFlow)
	// Log; nil is slog.Default().
	Log *slog.Logger
	// Listen and ListenPacket, if set, open the boundary's listeners: each
	// may return one it already has (a socket handed over by the process
	// this one replaced, internal/handoff), else calls open. Nil: open.
	Listen       func(network, address string, open func() (net.Listener, error)) (net.Listener, error)
	ListenPacket func(network, address string, open func() (net.PacketConn, error)) (net.PacketConn, error)
}

// Boundary is the boundary of one principal.
type Boundary struct {
	cfg   Config
	log   *slog.Logger
	synth *synthaddr.Pool
	m     *Metrics
	pool  *MeshPool // connections to the node (nil: no mesh)
	own   bool      // pool is this boundary's own, closed with it
	proxy *httputil.ReverseProxy

	mu       sync.Mutex
	started  bool
	closed   bool
	flows    map[*flow]struct{}
	closers  []io.Closer
	loops    sync.WaitGroup
	sockPath string // the Unix socket we created, removed by Close

	// logRefusal limits the info-level refusal log lines (a sandbox can
	// open flows far faster than anyone can read them): the first few,
	// then one a second.
	logRefusal rate.Sometimes

	// egress is the sandbox's own rules in force (Config.Egress, then
	// SetEgress): read once per flow, at its admission.
	egress atomic.Pointer[egress.Rules]

	st counters
}

// New checks cfg and returns a boundary that is not listening yet.
func New(cfg Config) (*Boundary, error) {
	if err := validPrincipal(cfg.Principal); err != nil {
		return nil, err
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = DefaultProxyPort
	}
	if cfg.DNSPort == 0 {
		cfg.DNSPort = DefaultDNSPort
	}
	if cfg.TransparentPort == 0 {
		cfg.TransparentPort = DefaultTransparentPort
	}
	for _, p := range []int{cfg.ProxyPort, cfg.DNSPort, cfg.TransparentPort} {
		if p < 0 || p > 65535 {
			return nil, fmt.Errorf("boundary %s: port %d out of range", cfg.Principal, p)
		}
	}
	if !cfg.Synthetic.IsValid() {
		cfg.Synthetic = DefaultSynthetic
	}
	if !cfg.Synthetic.Addr().Is4() || cfg.Synthetic.Bits() < 8 || cfg.Synthetic.Bits() > 30 {
		return nil, fmt.Errorf("boundary %s: synthetic pool %s: want an IPv4 prefix from /8 to /30", cfg.Principal, cfg.Synthetic)
	}
	cfg.Synthetic = cfg.Synthetic.Masked()
	if cfg.ListenAddr.IsValid() {
		cfg.ListenAddr = cfg.ListenAddr.Unmap()
		if !cfg.Peer.IsValid() {
			// Fail closed: listeners that would serve any source are how one
			// sandbox's flows reached another's boundary.
			return nil, fmt.Errorf("boundary %s: a listen address needs the sandbox's own address (Peer), the only source it serves", cfg.Principal)
		}
		cfg.Peer = cfg.Peer.Unmap()
	}
	if cfg.Guard == nil {
		cfg.Guard = &dialguard.Guard{}
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Resolve == nil {
		cfg.Resolve = defaultResolve
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	b := &Boundary{
		cfg:        cfg,
		log:        log,
		synth:      synthaddr.New(cfg.Synthetic, cfg.ListenAddr),
		m:          cfg.Metrics,
		flows:      map[*flow]struct{}{},
		logRefusal: rate.Sometimes{First: 10, Interval: time.Second},
	}
	switch {
	case cfg.MeshPool != nil:
		b.pool = cfg.MeshPool
	case cfg.Mesh != nil:
		b.pool, b.own = NewMeshPool(cfg.Mesh, ownMeshIdle), true
	}
	if b.pool != nil {
		b.proxy = b.newMeshProxy(b.pool)
	}
	b.egress.Store(cfg.Egress)
	return b, nil
}

// SetEgress replaces the sandbox's egress rules (nil: none) for new flows;
// open ones go on, as E2B's updateNetwork leaves them (CloseFlows ends them).
func (b *Boundary) SetEgress(r *egress.Rules) { b.egress.Store(r) }

// validPrincipal: the principal travels in a header to the node, so it is
// at most 256 bytes, with no spaces or control characters.
func validPrincipal(p string) error {
	if p == "" {
		return errors.New("boundary: no principal")
	}
	if len(p) > 256 {
		return fmt.Errorf("boundary: principal of %d bytes (256 at most)", len(p))
	}
	for _, c := range []byte(p) {
		if c < 0x21 || c == 0x7f {
			return fmt.Errorf("boundary: principal %q has a space or control character", p)
		}
	}
	return nil
}

func defaultResolve(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// Principal returns who this boundary's sandbox is.
func (b *Boundary) Principal() string { return b.cfg.Principal }

// Start opens the listeners. Errors name the listener that failed; on an
// error nothing is left open.
func (b *Boundary) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.closed {
		return fmt.Errorf("boundary %s: already started or closed", b.cfg.Principal)
	}
	b.started = true
	fail := func(err error) error {
		for _, c := range b.closers {
			c.Close()
		}
		b.closers = nil
		if b.sockPath != "" {
			os.Remove(b.sockPath)
			b.sockPath = ""
		}
		return fmt.Errorf("boundary %s: %w", b.cfg.Principal, err)
	}
	type loop struct {
		ln    net.Listener
		serve func(net.Conn)
		peer  bool // only the sandbox's own address may connect
	}
	var loops []loop
	if b.cfg.SocketPath != "" {
		ln, err := b.listen("unix", b.cfg.SocketPath, func() (net.Listener, error) {
			if fi, err := os.Lstat(b.cfg.SocketPath); err == nil {
				if fi.Mode()&os.ModeSocket == 0 {
					return nil, fmt.Errorf("%s: a file that is not a socket is in the way", b.cfg.SocketPath)
				}
				if c, err := net.DialTimeout("unix", b.cfg.SocketPath, time.Second); err == nil {
					c.Close()
					return nil, fmt.Errorf("%s: another process is serving on it", b.cfg.SocketPath)
				}
				os.Remove(b.cfg.SocketPath) // stale socket of an earlier run
			}
			return net.ListenUnix("unix", &net.UnixAddr{Name: b.cfg.SocketPath, Net: "unix"})
		})
		if err != nil {
			return fail(fmt.Errorf("socket listener: %w", err))
		}
		b.sockPath = b.cfg.SocketPath
		b.closers = append(b.closers, ln)
		loops = append(loops, loop{ln, b.serveProxy, false})
	}
	var udp *net.UDPConn
	if a := b.cfg.ListenAddr; a.IsValid() {
		ln, err := b.listenTCP(netip.AddrPortFrom(a, uint16(b.cfg.ProxyPort)))
		if err != nil {
			return fail(fmt.Errorf("proxy listener: %w", err))
		}
		b.closers = append(b.closers, ln)
		loops = append(loops, loop{ln, b.serveProxy, true})

		udp, err = b.listenUDP(netip.AddrPortFrom(a, uint16(b.cfg.DNSPort)))
		if err != nil {
			return fail(fmt.Errorf("DNS listener (UDP): %w", err))
		}
		b.closers = append(b.closers, udp)
		dl, err := b.listenTCP(netip.AddrPortFrom(a, uint16(b.cfg.DNSPort)))
		if err != nil {
			return fail(fmt.Errorf("DNS listener (TCP): %w", err))
		}
		b.closers = append(b.closers, dl)
		loops = append(loops, loop{dl, b.serveDNSTCP, true})

		tl, err := b.listenTCP(netip.AddrPortFrom(a, uint16(b.cfg.TransparentPort)))
		if err != nil {
			return fail(fmt.Errorf("transparent listener: %w", err))
		}
		b.closers = append(b.closers, tl)
		loops = append(loops, loop{tl, b.serveTransparent, true})
	}
	for _, l := range loops {
		b.loops.Add(1)
		go b.acceptLoop(l.ln, l.serve, l.peer)
	}
	if udp != nil {
		b.loops.Add(1)
		go b.serveDNSUDP(udp)
	}
	b.log.Debug("boundary listening", "principal", b.cfg.Principal, "socket", b.cfg.SocketPath, "addr", b.cfg.ListenAddr)
	return nil
}

// listen opens a stream listener through cfg.Listen, if set.
func (b *Boundary) listen(network, address string, open func() (net.Listener, error)) (net.Listener, error) {
	if b.cfg.Listen == nil {
		return open()
	}
	return b.cfg.Listen(network, address, open)
}

func (b *Boundary) listenTCP(ap netip.AddrPort) (net.Listener, error) {
	return b.listen("tcp", ap.String(), func() (net.Listener, error) {
		return net.ListenTCP("tcp", net.TCPAddrFromAddrPort(ap))
	})
}

// listenUDP opens the DNS socket through cfg.ListenPacket, if set.
func (b *Boundary) listenUDP(ap netip.AddrPort) (*net.UDPConn, error) {
	open := func() (net.PacketConn, error) { return net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap)) }
	if b.cfg.ListenPacket == nil {
		pc, err := open()
		if err != nil {
			return nil, err
		}
		return pc.(*net.UDPConn), nil
	}
	pc, err := b.cfg.ListenPacket("udp", ap.String(), open)
	if err != nil {
		return nil, err
	}
	udp, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil, fmt.Errorf("%s: not a UDP socket (%T)", ap, pc)
	}
	return udp, nil
}

func (b *Boundary) acceptLoop(ln net.Listener, serve func(net.Conn), peerOnly bool) {
	defer b.loops.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: wait instead of spinning.
			b.log.Warn("boundary accept", "principal", b.cfg.Principal, "err", err)
			time.Sleep(backoff)
			if backoff < time.Second {
				backoff *= 2
			}
			continue
		}
		backoff = 5 * time.Millisecond
		if peerOnly && !b.fromPeer(c.RemoteAddr()) {
			b.foreign(c.RemoteAddr())
			tcpsock.ResetClose(c)
			continue
		}
		go serve(c)
	}
}

// fromPeer reports whether a connection or datagram came from this
// boundary's own sandbox.
func (b *Boundary) fromPeer(a net.Addr) bool {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		return false
	}
	return ap.Addr().Unmap() == b.cfg.Peer
}

// foreign counts (and logs, at debug) a connection or datagram on the
// sandbox-facing listeners from a source that is not the sandbox.
func (b *Boundary) foreign(from net.Addr) {
	b.st.foreign.Add(1)
	b.m.foreign()
	if b.cfg.Refusals != nil {
		src := from.String()
		if h, _, err := net.SplitHostPort(src); err == nil {
			src = h // by source address: its ports would make a row per connection
		}
		b.refused(api.RefusedForeign, src, "not this boundary's sandbox ("+b.cfg.Peer.String()+")")
	}
	b.log.Debug("boundary refused a source other than its sandbox", "principal", b.cfg.Principal, "remote", from, "peer", b.cfg.Peer)
}

// CloseFlows resets every open flow of this boundary (and every DNS-over-TCP
// connection) on the sandbox side with RST and closes the far side. It
// returns how many it closed. Listeners stay open.
func (b *Boundary) CloseFlows() int {
	b.mu.Lock()
	fs := make([]*flow, 0, len(b.flows))
	for f := range b.flows {
		fs = append(fs, f)
	}
	b.mu.Unlock()
	n := 0
	for _, f := range fs {
		if f.abort() {
			n++
		}
	}
	return n
}

// Close closes the listeners, resets every flow and removes the Unix socket.
func (b *Boundary) Close() error {
	closers, first := takeOnce(&b.mu, &b.closed, &b.closers)
	if !first {
		return nil
	}
	var errs []error
	for _, c := range closers {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	b.CloseFlows()
	b.loops.Wait()
	if b.own {
		b.pool.Close()
	}
	if b.sockPath != "" {
		if err := os.Remove(b.sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Lookup returns the name a synthetic address was answered for.
func (b *Boundary) Lookup(addr netip.Addr) (string, bool) { return b.synth.Lookup(addr) }

func (b *Boundary) policy() *policy.Policy {
	if b.cfg.Policy != nil {
		if p := b.cfg.Policy(); p != nil {
			return p
		}
	}
	return emptyPolicy
}

var emptyPolicy = policy.Empty()

// flow is one connection from the sandbox.
type flow struct {
	c       net.Conn // the sandbox's side
	counted bool     // a proxy or transparent flow (active gauge), not DNS

	mu      sync.Mutex
	aborted bool
	far     []io.Closer
}

// track registers c; nil if the boundary is closed (c is then reset).
func (b *Boundary) track(c net.Conn, counted bool) *flow {
	f := &flow{c: c, counted: counted}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		tcpsock.ResetClose(c)
		return nil
	}
	b.flows[f] = struct{}{}
	b.mu.Unlock()
	if counted {
		b.st.active.Add(1)
		b.m.activeAdd(1)
	}
	return f
}

func (b *Boundary) untrack(f *flow) {
	b.mu.Lock()
	delete(b.flows, f)
	b.mu.Unlock()
	if f.counted {
		b.st.active.Add(-1)
		b.m.activeAdd(-1)
	}
}

// addFar registers a connection on the far side, so that abort closes it.
// It returns false (and closes c) if the flow was aborted already.
func (f *flow) addFar(c io.Closer) bool {
	f.mu.Lock()
	if f.aborted {
		f.mu.Unlock()
		c.Close()
		return false
	}
	f.far = append(f.far, c)
	f.mu.Unlock()
	return true
}

// dropFar takes c off the far side of f, so that abort no longer closes
// it; false if the flow was aborted already (c is closed then).
func (f *flow) dropFar(c io.Closer) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.aborted {
		return false
	}
	if i := slices.Index(f.far, c); i >= 0 {
		f.far = slices.Delete(f.far, i, i+1)
	}
	return true
}

func (f *flow) isAborted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.aborted
}

// takeOnce marks *done under mu and hands over *closers, emptied: what
// the first of many concurrent closes has to close; later ones get false.
func takeOnce(mu *sync.Mutex, done *bool, closers *[]io.Closer) ([]io.Closer, bool) {
	mu.Lock()
	defer mu.Unlock()
	if *done {
		return nil, false
	}
	*done = true
	cs := *closers
	*closers = nil
	return cs, true
}

// abort resets the sandbox's side and closes the far side, at once. It
// reports whether this call did it.
func (f *flow) abort() bool {
	far, first := takeOnce(&f.mu, &f.aborted, &f.far)
	if !first {
		return false
	}
	tcpsock.ResetClose(f.c)
	for _, c := range far {
		c.Close()
	}
	return true
}

// end finishes a flow normally: it waits (bounded) until the sandbox has
// acknowledged every byte written to it, so the reset does not discard
// them, then resets.
func (f *flow) end() {
	if !f.isAborted() {
		tcpsock.WaitSent(f.c, 2*time.Second)
	}
	f.abort()
}

// counters are one boundary's statistics.
type counters struct {
	flows           [nRoutes][nOutcomes]atomic.Uint64
	refusals        atomic.Uint64
	handshakeErrors atomic.Uint64
	meshForwarded   atomic.Uint64
	meshRefused     atomic.Uint64
	meshErrors      atomic.Uint64
	stripped        atomic.Uint64
	dns             [nDNSAnswers]atomic.Uint64
	active          atomic.Int64
	admissions      atomic.Uint64
	admissionNanos  atomic.Int64
	addrRefusals    [dialguard.NumClasses]atomic.Uint64
	foreign         atomic.Uint64
}

// Stats are a boundary's counters since New.
type Stats struct {
	// Flows counts flows by "route/outcome" (e.g. "mesh/allowed",
	// "external/denied"); every combination is present.
	Flows map[string]uint64
	// Totals of Flows by outcome, over all routes.
	Allowed, Denied, Refused, Unreachable, Errors uint64
	// Refusals counts what the boundary turned away: flows policy denied,
	// transparent flows to unknown addresses, and mesh requests to paths
	// an agent may not use.
	Refusals uint64
	// HandshakeErrors counts connections that never named a destination
	// (garbage, timeouts, failed authentication, unsupported commands).
	HandshakeErrors uint64
	// Active is the number of flows open now.
	Active int64
	// MeshForwarded, MeshRefused and MeshErrors count HTTP requests on
	// mesh flows: forwarded to the node, refused (403/405), failed (502).
	MeshForwarded, MeshRefused, MeshErrors uint64
	// HeadersStripped counts mesh requests that carried identity or
	// credential headers, which were removed.
	HeadersStripped uint64
	// DNS answers: a synthetic address (or an empty answer for a granted
	// name), REFUSED (or FORMERR, NOTIMP, SERVFAIL), NXDOMAIN.
	DNSSynthetic, DNSRefused, DNSNXDomain uint64
	// Admissions and AdmissionTime: flows decided, and the total time spent
	// classifying, deciding and opening their upstream.
	Admissions    uint64
	AdmissionTime time.Duration
	// AddressRefusals counts addresses an allowed name resolved to that
	// the guard would not dial, by class ("loopback", "node", …); only
	// classes seen are present.
	AddressRefusals map[string]uint64
	// Foreign counts connections and DNS datagrams on the sandbox-facing
	// listeners from a source other than the sandbox, all refused.
	Foreign uint64
}

// Stats returns the boundary's counters.
func (b *Boundary) Stats() Stats {
	s := Stats{Flows: make(map[string]uint64, int(nRoutes)*int(nOutcomes))}
	for r := route(0); r < nRoutes; r++ {
		for o := outcome(0); o < nOutcomes; o++ {
			n := b.st.flows[r][o].Load()
			s.Flows[routeNames[r]+"/"+outcomeNames[o]] = n
			switch o {
			case outAllowed:
				s.Allowed += n
			case outDenied:
				s.Denied += n
			case outRefused:
				s.Refused += n
			case outUnreachable:
				s.Unreachable += n
			case outError:
				s.Errors += n
			}
		}
	}
	s.Refusals = b.st.refusals.Load()
	s.HandshakeErrors = b.st.handshakeErrors.Load()
	s.Active = b.st.active.Load()
	s.MeshForwarded = b.st.meshForwarded.Load()
	s.MeshRefused = b.st.meshRefused.Load()
	s.MeshErrors = b.st.meshErrors.Load()
	s.HeadersStripped = b.st.stripped.Load()
	s.DNSSynthetic = b.st.dns[dnsSynthetic].Load()
	s.DNSRefused = b.st.dns[dnsRefused].Load()
	s.DNSNXDomain = b.st.dns[dnsNXDomain].Load()
	s.Admissions = b.st.admissions.Load()
	s.AdmissionTime = time.Duration(b.st.admissionNanos.Load())
	s.AddressRefusals = map[string]uint64{}
	for c := range b.st.addrRefusals {
		if n := b.st.addrRefusals[c].Load(); n > 0 {
			s.AddressRefusals[dialguard.Class(c).String()] = n
		}
	}
	s.Foreign = b.st.foreign.Load()
	return s
}

func (b *Boundary) countFlow(r route, o outcome) {
	b.st.flows[r][o].Add(1)
	b.m.flow(r, o)
	if o == outDenied || (r == routeTransparentUnknown && o == outRefused) {
		b.refusal()
	}
}

func (b *Boundary) refusal() {
	b.st.refusals.Add(1)
	b.m.refusal()
}

// refused itemises a refusal for the console (Config.Refusals): what was
// asked for (api.Refused*), which one, and why.
func (b *Boundary) refused(what, target, reason string) {
	b.cfg.Refusals.Add(refusals.Refusal{Principal: b.cfg.Principal, By: api.RefusedByBoundary, What: what, Target: target, Reason: reason})
}

func (b *Boundary) handshakeError(c net.Conn, err error) {
	b.st.handshakeErrors.Add(1)
	b.m.handshakeError()
	b.log.Debug("boundary handshake failed", "principal", b.cfg.Principal, "remote", c.RemoteAddr(), "err", err)
}
