// Package meshpeer is a member's presence on the mesh's libp2p network
// (issue 17, item 3; issue 29): a host whose key is the member's mesh
// key, joined to every router it is given (connected, credentials
// presented both ways, a relay slot reserved), the names it serves
// published on each router's DHT, and the providers of a name found by
// asking the routers, through a discovery.Cache — a lookup that ends
// when the routers have answered, shared, cached.
//
// It is also how members call each other: HTTP over libp2p streams
// (go-libp2p's p2p/http protocol), the mesh's handler of the member
// called (meshnode.MeshHandler) answering. Both ends are members,
// checked on every stream: the caller presents its credential to the
// member it calls and takes that member's in return (meshrouter.Present),
// each bound to the peer's own libp2p key, so the connection's handshake
// is the proof of possession; each request is then admitted only if the
// caller's credential verifies now (a revocation applies from the next
// keys fetch, internal/sam/membership), and a call goes out only to a peer
// whose credential verifies now. Peer implements meshnode.Mesh.
//
// A member that no other can reach directly (behind NAT, or on a network
// of its own) is reached through a router's circuit relay (v2): every
// member reserves a slot with every router, and a call to a member tries
// its own addresses first and the routers' circuits after.
//
// The mesh heals itself (issue 29; routers.go): each router has a loop of
// its own in every member, woken at once when the router's connection
// drops, that joins it again (every retryMax at most while it is away),
// publishes the member's names there whenever the router may have lost
// them — a new epoch (it restarted), a record it no longer has, a change
// of names — and pings it, closing a connection that stops answering
// (a partition leaves TCP silent, not closed). Nothing waits for a tick
// to notice a restart, so where a restart falls against the loop's
// timers does not matter.
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

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	pb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2phttp "github.com/libp2p/go-libp2p/p2p/http"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"

	"sandstorm/api"
	"sandstorm/internal/sam/discovery"
	"sandstorm/internal/sam/meshrouter"
)

// HTTPProtocol is the protocol ID of the mesh's HTTP, mounted at
// httpPrefix on every member's libp2p HTTP host.
const HTTPProtocol = "/sam/mesh/1.0.0"

const httpPrefix = "/sam"

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
	// The member joins, publishes to and holds a relay slot on each; a
	// name is found through any that answers.
	Routers []peer.AddrInfo
	// Listen is the host's own addresses. A provider record with no
	// address is dropped by the DHT (kad-dht keeps only providers it can
	// give an address for), so a member that publishes must listen.
	Listen []string
	// Names gives what this member serves, published as providers and
	// published again when it changes (nil: nothing).
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
	// DHT is the member's DHT client (mode client, the mesh's prefix):
	// its message sender carries the member's provider records to the
	// routers and its lookups.
	DHT  *dht.IpfsDHT
	cfg  Config
	log  *slog.Logger
	find *discovery.Cache[peer.AddrInfo]
	gate *meshrouter.Gate
	web  *libp2phttp.Host
	msgr *pb.ProtocolMessenger
	// routers are Config.Routers, each with its loop's state.
	routers []*router

	mu sync.Mutex
	// presented is the credential this member last presented to each
	// peer on their current connection. A member presents again when it
	// holds a newer one (it renewed: the one the peer holds expires) or
	// the peer's has stopped verifying here (the peer renewed too): a
	// connection outlives any one credential.
	presented map[peer.ID]string
	// joined is closed (and made anew) whenever a router is joined: a
	// dial to a member waiting out an address that will never answer
	// tries again at once through the router that came back.
	joined chan struct{}
}

// ErrNoRouter is a lookup's error when no router is joined.
var ErrNoRouter = errors.New("meshpeer: joined to no router right now")

