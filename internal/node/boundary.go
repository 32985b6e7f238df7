package node

import (
	"sandstorm/internal/node/boundaries"
)

// SAM is how the node's sandboxes reach the world (boundaries.SAM).
type SAM = boundaries.SAM

// newBoundaries makes the node's set of boundaries; a boundary is up
// exactly while its sandbox's process may write its console log: that
// is when its lines get times (logstamp).
func (n *Node) newBoundaries() {
	n.bounds = boundaries.New(boundaries.Config{SAM: n.cfg.SAM, Log: n.log, Listen: n.cfg.Listen, ListenPacket: n.cfg.ListenPacket,
		Up: func(id string) {
			if n.stamps != nil {
				if err := n.stamps.Watch(n.h.Dir(id).Log()); err != nil {
					n.log.Warn("console log lines of this sandbox get no times", "id", id, "err", err)
				}
			}
		},
		Down: func(id string) {
			if n.stamps != nil {
				n.stamps.Unwatch(n.h.Dir(id).Log())
			}
		},
	})
}

// BoundarySocket returns the host-side Unix socket of sandbox id's boundary.
func (n *Node) BoundarySocket(id string) string {
	return n.h.Dir(id).AgentSock()
}
