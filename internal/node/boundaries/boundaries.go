// Package boundaries is the boundaries of a Sandstorm node's sandboxes:
// each sandbox's only way out (internal/sam/boundary), one per sandbox, on
// the host end of its veth, deciding every flow for the sandbox's
// principal under the mesh's policy. All of a node's boundaries live in
// its process, so a sandbox costs its listeners and maps, not a process.
// A boundary is up exactly while its sandbox may run: started before its
// process, closed before a checkpoint (gVisor cannot save an established
// TCP endpoint) and when its network goes away.
package boundaries

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"sandstorm/internal/netns"
	"sandstorm/internal/sam/boundary"
	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/egresslog"
	"sandstorm/internal/sam/ingressroute"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/sam/refusals"
	"sandstorm/internal/secrets"
)

// SAM is how a node's sandboxes reach the world: each gets a boundary of
// its own deciding every flow for the sandbox's principal under Policy.
type SAM struct {
	// Policy returns the policy in force; nil (or nil result) denies all.
	Policy func() *policy.Policy
	// Mesh dials the local sam-node's agent listener; nil: no mesh.
	Mesh func(ctx context.Context) (net.Conn, error)
	// Metrics is shared by every boundary; nil: none.
	Metrics *boundary.Metrics
	// Refusals, if set, itemises every boundary's refusals (shared, like
	// Metrics), for the daemon to report to sam-node; nil: not itemised.
	Refusals *refusals.Table
	// Guard checks every address an allowed external name resolves to
	// before a boundary dials it; nil is a guard that knows no sandbox
	// subnet (still refusing loopback, link-local, private, the node's
	// own addresses and routes into sandbox veths).
	Guard *dialguard.Guard
	// Resolve resolves allowed external names; nil: the system resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Firewall has the ports and synthetic pool the boundaries use.
	Firewall netns.Firewall
	// Flows keeps each sandbox's egress log; nil: none is kept.
	Flows *egresslog.Logs
	// Secrets seals the bindings of sandboxes created with secrets (nil:
	// such a create is refused); SecretRoots verify the real servers
	// those secrets go to (nil: the system's roots).
	Secrets     *secrets.Box
	SecretRoots *x509.CertPool
	// Ingress carries a sandbox's flows to another sandbox's public URL
	// to this node's own listener for those names; nil: they go where
	// their names resolve (internal/sam/ingressroute).
	Ingress *ingressroute.Route
}

// Config is what every boundary of a node shares.
type Config struct {
	SAM SAM
	Log *slog.Logger
	// Listen and ListenPacket open the boundaries' listeners (the node's
	// handover hands them over); nil: net.Listen, net.ListenPacket.
	Listen       func(network, address string, open func() (net.Listener, error)) (net.Listener, error)
	ListenPacket func(network, address string, open func() (net.PacketConn, error)) (net.PacketConn, error)
	// Up and Down, if set, are told when a sandbox's boundary goes up
	// and down (the node times its console log's lines while it is up).
	Up, Down func(id string)
}

// Sandbox is one sandbox's side of its boundary.
type Sandbox struct {
	ID, Principal string
	// Net is its network: the boundary listens on the host end and
	// serves the sandbox's address only.
	Net netns.Net
	// Socket is the boundary's Unix socket on the host (its agent's).
	Socket string
	// Activity is told of the sandbox's flows out (its idle timers).
	Activity boundary.Activity
	// Egress is its own egress rules (nil: the policy alone).
	Egress *egress.Rules
	// Secrets are its bound secrets (nil: none).
	Secrets *inject.Set
}

// Set is a node's boundaries, by sandbox.
type Set struct {
	cfg Config
	// pool is the connections to sam-node every boundary shares (nil: no
	// mesh); a request on one carries its own boundary's principal.
	pool *boundary.MeshPool

	mu  sync.Mutex
	all map[string]*boundary.Boundary
}

// New is an empty set of boundaries.
func New(cfg Config) *Set {
	s := &Set{cfg: cfg, all: map[string]*boundary.Boundary{}}
	if cfg.SAM.Mesh != nil {
		s.pool = boundary.NewMeshPool(cfg.SAM.Mesh, 0)
	}
	return s
}

// Up starts sb's boundary on the host end of its veth (which must exist)
// and on its socket, replacing a running one.
func (s *Set) Up(sb Sandbox) error {
	s.Down(sb.ID)
	sam := s.cfg.SAM
	fw := sam.Firewall
	var guard dialguard.Checker // nil: the boundary's strict default
	if sam.Guard != nil {
		guard = sam.Guard
	}
	b, err := boundary.New(boundary.Config{
		Principal:       sb.Principal,
		Policy:          sam.Policy,
		Mesh:            sam.Mesh,
		MeshPool:        s.pool,
		SocketPath:      sb.Socket,
		ListenAddr:      sb.Net.Host.Addr(),
		Peer:            sb.Net.Sandbox.Addr(), // the listeners serve this sandbox only
		ProxyPort:       fw.ProxyPort,
		DNSPort:         fw.DNSPort,
		TransparentPort: fw.TransparentPort,
		Synthetic:       fw.Synthetic,
		Metrics:         sam.Metrics,
		Refusals:        sam.Refusals,
		Activity:        sb.Activity,
		Flows:           sam.Flows.Recorder(sb.ID),
		Egress:          sb.Egress,
		Secrets:         sb.Secrets,
		Ingress:         sam.Ingress,
		Resolve:         sam.Resolve,
		Guard:           guard,
		Log:             s.cfg.Log.With("sandbox", sb.ID), // its lines name the principal themselves
		Listen:          s.cfg.Listen,
		ListenPacket:    s.cfg.ListenPacket,
	})
	if err != nil {
		return fmt.Errorf("boundary of %s: %w", sb.ID, err)
	}
	if err := b.Start(); err != nil {
		b.Close()
		return fmt.Errorf("boundary of %s: %w", sb.ID, err)
	}
	s.mu.Lock()
	s.all[sb.ID] = b
	s.mu.Unlock()
	if s.cfg.Up != nil {
		s.cfg.Up(sb.ID)
	}
	return nil
}

// Down closes sandbox id's boundary: every flow reset, listeners closed.
func (s *Set) Down(id string) {
	s.mu.Lock()
	b := s.all[id]
	delete(s.all, id)
	s.mu.Unlock()
	if b != nil {
		b.Close()
	}
	if s.cfg.Down != nil {
		s.cfg.Down(id)
	}
}

// Has reports whether sandbox id's boundary is up.
func (s *Set) Has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all[id] != nil
}

// SetEgress replaces the egress rules of sandbox id's boundary, if it is
// up (one that is not takes them from the sandbox's row when it comes up).
func (s *Set) SetEgress(id string, r *egress.Rules) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.all[id]; b != nil {
		b.SetEgress(r)
	}
}

// CloseFlows resets every flow of every boundary, keeping their
// listeners (a handover: the next process serves them), and says how
// many it reset.
func (s *Set) CloseFlows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := 0
	for _, b := range s.all {
		k += b.CloseFlows()
	}
	return k
}

// Close closes every boundary and the connections to sam-node.
func (s *Set) Close() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.all))
	for id := range s.all {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.Down(id)
	}
	if s.pool != nil {
		s.pool.Close()
	}
}
