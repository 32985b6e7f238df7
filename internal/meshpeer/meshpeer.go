// Package meshpeer is a member's presence on the mesh's libp2p network
// (issue 17, item 3): a host whose key is the member's mesh key, joined
// to the routers (connected, credentials presented both ways, a relay
// slot reserved), a DHT client under the mesh's prefix bootstrapped from
// them, the names it serves published as providers, and the providers of
// a name found through a discovery.Cache — a lookup that ends with the
// walk, shared, cached.
//
// It is also how members call each other: HTTP over libp2p streams
// (go-libp2p's p2p/http), the mesh's handler of the member called
// (meshnode.MeshHandler) answering. Both ends are members, checked on
// every stream: the caller presents its credential to the member it
// calls and takes that member's in return (meshrouter.Present), each
// bound to the peer's own libp2p key, so the connection's handshake is
// the proof of possession; each request is then admitted only if the
// caller's credential verifies now (a revocation applies from the next
// keys fetch, internal/membership), and a call goes out only to a peer
// whose credential verifies now. Peer implements meshnode.Mesh.
//
// A member that no other can reach directly (behind NAT, or on a network
// of its own) is reached through a router's circuit relay (v2): every
// member reserves a slot with every router, and a call to a member tries
// its own addresses first and the routers' circuits after.
package meshpeer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	libp2phttp "github.com/libp2p/go-libp2p/p2p/http"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	ma "github.com/multiformats/go-multiaddr"

	"sandstorm/internal/discovery"
	"sandstorm/internal/meshnode"
	"sandstorm/internal/meshrouter"
)

// HTTPProtocol is the protocol ID of the mesh's HTTP, mounted at
// httpPrefix on every member's libp2p HTTP host.
const HTTPProtocol = "/sam/mesh/1.0.0"

const httpPrefix = "/sam"

const (
	// maintainInterval is how often a member checks that it is joined
	// to every router (and rejoins, reserves and republishes if not): a
	// router killed and restarted has the mesh back within about this.
	maintainInterval = 2 * time.Second
	// republishInterval renews provider records before kad-dht's
	// provider record lifetime (48 h) runs out, and well within it.
	republishInterval = 10 * time.Minute
	// renewReservation is how long before its expiry a relay slot is
	// reserved again (a reservation lasts an hour, relay v2's default).
	renewReservation = 15 * time.Minute
	// connectTimeout bounds a dial and credential exchange with a member.
	connectTimeout = 10 * time.Second
)

