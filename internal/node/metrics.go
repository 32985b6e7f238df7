package node

import (
	"context"
	"errors"
	"time"

	"sandstorm/api"
	"sandstorm/internal/metrics"
)

// The node's Prometheus metrics (internal/metrics, issue 18) are counted
// here, where each thing happens: a transition or a wake as it ends
// (internal/node/tiering), a create and a delete (node.go, clone.go). Not from
// the events hub, which drops events for a watcher that falls behind.

// MetricsState is what a scrape of the node's metrics reads now
// (metrics.NodeCollector). What cannot be read is -1 (memory, disk) or
// nil (sandboxes), and said in err.
func (n *Node) MetricsState() (metrics.NodeState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := metrics.NodeState{MemReserve: n.cfg.MemReserveMiB << 20, DiskReserve: n.cfg.DiskReserveMiB << 20,
		Promised: n.adm.Promised() << 20, Pooled: n.pool.Sizes(),
		Wakes: n.tiers.WakesRunning(), Starts: len(n.starts), MemAvailable: -1, DiskFree: -1}
	s.Conns, s.InFlight = n.gw.Stats()
	var errs []error
	if avail, err := n.cfg.MemAvailable(); err == nil {
		s.MemAvailable = avail << 20
		s.Headroom = s.MemAvailable - s.MemReserve - s.Promised - n.adm.Kept()<<20
	} else {
		errs = append(errs, err)
	}
	if free, err := n.diskFree(); err == nil {
		s.DiskFree = free << 20
	} else {
		errs = append(errs, err)
	}
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return s, errors.Join(append(errs, err)...)
	}
	s.Sandboxes = map[[2]string]int{}
	for _, sb := range all {
		s.Sandboxes[[2]string{string(sb.Tier), sb.Template}]++
	}
	if ts, err := n.st.ListTemplates(ctx); err == nil {
		for _, t := range ts {
			s.Templates = append(s.Templates, t.Name)
		}
	} else {
		errs = append(errs, err)
	}
	return s, errors.Join(errs...)
}

// transitionsTo is api.NodeStatus.Transitions, read from the metrics'
// own counters (nil without metrics).
func transitionsTo(m *metrics.Node) map[api.Tier]uint64 {
	by := m.TransitionsTo()
	if by == nil {
		return nil
	}
	out := make(map[api.Tier]uint64, len(by))
	for t, v := range by {
		out[api.Tier(t)] = v
	}
	return out
}