// Join starts the host, joins every router (at least one must take it:
// the others are joined by Run as they come), and starts the DHT client.
// Run keeps it joined.
func Join(ctx context.Context, cfg Config) (*Peer, error) {
	if cfg.Verify == nil {
		return nil, errors.New("meshpeer: no Verify: a member must check whom it calls and who calls it")
	}
	if len(cfg.Routers) == 0 {
		return nil, errors.New("meshpeer: no router to join")
	}
	key, err := meshrouter.Identity(cfg.Key)
	if err != nil {
		return nil, err
	}
	gater := newRelayOnly(cfg.Routers)
	rm, err := resources(cfg.Routers)
	if err != nil {
		return nil, err
	}
	opts := []libp2p.Option{libp2p.Identity(key), libp2p.EnableRelay(), libp2p.ConnectionGater(gater), libp2p.ResourceManager(rm)}
	if len(cfg.Listen) > 0 {
		opts = append(opts, libp2p.ListenAddrStrings(cfg.Listen...))
	} else {
		opts = append(opts, libp2p.NoListenAddrs)
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		return nil, err
	}
	p := &Peer{Host: h, cfg: cfg, log: cfg.Logger, gate: meshrouter.NewGate(cfg.Verify), presented: map[peer.ID]string{}, joined: make(chan struct{})}
	if p.log == nil {
		p.log = slog.Default()
	}
	for _, ai := range cfg.Routers {
		p.routers = append(p.routers, newRouter(ai))
	}
	// Other members present their credentials to this one before they
	// call it, and get its own back.
	p.gate.Serve(h, cfg.Credential)
	h.Network().Notify(&network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) { gater.connected(c) }, DisconnectedF: func(n network.Network, c network.Conn) {
		id := c.RemotePeer()
		if n.Connectedness(id) == network.Connected {
			return
		}
		p.mu.Lock()
		delete(p.presented, id)
		p.mu.Unlock()
		if r := p.router(id); r != nil {
			r.lost()
		}
	}})

	// The DHT client only sends messages (the routers are the DHT's
	// servers and are asked directly: routers.go, find.go); its own
	// routing-table refreshes would only walk the same routers.
	d, err := dht.New(h, dht.Mode(dht.ModeClient), dht.ProtocolPrefix(discovery.ProtocolPrefix), dht.DisableAutoRefresh())
	if err != nil {
		h.Close()
		return nil, err
	}
	p.DHT = d
	if p.msgr, err = pb.NewProtocolMessenger(d.MessageSender()); err != nil {
		d.Close()
		h.Close()
		return nil, err
	}
	p.find = discovery.New(p.lookup, discovery.Config{})

	if err := p.joinFirst(ctx); err != nil {
		d.Close()
		h.Close()
		return nil, err
	}
	p.web = &libp2phttp.Host{StreamHost: h}
	if cfg.Handler != nil {
		p.web.SetHTTPHandlerAtPath(HTTPProtocol, httpPrefix+"/", http.HandlerFunc(p.serveHTTP))
	}
	go p.web.Serve()
	return p, nil
}

// joinFirst tries every router at once; one that takes the member is
// enough for Join, and Run joins the rest.
func (p *Peer) joinFirst(ctx context.Context) error {
	errs := make([]error, len(p.routers))
	var wg sync.WaitGroup
	for i, r := range p.routers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.joinRouter(ctx, r); err != nil {
				r.failed(err)
				errs[i] = fmt.Errorf("router %s: %w", r.info.ID, err)
			}
		}()
	}
	wg.Wait()
	if slices.ContainsFunc(p.routers, func(r *router) bool { return r.snapshot().Joined }) {
		return nil
	}
	return fmt.Errorf("no router took this member: %w", errors.Join(errs...))
}

// routerJoined tells every dial waiting on joinedSignal that a router
// was joined.
func (p *Peer) routerJoined() {
	p.mu.Lock()
	close(p.joined)
	p.joined = make(chan struct{})
	p.mu.Unlock()
}

// joinedSignal is closed at the next router joined.
func (p *Peer) joinedSignal() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.joined
}

// router is the state of the router with this ID, or nil.
func (p *Peer) router(id peer.ID) *router {
	for _, r := range p.routers {
		if r.info.ID == id {
			return r
		}
	}
	return nil
}

// present exchanges credentials with a peer on the current connection:
// this member's given, the peer's checked and kept by the gate.
func (p *Peer) present(ctx context.Context, id peer.ID) (meshrouter.Answer, error) {
	mine := p.cfg.Credential()
	ans, err := meshrouter.Present(ctx, p.Host, id, mine)
	if err != nil {
		return ans, err
	}
	if err := p.gate.Accept(id, ans.Credential); err != nil {
		return ans, fmt.Errorf("%s is not a member: %w", id, err)
	}
	p.mu.Lock()
	p.presented[id] = mine
	p.mu.Unlock()
	return ans, nil
}

// current reports whether this member and id hold each other's current
// credentials: this member's newest given on this connection, id's
// verifying here now.
func (p *Peer) current(id peer.ID) bool {
	p.mu.Lock()
	given := p.presented[id]
	p.mu.Unlock()
	return given != "" && given == p.cfg.Credential() && p.gate.Admitted(id)
}

// clearBackoff forgets the swarm's dial backoff for id. libp2p backs off
// an address that failed for 5 s, then longer with every failure (up to
// 5 min): after a router's restart, the circuits through it and the
// router itself would stay refused for that long although they work
// again. Our own loops bound how often they dial (retryMax, a call's
// deadline), so the swarm's backoff only delays healing.
func (p *Peer) clearBackoff(id peer.ID) {
	if s, ok := p.Host.Network().(*swarm.Swarm); ok {
		s.Backoff().Clear(id)
	}
}

// Status is the member's view of its routers (api.MemberStatus's
// Routers and Names; the caller adds who it is and its control plane).
func (p *Peer) Status() api.MemberStatus {
	st := api.MemberStatus{Peer: p.Host.ID().String(), Names: p.names()}
	for _, r := range p.routers {
		st.Routers = append(st.Routers, r.status())
	}
	return st
}

// names is what this member serves now, sorted.
func (p *Peer) names() []string {
	if p.cfg.Names == nil {
		return nil
	}
	names := slices.Clone(p.cfg.Names())
	slices.Sort(names)
	return slices.Compact(names)
}

// Close leaves the mesh.
func (p *Peer) Close() error {
	p.web.Close()
	return errors.Join(p.DHT.Close(), p.Host.Close())
}

// Kick asks every router's loop to look at its router now (sam-node
// calls it when what it serves changes).
func (p *Peer) Kick() {
	for _, r := range p.routers {
		r.wake()
	}
}