// Config is a peer's.
type Config struct {
	// Key is the member's mesh key (membership.Member.PrivateKey).
	Key ed25519.PrivateKey
	// Credential gives the member's current credential.
	Credential func() string
	// Verify checks another peer's credential (membership.Member.Verify).
	// Required: a member calls and answers members only.
	Verify meshrouter.Verify
	// Routers are the routers to join (their addresses with /p2p/ID).
	Routers []peer.AddrInfo
	// Listen is the host's own addresses. A provider record with no
	// address is dropped by the DHT (kad-dht keeps only providers it can
	// give an address for), so a member that publishes must listen.
	Listen []string
	// Names gives what this member serves, published as providers and
	// republished when it changes (nil: nothing).
	Names func() []string
	// Handler answers other members' HTTP calls (meshnode.MeshHandler);
	// nil: none. Every request carries meshnode.HeaderMember, the
	// caller's checked member name.
	Handler http.Handler
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Peer is a member on the mesh's network.
type Peer struct {
	Host host.Host
	DHT  *dht.IpfsDHT
	cfg  Config
	log  *slog.Logger
	find *discovery.Cache[peer.AddrInfo]
	gate *meshrouter.Gate
	web  *libp2phttp.Host

	mu        sync.Mutex
	presented map[peer.ID]bool // to whom this member presented, on their current connection
	rts       map[peer.ID]http.RoundTripper
	reserved  map[peer.ID]time.Time // router → its slot's expiry
	published []string
	pubAt     time.Time
}

// Join starts the host, joins every router (at least one must take it),
// and starts the DHT client bootstrapped from them. Run keeps it joined.
func Join(ctx context.Context, cfg Config) (*Peer, error) {
	if cfg.Verify == nil {
		return nil, errors.New("meshpeer: no Verify: a member must check whom it calls and who calls it")
	}
	key, err := meshrouter.Identity(cfg.Key)
	if err != nil {
		return nil, err
	}
	opts := []libp2p.Option{libp2p.Identity(key), libp2p.EnableRelay()}
	if len(cfg.Listen) > 0 {
		opts = append(opts, libp2p.ListenAddrStrings(cfg.Listen...))
	} else {
		opts = append(opts, libp2p.NoListenAddrs)
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		return nil, err
	}
	p := &Peer{Host: h, cfg: cfg, log: cfg.Logger, gate: meshrouter.NewGate(cfg.Verify),
		presented: map[peer.ID]bool{}, rts: map[peer.ID]http.RoundTripper{}, reserved: map[peer.ID]time.Time{}}
	if p.log == nil {
		p.log = slog.Default()
	}
	// Other members present their credentials to this one before they
	// call it, and get its own back.
	p.gate.Serve(h, cfg.Credential)
	h.Network().Notify(&network.NotifyBundle{DisconnectedF: func(n network.Network, c network.Conn) {
		if n.Connectedness(c.RemotePeer()) != network.Connected {
			p.mu.Lock()
			delete(p.presented, c.RemotePeer())
			p.mu.Unlock()
		}
	}})

	var joined []peer.AddrInfo
	var errs []error
	for _, r := range cfg.Routers {
		if err := p.joinRouter(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("router %s: %w", r.ID, err))
			continue
		}
		joined = append(joined, r)
	}
	if len(joined) == 0 {
		h.Close()
		return nil, fmt.Errorf("no router took this member: %w", errors.Join(errs...))
	}
	d, err := dht.New(h, dht.Mode(dht.ModeClient), dht.ProtocolPrefix(discovery.ProtocolPrefix), dht.BootstrapPeers(joined...))
	if err != nil {
		h.Close()
		return nil, err
	}
	// The routers are the DHT's first peers: put them in its routing
	// table now rather than wait for identify to tell it they serve the
	// mesh's DHT protocol.
	for _, r := range joined {
		d.RoutingTable().TryAddPeer(r.ID, true, false)
	}
	if err := <-d.RefreshRoutingTable(); err != nil {
		d.Close()
		h.Close()
		return nil, fmt.Errorf("the mesh's DHT: %w", err)
	}
	p.DHT = d
	p.find = discovery.New(discovery.Providers(d), discovery.Config{})

	p.web = &libp2phttp.Host{StreamHost: h}
	if cfg.Handler != nil {
		p.web.SetHTTPHandlerAtPath(HTTPProtocol, httpPrefix+"/", http.HandlerFunc(p.serveHTTP))
	}
	go p.web.Serve()
	return p, nil
}

// joinRouter connects to r, presents this member's credential and checks
// the router's, and reserves a relay slot, within connectTimeout.
func (p *Peer) joinRouter(ctx context.Context, r peer.AddrInfo) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := p.Host.Connect(ctx, r); err != nil {
		return err
	}
	if err := p.present(ctx, r.ID); err != nil {
		return err
	}
	res, err := client.Reserve(ctx, p.Host, r)
	if err != nil {
		return fmt.Errorf("reserving a relay slot: %w", err)
	}
	p.mu.Lock()
	p.reserved[r.ID] = res.Expiration
	p.mu.Unlock()
	return nil
}

// present exchanges credentials with a peer on the current connection:
// this member's given, the peer's checked and kept by the gate.
func (p *Peer) present(ctx context.Context, id peer.ID) error {
	theirs, err := meshrouter.Present(ctx, p.Host, id, p.cfg.Credential())
	if err != nil {
		return err
	}
	if err := p.gate.Accept(id, theirs); err != nil {
		return fmt.Errorf("%s is not a member: %w", id, err)
	}
	p.mu.Lock()
	p.presented[id] = true
	p.mu.Unlock()
	return nil
}

