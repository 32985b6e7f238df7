package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"

	"sandstorm/internal/boundary"
	"sandstorm/internal/dialguard"
	"sandstorm/internal/netns"
	"sandstorm/internal/policy"
	"sandstorm/internal/refusals"
	"sandstorm/internal/store"
)

// SAM is how the node's sandboxes reach the world: each gets a boundary of
// its own (internal/boundary) on the host end of its veth, deciding every
// flow for the sandbox's principal under Policy. All boundaries of the node
// live in this process, so an additional sandbox costs its listeners and
// maps, not a process.
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
}

// PrincipalOf is who sb is: its own principal, else its name.
func PrincipalOf(sb store.Sandbox) string {
	if sb.Principal != "" {
		return sb.Principal
	}
	return sb.Name
}

// boundaryUp starts sb's boundary on the host end of its veth (which must
// exist) and on <sandbox dir>/agent.sock, replacing a running one.
func (n *Node) boundaryUp(sb store.Sandbox) error {
	n.boundaryDown(sb.ID)
	nw, err := n.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	fw := n.cfg.SAM.Firewall
	var guard dialguard.Checker // nil: the boundary's strict default
	if n.cfg.SAM.Guard != nil {
		guard = n.cfg.SAM.Guard
	}
	b, err := boundary.New(boundary.Config{
		Principal:       PrincipalOf(sb),
		Policy:          n.cfg.SAM.Policy,
		Mesh:            n.cfg.SAM.Mesh,
		MeshPool:        n.meshPool,
		SocketPath:      filepath.Join(string(n.dir(sb.ID)), "agent.sock"),
		ListenAddr:      nw.Host.Addr(),
		Peer:            nw.Sandbox.Addr(), // the listeners serve this sandbox only
		ProxyPort:       fw.ProxyPort,
		DNSPort:         fw.DNSPort,
		TransparentPort: fw.TransparentPort,
		Synthetic:       fw.Synthetic,
		Metrics:         n.cfg.SAM.Metrics,
		Refusals:        n.cfg.SAM.Refusals,
		Activity:        egress{n, sb.ID},
		Resolve:         n.cfg.SAM.Resolve,
		Guard:           guard,
		Log:             n.log.With("sandbox", sb.ID), // its lines name the principal themselves
		Listen:          n.cfg.Listen,
		ListenPacket:    n.cfg.ListenPacket,
	})
	if err != nil {
		return fmt.Errorf("boundary of %s: %w", sb.ID, err)
	}
	if err := b.Start(); err != nil {
		b.Close()
		return fmt.Errorf("boundary of %s: %w", sb.ID, err)
	}
	n.bmu.Lock()
	n.boundaries[sb.ID] = b
	n.bmu.Unlock()
	// The boundary is up exactly while the sandbox's process may write
	// its console log: that is when its lines get times (logstamp).
	if n.stamps != nil {
		if err := n.stamps.Watch(n.dir(sb.ID).Log()); err != nil {
			n.log.Warn("console log lines of this sandbox get no times", "id", sb.ID, "err", err)
		}
	}
	return nil
}

// boundaryDown closes sb's boundary: every flow reset, listeners closed.
// Called before a checkpoint (gVisor cannot save an established TCP
// endpoint) and when the sandbox's network goes away.
func (n *Node) boundaryDown(id string) {
	n.bmu.Lock()
	b := n.boundaries[id]
	delete(n.boundaries, id)
	n.bmu.Unlock()
	if b != nil {
		b.Close()
	}
	if n.stamps != nil {
		n.stamps.Unwatch(n.dir(id).Log())
	}
}

// BoundarySocket returns the host-side Unix socket of sandbox id's boundary.
func (n *Node) BoundarySocket(id string) string {
	return n.dir(id).AgentSock()
}
