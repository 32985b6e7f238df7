package boundary

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"time"

	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/sam/refusals"
)

// A Set is many boundaries served by one process (sam-box --config, and
// its one boundary from flags): each its own principal, listeners and
// socket; the policy files they name watched once each and shared; all
// started together or none (issue 15: the assembly lived in sam-box's
// main).

// SetSpec is one boundary of a Set, as sam-box's --config file says it.
type SetSpec struct {
	Principal       string            `json:"principal"`
	Socket          string            `json:"socket,omitempty"`
	Listen          string            `json:"listen,omitempty"`
	Peer            string            `json:"peer,omitempty"`
	ProxyPort       int               `json:"proxy_port,omitempty"`
	DNSPort         int               `json:"dns_port,omitempty"`
	TransparentPort int               `json:"transparent_port,omitempty"`
	Policy          string            `json:"policy,omitempty"`
	Users           map[string]string `json:"users,omitempty"`
}

// SetConfig is what the boundaries of a Set share.
type SetConfig struct {
	Boundaries []SetSpec
	// Policy is the policy file of a boundary that names none ("": such a
	// boundary grants nothing); PolicyInterval how often files are looked
	// at for changes.
	Policy         string
	PolicyInterval time.Duration
	Mesh           func(ctx context.Context) (net.Conn, error)
	Guard          *dialguard.Guard
	Resolve        func(ctx context.Context, host string) ([]netip.Addr, error)
	// The ports of a boundary that gives none.
	ProxyPort, DNSPort, TransparentPort int
	Synthetic                           netip.Prefix
	// SocketMode is the file mode of every Unix socket.
	SocketMode       os.FileMode
	HandshakeTimeout time.Duration
	DialTimeout      time.Duration
	Metrics          *Metrics
	// Refusals, if set, itemises every boundary's refusals (Config).
	Refusals *refusals.Table
	Log      *slog.Logger
}

// Set is the running boundaries of a SetConfig.
type Set struct {
	boxes    []*Boundary
	pool     *MeshPool // the node's connections, shared by every boundary
	watchers map[string]*policy.Watcher
	log      *slog.Logger
}

// StartSet checks every boundary of cfg and starts them; on any failure
// it closes those it had started and says which boundary failed.
func StartSet(cfg SetConfig) (*Set, error) {
	s := &Set{watchers: map[string]*policy.Watcher{}, log: cfg.Log}
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.Mesh != nil {
		s.pool = NewMeshPool(cfg.Mesh, 0)
	}
	seen := map[string]bool{}
	for i, spec := range cfg.Boundaries {
		b, err := s.start(cfg, i, spec, seen)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.boxes = append(s.boxes, b)
	}
	return s, nil
}

