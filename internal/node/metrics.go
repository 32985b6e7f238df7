package node

import (
	"context"
	"errors"
	"time"

	"sandstorm/internal/admission"
	"sandstorm/internal/api"
	"sandstorm/internal/gateway"
	"sandstorm/internal/metrics"
)

// Reasons an admission refused a create or a wake: the reason label of
// sandstorm_admission_refusals_total, a closed set.
const (
	reasonMemory = "memory" // admission.ErrNoMemory: below --mem-reserve
	reasonDisk   = "disk"   // admission.ErrNoDisk: below --disk-reserve
	reasonFDs    = "fds"    // admission.ErrNoFDs: near the descriptor limit
	reasonFull   = "full"   // ErrFull: no address slot or gateway port
	reasonBusy   = "busy"   // gateway.ErrRefused: no wake or start slot in time, or the sandbox held by another transition
)

// refusalReason says which admission refused err ("" when err is no
// refusal but a failure, or nil).
func refusalReason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, admission.ErrNoMemory):
		return reasonMemory
	case errors.Is(err, admission.ErrNoDisk):
		return reasonDisk
	case errors.Is(err, admission.ErrNoFDs):
		return reasonFDs
	case errors.Is(err, ErrFull):
		return reasonFull
	case errors.Is(err, gateway.ErrRefused):
		return reasonBusy
	}
	return ""
}

// outcome is err's outcome label, counting a refusal (op: what was
// refused) on the way.
func (n *Node) outcome(err error, op string) string {
	if err == nil {
		return metrics.OK
	}
	if r := refusalReason(err); r != "" {
		n.cfg.Metrics.Refusal(r, op)
		return metrics.Refused
	}
	return metrics.Failed
}

// countTransition counts a transition from → to that ended with err
// (took: how long a successful one ran).
func (n *Node) countTransition(from, to api.Tier, took time.Duration, err error) {
	if to == api.TierHot {
		n.cfg.Metrics.Wake(string(from), n.outcome(err, "wake"), took)
		return
	}
	n.cfg.Metrics.Transition(string(from), string(to), n.outcome(err, "transition"))
}

// countCreate counts a create or clone that started as how.
func (n *Node) countCreate(how string, err error) {
	n.cfg.Metrics.Create(how, n.outcome(err, "create"))
}

// MetricsState is what a scrape of the node's metrics reads now.
func (n *Node) MetricsState() (metrics.NodeState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := metrics.NodeState{Sandboxes: map[[2]string]int{}, MemReserve: n.cfg.MemReserveMiB << 20,
		DiskReserve: n.cfg.DiskReserveMiB << 20, Promised: n.promisedMiB() << 20,
		Wakes: len(n.wakes), Starts: len(n.starts)}
	s.Conns, s.Busy = n.gw.Stats()
	var errs []error
	if avail, err := n.cfg.MemAvailable(); err == nil {
		s.MemAvailable = avail << 20
	} else {
		errs = append(errs, err)
	}
	if free, err := n.diskFreeMiB(); err == nil {
		s.DiskFree = free << 20
	} else {
		errs = append(errs, err)
	}
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return s, errors.Join(append(errs, err)...)
	}
	for _, sb := range all {
		s.Sandboxes[[2]string{string(sb.Tier), sb.Template}]++
	}
	return s, errors.Join(errs...)
}
