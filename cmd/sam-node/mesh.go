package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"sandstorm/internal/membership"
	"sandstorm/internal/meshnode"
	"sandstorm/internal/meshpeer"
	"sandstorm/internal/refusals"
)

// meshOptions are sam-node's flags for the mesh beyond this machine.
type meshOptions struct {
	dir     string
	routers []string
	listen  []string
}

func (m meshOptions) on() bool { return len(m.routers) > 0 }

// openMember opens the node's mesh identity (sam-node join) and keeps it
// current (keys, revocations, its credential) until ctx ends.
func openMember(ctx context.Context, o meshOptions, log *slog.Logger) (*membership.Member, []peer.AddrInfo, error) {
	var routers []peer.AddrInfo
	for _, r := range o.routers {
		ai, err := peer.AddrInfoFromString(r)
		if err != nil {
			return nil, nil, fmt.Errorf("--router %q: want a multiaddr ending in /p2p/<peer ID> (sam-router prints its own): %w", r, err)
		}
		routers = append(routers, *ai)
	}
	m, err := membership.OpenDir(o.dir, log)
	if err != nil {
		return nil, nil, fmt.Errorf("--mesh-dir: %w; enrol this node first with: sam-node join --mesh-dir %s …", err, o.dir)
	}
	go m.Run(ctx)
	return m, routers, nil
}

// reportRefusals sends the control plane what the node and its machine's
// boundaries refused its agents (internal/refusals), every
// refusals.NodeEvery, until ctx ends.
func reportRefusals(ctx context.Context, m *membership.Member, node *meshnode.Node, log *slog.Logger) {
	refusals.Forward(ctx, node.Refusals(), refusals.NodeEvery, m.ReportRefusals, "the control plane", log)
}

// joinMesh joins the routers in the background, retrying until one takes
// this member — the node serves its own agents meanwhile — then sets the
// mesh and keeps the peer joined until ctx ends. It returns when the peer
// has left.
func joinMesh(ctx context.Context, m *membership.Member, routers []peer.AddrInfo, listen []string, node *meshnode.Node, mesh *meshpeer.Deferred, log *slog.Logger) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		p, err := meshpeer.Join(ctx, meshpeer.Config{
			Key: m.PrivateKey(), Credential: m.Credential, Verify: m.Verify,
			Routers: routers, Listen: listen,
			Names: node.Names, Handler: node.MeshHandler(), Logger: log,
		})
		if err != nil {
			log.Warn("sam-node: cannot join the mesh yet; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		var addrs []string
		for _, a := range p.Host.Addrs() {
			addrs = append(addrs, a.String())
		}
		log.Info("sam-node: joined the mesh", "member", m.Name(), "peer", p.Host.ID().String(), "addrs", addrs, "serves", node.Names())
		mesh.Set(p)
		p.Run(ctx)
		p.Close()
		return
	}
}
