package node

import (
	"context"
	"errors"
	"time"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/gateway"
	"sandstorm/internal/metrics"
)

// The node's Prometheus metrics (internal/metrics, issue 18) are counted
// here, where each thing happens: a transition or a wake as it ends
// (transitions.go), a create and a delete (node.go, clone.go). Not from
// the events hub, which drops events for a watcher that falls behind.

// refusalReason says which admission refused err ("" when err is no
// refusal).
func refusalReason(err error) string {
	switch {
	case errors.Is(err, admission.ErrNoMemory):
		return metrics.ReasonMemory
	case errors.Is(err, admission.ErrNoDisk):
		return metrics.ReasonDisk
	case errors.Is(err, admission.ErrNoFDs):
		return metrics.ReasonFDs
	case errors.Is(err, ErrFull):
		return metrics.ReasonFull
	case errors.Is(err, gateway.ErrRefused):
		return metrics.ReasonBusy
	}
	return ""
}

// outcome is err's outcome label, counting a refusal of op on the way. It
// is "" — count nothing — for a request that did not apply (a freeze of a
// snapshot sandbox, a name taken, a create the master fenced off, a
// sandbox gone): nothing was attempted, and the API's counter has it by
// status.
func (n *Node) outcome(err error, op string) string {
	switch {
	case err == nil:
		return metrics.OK
	case errors.Is(err, errdefs.ErrConflict), errors.Is(err, errdefs.ErrNotSupported),
		errors.Is(err, errdefs.ErrBadInput), errors.Is(err, errdefs.ErrExists), errors.Is(err, errdefs.ErrNotFound):
		return ""
	}
	if r := refusalReason(err); r != "" {
		n.cfg.Metrics.Refusal(r, op)
		return metrics.Refused
	}
	return metrics.Failed
}

// countTransition counts a transition from → to that ended with err (took:
// how long a successful one ran; failed: it ended without err but not as
// asked, as a restore that came back cold).
func (n *Node) countTransition(from, to api.Tier, took time.Duration, err error, failed bool) {
	op := "wake"
	if to == api.TierSnapshot {
		op = "snapshot"
	}
	o := n.outcome(err, op)
	if failed && o == metrics.OK {
		o = metrics.Failed
	}
	if o == "" {
		return
	}
	if to == api.TierHot {
		n.cfg.Metrics.Wake(string(from), o, took)
		return
	}
	n.cfg.Metrics.Transition(string(from), string(to), o)
}

// countCreate counts a create or a clone's child that started as how.
func (n *Node) countCreate(how string, err error) {
	if o := n.outcome(err, "create"); o != "" {
		n.cfg.Metrics.Create(how, o)
	}
}

// MetricsState is what a scrape of the node's metrics reads now
// (metrics.NodeCollector). What cannot be read is -1 (memory, disk) or
// nil (sandboxes), and said in err.
func (n *Node) MetricsState() (metrics.NodeState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := metrics.NodeState{MemReserve: n.cfg.MemReserveMiB << 20, DiskReserve: n.cfg.DiskReserveMiB << 20,
		Promised: n.adm.Promised() << 20, Pooled: n.pool.Sizes(),
		Wakes: len(n.wakes), Starts: len(n.starts), MemAvailable: -1, DiskFree: -1}
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
func (n *Node) transitionsTo() map[api.Tier]uint64 {
	by := n.cfg.Metrics.TransitionsTo()
	if by == nil {
		return nil
	}
	out := make(map[api.Tier]uint64, len(by))
	for t, v := range by {
		out[api.Tier(t)] = v
	}
	return out
}