func (s *Set) start(cfg SetConfig, i int, bc SetSpec, seen map[string]bool) (*Boundary, error) {
	if bc.Principal == "" {
		return nil, fmt.Errorf("boundary %d: no principal", i+1)
	}
	if bc.Socket == "" && bc.Listen == "" {
		return nil, fmt.Errorf("boundary %s: give a socket and/or a listen address", bc.Principal)
	}
	for _, k := range []string{"socket:" + bc.Socket, "listen:" + bc.Listen} {
		if k != "socket:" && k != "listen:" && seen[k] {
			return nil, fmt.Errorf("boundary %s: %s used twice", bc.Principal, k)
		}
		seen[k] = true
	}
	var listen, peer netip.Addr
	var err error
	if bc.Listen != "" {
		if listen, err = netip.ParseAddr(bc.Listen); err != nil {
			return nil, fmt.Errorf("boundary %s: listen: %w", bc.Principal, err)
		}
		if bc.Peer == "" {
			return nil, fmt.Errorf("boundary %s: a listen address needs the sandbox's own address (--peer, or peer: in --config), the only source it will serve", bc.Principal)
		}
	}
	if bc.Peer != "" {
		if peer, err = netip.ParseAddr(bc.Peer); err != nil {
			return nil, fmt.Errorf("boundary %s: peer: %w", bc.Principal, err)
		}
	}
	pf := cfg.Policy
	if bc.Policy != "" {
		pf = bc.Policy
	}
	pol, err := s.policy(pf, cfg.PolicyInterval)
	if err != nil {
		return nil, err
	}
	if pol == nil {
		s.log.Warn("sam-box: no policy: this boundary grants nothing", "principal", bc.Principal)
	}
	b, err := New(Config{
		Principal:        bc.Principal,
		Policy:           pol,
		Mesh:             cfg.Mesh,
		MeshPool:         s.pool,
		SocketPath:       bc.Socket,
		ListenAddr:       listen,
		Peer:             peer,
		Guard:            cfg.Guard,
		Resolve:          cfg.Resolve,
		ProxyPort:        orDefault(bc.ProxyPort, cfg.ProxyPort),
		DNSPort:          orDefault(bc.DNSPort, cfg.DNSPort),
		TransparentPort:  orDefault(bc.TransparentPort, cfg.TransparentPort),
		Synthetic:        cfg.Synthetic,
		Users:            bc.Users,
		HandshakeTimeout: cfg.HandshakeTimeout,
		DialTimeout:      cfg.DialTimeout,
		Metrics:          cfg.Metrics,
		Refusals:         cfg.Refusals,
		Log:              s.log,
	})
	if err == nil {
		err = b.Start()
	}
	if err != nil {
		return nil, err
	}
	if bc.Socket != "" && cfg.SocketMode != 0 {
		if err := os.Chmod(bc.Socket, cfg.SocketMode); err != nil {
			b.Close()
			return nil, fmt.Errorf("boundary %s: %w", bc.Principal, err)
		}
	}
	return b, nil
}

// policy is path's policy, its file watched once for every boundary that
// names it (nil for "": a boundary with none grants nothing).
func (s *Set) policy(path string, every time.Duration) (func() *policy.Policy, error) {
	if path == "" {
		return nil, nil
	}
	if w := s.watchers[path]; w != nil {
		return w.Current, nil
	}
	w, err := policy.NewWatcher(path, s.log)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	w.Start(every)
	s.watchers[path] = w
	return w.Current, nil
}

// Len is how many boundaries run.
func (s *Set) Len() int { return len(s.boxes) }

// Principals are the boundaries' principals, sorted.
func (s *Set) Principals() []string {
	out := make([]string, 0, len(s.boxes))
	for _, b := range s.boxes {
		out = append(out, b.Principal())
	}
	sort.Strings(out)
	return out
}

// CloseFlows resets every flow of every boundary and says how many.
func (s *Set) CloseFlows() int {
	n := 0
	for _, b := range s.boxes {
		n += b.CloseFlows()
	}
	return n
}

// Close closes every boundary and stops watching the policy files.
func (s *Set) Close() {
	for _, b := range s.boxes {
		if err := b.Close(); err != nil {
			s.log.Warn("sam-box: closing a boundary", "principal", b.Principal(), "err", err)
		}
	}
	s.boxes = nil
	for _, w := range s.watchers {
		w.Stop()
	}
	s.watchers = map[string]*policy.Watcher{}
	if s.pool != nil {
		s.pool.Close()
	}
}

// Resolver is a Config.Resolve that asks the DNS server at addr
// (IP:port) instead of the system's resolver (sam-box and sandstormd
// --resolver).
func Resolver(addr string) (func(ctx context.Context, host string) ([]netip.Addr, error), error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--resolver %q: want an IP address and port, e.g. 127.0.0.53:53", addr)
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, ap.String())
	}}
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		return r.LookupNetIP(ctx, "ip", host)
	}, nil
}

func orDefault(v, def int) int {
	if v != 0 {
		return v
	}
	return def
}
