// Package meshpeer is a member's presence on the mesh's libp2p network
// (issue 17, item 3): a host whose key is the member's mesh key, joined
// to the routers (connected, its credential presented), a DHT client
// under the mesh's prefix bootstrapped from them, the names it serves
// published as providers, and the providers of a name found through a
// discovery.Cache — a lookup that ends with the walk, shared, cached.
//
// Not here yet: calling a provider found this way (HTTP over libp2p
// streams, the policy checked on both sides).
package meshpeer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"sandstorm/internal/discovery"
	"sandstorm/internal/meshrouter"
)

// Config is a peer's.
type Config struct {
	// Key is the member's mesh key (membership.Member.PrivateKey).
	Key ed25519.PrivateKey
	// Credential gives the member's current credential.
	Credential func() string
	// Routers are the routers to join (their addresses with /p2p/ID).
	Routers []peer.AddrInfo
	// Listen is the host's own addresses. A provider record with no
	// address is dropped by the DHT (kad-dht keeps only providers it can
	// give an address for), so a member that publishes must listen.
	Listen []string
}

// Peer is a member on the mesh's network.
type Peer struct {
	Host host.Host
	DHT  *dht.IpfsDHT
	cfg  Config
	find *discovery.Cache[peer.AddrInfo]
}

// Join starts the host, joins every router (at least one must take it),
// and starts the DHT client bootstrapped from them.
func Join(ctx context.Context, cfg Config) (*Peer, error) {
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
	var joined []peer.AddrInfo
	var errs []error
	for _, r := range cfg.Routers {
		if err := joinRouter(ctx, h, r, cfg.Credential()); err != nil {
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
	p := &Peer{Host: h, DHT: d, cfg: cfg}
	p.find = discovery.New(discovery.Providers(d), discovery.Config{})
	return p, nil
}

// joinRouter connects to r and presents the credential, within 10 s.
func joinRouter(ctx context.Context, h host.Host, r peer.AddrInfo, cred string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.Connect(ctx, r); err != nil {
		return err
	}
	return meshrouter.Present(ctx, h, r.ID, cred)
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

// Providers finds the members that provide name (cached, shared; see
// internal/discovery).
func (p *Peer) Providers(ctx context.Context, name string) ([]peer.AddrInfo, error) {
	return p.find.Get(ctx, name)
}

// Close leaves the mesh.
func (p *Peer) Close() error { return errors.Join(p.DHT.Close(), p.Host.Close()) }
