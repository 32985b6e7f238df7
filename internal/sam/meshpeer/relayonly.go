package meshpeer

import (
	"net/netip"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/x/rate"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// relayOnlyFor is how long a member reached only through a relay is
// dialled through relays only before its own addresses are tried again.
const relayOnlyFor = 10 * time.Minute

// relayOnly is the host's connection gater: it refuses dials to the own
// addresses of members that this one last reached only through a relay.
//
// Why: a member on a network of its own (behind NAT; fleet up's nodes on
// one host, where nothing is forwarded between them) publishes addresses
// that drop packets from others. libp2p dials them first and the relays
// 0.5 s later, and a dial whose relays fail — a router restarting — waits
// out those addresses for 5 s before it gives up; every dial joining it
// meanwhile waits too (one dial per peer is shared). A call begun in the
// 0.1 s a router took to restart then failed 5 s later (issue 29,
// measured with sam-bench heal). Once a connection with a member came
// through a relay, whichever side dialled it, its own addresses are not
// dialled for relayOnlyFor: a dial fails at once while no relay answers,
// and succeeds at once when one does. (A member that dialled this one
// through a relay may be reachable directly all the same, behind a NAT
// that lets replies in; the cost of taking it for unreachable is the
// relay's hop for a while.)
type relayOnly struct {
	mu      sync.Mutex
	until   map[peer.ID]time.Time
	routers map[peer.ID]bool
}

func newRelayOnly(routers []peer.AddrInfo) *relayOnly {
	g := &relayOnly{until: map[peer.ID]time.Time{}, routers: map[peer.ID]bool{}}
	for _, r := range routers {
		g.routers[r.ID] = true
	}
	return g
}

func isCircuit(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// connected notes a connection with a member that came through a relay.
func (g *relayOnly) connected(c network.Conn) {
	if !isCircuit(c.RemoteMultiaddr()) || g.routers[c.RemotePeer()] {
		return
	}
	g.mu.Lock()
	g.until[c.RemotePeer()] = time.Now().Add(relayOnlyFor)
	g.mu.Unlock()
}

func (g *relayOnly) InterceptAddrDial(id peer.ID, a ma.Multiaddr) bool {
	if isCircuit(a) {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.until[id]
	if ok && time.Now().After(until) {
		delete(g.until, id)
		ok = false
	}
	return !ok
}

func (g *relayOnly) InterceptPeerDial(peer.ID) bool              { return true }
func (g *relayOnly) InterceptAccept(network.ConnMultiaddrs) bool { return true }
func (g *relayOnly) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) {
	return true, 0
}
func (g *relayOnly) InterceptSecured(network.Direction, peer.ID, network.ConnMultiaddrs) bool {
	return true
}

// resources is the host's resource manager: libp2p's defaults, except
// that connections with the member's own routers are never rate-limited.
//
// Why: libp2p limits new connections per IPv4 address to a burst of 16,
// then one every 5 s, counting failed dials too. A member that kept
// trying a router while it was down for 10 s spent the burst, and then
// could not join it again for 20 s after it came back ("rate limit
// exceeded", measured with sam-bench heal's router-down). A member dials
// its routers at most once a second (retryMax) and calls never dial a
// router that is away (circuitRouters), so the limit only delayed healing.
func resources(routers []peer.AddrInfo) (network.ResourceManager, error) {
	lim := &rate.Limiter{
		// libp2p's default subnet limits, from rcmgr.newConnRateLimiter.
		SubnetRateLimiter: rate.SubnetLimiter{
			IPv4SubnetLimits: []rate.SubnetLimit{{PrefixLength: 32, Limit: rate.Limit{RPS: 0.2, Burst: 16}}},
			IPv6SubnetLimits: []rate.SubnetLimit{
				{PrefixLength: 56, Limit: rate.Limit{RPS: 0.2, Burst: 16}},
				{PrefixLength: 48, Limit: rate.Limit{RPS: 0.5, Burst: 80}},
			},
			GracePeriod: time.Minute,
		},
		NetworkPrefixLimits: []rate.PrefixLimit{
			{Prefix: netip.MustParsePrefix("127.0.0.0/8")},
			{Prefix: netip.MustParsePrefix("::1/128")},
		},
	}
	for _, r := range routers {
		for _, a := range r.Addrs {
			if ip, err := manet.ToIP(a); err == nil {
				if addr, ok := netip.AddrFromSlice(ip); ok {
					addr = addr.Unmap()
					lim.NetworkPrefixLimits = append(lim.NetworkPrefixLimits, rate.PrefixLimit{Prefix: netip.PrefixFrom(addr, addr.BitLen())})
				}
			}
		}
	}
	return rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(rcmgr.DefaultLimits.AutoScale()), rcmgr.WithConnRateLimiters(lim))
}
