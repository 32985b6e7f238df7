package node

import (
	"sandstorm/internal/node/boundaries"
	"sandstorm/internal/store"
)

// SAM is how the node's sandboxes reach the world (boundaries.SAM).
type SAM = boundaries.SAM

// PrincipalOf is who sb is: its own principal, else its name.
func PrincipalOf(sb store.Sandbox) string {
	if sb.Principal != "" {
		return sb.Principal
	}
	return sb.Name
}

// boundaryUp starts sb's boundary (boundaries.Set.Up) on the host end of
// its veth (which must exist) and on <sandbox dir>/agent.sock.
func (n *Node) boundaryUp(sb store.Sandbox) error {
	nw, err := n.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	return n.bounds.Up(boundaries.Sandbox{ID: sb.ID, Principal: PrincipalOf(sb), Net: nw,
		Socket: n.dir(sb.ID).AgentSock(), Activity: egress{n, sb.ID}})
}

// newBoundaries makes the node's set of boundaries; a boundary is up
// exactly while its sandbox's process may write its console log: that
// is when its lines get times (logstamp).
func (n *Node) newBoundaries() {
	n.bounds = boundaries.New(boundaries.Config{SAM: n.cfg.SAM, Log: n.log, Listen: n.cfg.Listen, ListenPacket: n.cfg.ListenPacket,
		Up: func(id string) {
			if n.stamps != nil {
				if err := n.stamps.Watch(n.dir(id).Log()); err != nil {
					n.log.Warn("console log lines of this sandbox get no times", "id", id, "err", err)
				}
			}
		},
		Down: func(id string) {
			if n.stamps != nil {
				n.stamps.Unwatch(n.dir(id).Log())
			}
		},
	})
}

// BoundarySocket returns the host-side Unix socket of sandbox id's boundary.
func (n *Node) BoundarySocket(id string) string {
	return n.dir(id).AgentSock()
}