// Run keeps the member joined until ctx ends: every maintainInterval it
// rejoins a router it is no longer connected to, renews its relay slots,
// and publishes its names again when a router came back (whose provider
// records were lost with it), when they changed, or every
// republishInterval.
func (p *Peer) Run(ctx context.Context) {
	t := time.NewTicker(maintainInterval)
	defer t.Stop()
	for {
		p.maintain(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Peer) maintain(ctx context.Context) {
	rejoined := false
	for _, r := range p.cfg.Routers {
		p.mu.Lock()
		exp, ok := p.reserved[r.ID]
		p.mu.Unlock()
		connected := p.Host.Network().Connectedness(r.ID) == network.Connected
		if connected && ok && time.Until(exp) > renewReservation && p.gate.Admitted(r.ID) {
			continue
		}
		if err := p.joinRouter(ctx, r); err != nil {
			if ctx.Err() == nil {
				p.log.Warn("meshpeer: cannot join a router; retrying", "router", r.ID.String(), "err", err)
			}
			continue
		}
		if !connected {
			p.DHT.RoutingTable().TryAddPeer(r.ID, true, false)
			p.log.Info("meshpeer: joined the router again", "router", r.ID.String())
			rejoined = true
		}
	}
	if p.cfg.Names == nil {
		return
	}
	names := p.cfg.Names()
	slices.Sort(names)
	p.mu.Lock()
	due := rejoined || !slices.Equal(names, p.published) || time.Since(p.pubAt) > republishInterval
	p.mu.Unlock()
	if !due || len(names) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := p.Publish(pctx, names...); err != nil {
		p.log.Warn("meshpeer: publishing failed; retrying", "err", err)
		return
	}
	p.mu.Lock()
	p.published, p.pubAt = names, time.Now()
	p.mu.Unlock()
}

// Publish announces this member as a provider of each name (a model, an
// MCP server), to the DHT's closest peers.
func (p *Peer) Publish(ctx context.Context, names ...string) error {
	for _, n := range names {
		if err := p.DHT.Provide(ctx, discovery.Key(n), true); err != nil {
			return fmt.Errorf("publish %s: %w", n, err)
		}
	}
	return nil
}

// Find finds the members that provide name (cached, shared; see
// internal/discovery), this one among them if it does.
func (p *Peer) Find(ctx context.Context, name string) ([]peer.AddrInfo, error) {
	return p.find.Get(ctx, name)
}

// Providers implements meshnode.Mesh: the other members that provide
// name, by peer ID; their addresses go to the peerstore for the call.
func (p *Peer) Providers(ctx context.Context, name string) ([]string, error) {
	found, err := p.Find(ctx, name)
	var out []string
	for _, ai := range found {
		if ai.ID == p.Host.ID() {
			continue
		}
		p.Host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
		out = append(out, ai.ID.String())
	}
	return out, err
}

// Do implements meshnode.Mesh: req to member's mesh handler over a
// libp2p stream, once both are known members on the current connection.
func (p *Peer) Do(member string, req *http.Request) (*http.Response, error) {
	id, err := peer.Decode(member)
	if err != nil {
		return nil, fmt.Errorf("meshpeer: %q is not a peer ID: %w", member, err)
	}
	ctx := req.Context()
	if err := p.connect(ctx, id); err != nil {
		return nil, fmt.Errorf("%w: %w", meshnode.ErrNotSent, err)
	}
	rt, err := p.roundTripper(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", meshnode.ErrNotSent, err)
	}
	req = req.Clone(ctx)
	req.URL.Path = httpPrefix + req.URL.Path
	req.URL.RawPath = ""
	return rt.RoundTrip(req)
}

// connect makes sure there is a connection to id — its own addresses
// first, then a circuit through each router — and that both sides have
// presented credentials on it; and that id is a member now.
func (p *Peer) connect(ctx context.Context, id peer.ID) error {
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if p.Host.Network().Connectedness(id) != network.Connected {
		for _, r := range p.cfg.Routers {
			circuit := ma.StringCast("/p2p/" + r.ID.String() + "/p2p-circuit")
			for _, a := range r.Addrs {
				p.Host.Peerstore().AddAddr(id, a.Encapsulate(circuit), peerstore.TempAddrTTL)
			}
		}
		if err := p.Host.Connect(cctx, peer.AddrInfo{ID: id}); err != nil {
			return fmt.Errorf("meshpeer: cannot reach member %s: %w", id, err)
		}
	}
	p.mu.Lock()
	done := p.presented[id]
	p.mu.Unlock()
	if !done {
		if err := p.present(cctx, id); err != nil {
			return fmt.Errorf("meshpeer: %w", err)
		}
	}
	if !p.gate.Admitted(id) {
		return fmt.Errorf("meshpeer: %s is no longer a member (its credential does not verify now)", id)
	}
	return nil
}

func (p *Peer) roundTripper(id peer.ID) (http.RoundTripper, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rt := p.rts[id]; rt != nil {
		return rt, nil
	}
	rt, err := p.web.NewConstrainedRoundTripper(peer.AddrInfo{ID: id})
	if err != nil {
		return nil, err
	}
	p.rts[id] = rt
	return rt, nil
}

// serveHTTP admits a call from a member whose credential verifies now,
// naming it to the handler in meshnode.HeaderMember.
func (p *Peer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	from := libp2phttp.ClientPeerID(r)
	name, ok := p.gate.Member(from)
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"error":{"message":"not a member: present a credential on %s first","type":"permission_error","code":"not_a_member"}}`+"\n", meshrouter.CredentialProtocol)
		return
	}
	r.Header.Set(meshnode.HeaderMember, name)
	p.cfg.Handler.ServeHTTP(w, r)
}

// Close leaves the mesh.
func (p *Peer) Close() error {
	p.web.Close()
	return errors.Join(p.DHT.Close(), p.Host.Close())
}
