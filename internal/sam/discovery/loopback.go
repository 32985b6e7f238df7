package discovery

import (
	"context"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Loopback is a mesh's DHT on one machine: n libp2p hosts on 127.0.0.1,
// each a DHT server under ProtocolPrefix, bootstrapped from the first,
// with their routing tables filled. It is what the lookup test and
// sam-bench's discovery benchmark run on (issue 17: "a loopback mesh of
// 20 nodes").
type Loopback struct {
	Hosts []host.Host
	DHTs  []*dht.IpfsDHT
}

// NewLoopback starts a Loopback of n nodes; Close stops them.
func NewLoopback(ctx context.Context, n int) (*Loopback, error) {
	l := &Loopback{}
	for i := range n {
		h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
		if err != nil {
			l.Close()
			return nil, err
		}
		var boot []peer.AddrInfo
		if i > 0 {
			boot = []peer.AddrInfo{{ID: l.Hosts[0].ID(), Addrs: l.Hosts[0].Addrs()}}
		}
		d, err := dht.New(h, dht.Mode(dht.ModeServer), dht.ProtocolPrefix(ProtocolPrefix), dht.BootstrapPeers(boot...))
		if err != nil {
			h.Close()
			l.Close()
			return nil, err
		}
		l.Hosts, l.DHTs = append(l.Hosts, h), append(l.DHTs, d)
		if i > 0 {
			if err := h.Connect(ctx, boot[0]); err != nil {
				l.Close()
				return nil, fmt.Errorf("node %d to the first: %w", i, err)
			}
		}
	}
	for i, d := range l.DHTs {
		if err := <-d.RefreshRoutingTable(); err != nil {
			l.Close()
			return nil, fmt.Errorf("node %d: refresh its routing table: %w", i, err)
		}
	}
	return l, nil
}

// Close stops every node.
func (l *Loopback) Close() error {
	var errs []error
	for _, d := range l.DHTs {
		errs = append(errs, d.Close())
	}
	for _, h := range l.Hosts {
		errs = append(errs, h.Close())
	}
	return errors.Join(errs...)
}
