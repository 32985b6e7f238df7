package meshrouter

import (
	"errors"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"

	"sandstorm/internal/sam/discovery"
)

// Router is a running router: its host, DHT, relay and gate.
type Router struct {
	Host  host.Host
	DHT   *dht.IpfsDHT
	Relay *relay.Relay
	Gate  *Gate
}

// New starts a router with identity key on listen (multiaddrs), whose
// gate checks credentials with verify; own gives the router's own
// credential to the members that present theirs (nil: none).
func New(key crypto.PrivKey, listen []string, verify Verify, own func() string) (*Router, error) {
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings(listen...), libp2p.DisableRelay())
	if err != nil {
		return nil, err
	}
	r := &Router{Host: h, Gate: NewGate(verify)}
	r.Gate.Serve(h, own)
	// Members only may use the relay (the ACL), and what they send over
	// it is mesh calls — a completion streamed for minutes, a file a tool
	// returns — so a relayed connection has no limit: relay v2's default
	// (2 min, 128 KiB per connection, then reset) would cut calls to a
	// member that only the relay reaches. A relayed connection with no
	// limit is also not "limited" to libp2p, so streams open on it as on a
	// direct one.
	if r.Relay, err = relay.New(h, relay.WithACL(r.Gate), relay.WithInfiniteLimits()); err != nil {
		h.Close()
		return nil, err
	}
	members := func(_ any, p peer.ID) bool { return r.Gate.Admitted(p) }
	// The DHT is given a host whose stream handlers answer members only:
	// its routing-table and query filters decide whom it asks and keeps,
	// not whom it answers, so without this a peer in its grace (or one
	// that never presents) could read every provider record and write
	// ADD_PROVIDER records of its own for members to try.
	r.DHT, err = dht.New(membersOnly{h, r.Gate}, dht.Mode(dht.ModeServer), dht.ProtocolPrefix(discovery.ProtocolPrefix),
		dht.RoutingTableFilter(members),
		dht.QueryFilter(func(d any, ai peer.AddrInfo) bool { return members(d, ai.ID) }))
	if err != nil {
		r.Relay.Close()
		h.Close()
		return nil, err
	}
	return r, nil
}

// membersOnly is the router's host as its DHT sees it: every stream
// handler the DHT sets (go-libp2p-kad-dht sets one per protocol, on
// server mode) resets a stream from a peer that is not a member now.
type membersOnly struct {
	host.Host
	gate *Gate
}

func (h membersOnly) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	h.Host.SetStreamHandler(pid, h.gate.Guard(pid, handler))
}

func (h membersOnly) SetStreamHandlerMatch(pid protocol.ID, match func(protocol.ID) bool, handler network.StreamHandler) {
	h.Host.SetStreamHandlerMatch(pid, match, h.gate.Guard(pid, handler))
}

// Close stops the router.
func (r *Router) Close() error {
	return errors.Join(r.DHT.Close(), r.Relay.Close(), r.Host.Close())
}
