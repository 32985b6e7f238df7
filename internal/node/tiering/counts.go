package tiering

import (
	"errors"
	"time"

	"sandstorm/api"
	"sandstorm/internal/admission"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/metrics"
	"sandstorm/internal/node/host"
)

// The node's Prometheus metrics (internal/metrics, issue 18) are counted
// where each thing happens: a transition or a wake as it ends, a create
// and a delete (the node's). Not from the events hub, which drops events
// for a watcher that falls behind.

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
	case errors.Is(err, host.ErrFull):
		return metrics.ReasonFull
	case errors.Is(err, ErrRefused):
		return metrics.ReasonBusy
	}
	return ""
}

// outcome is err's outcome label, counting a refusal of op on the way. It
// is "" — count nothing — for a request that did not apply (a freeze of a
// snapshot sandbox, a name taken, a create the master fenced off, a
// sandbox gone): nothing was attempted, and the API's counter has it by
// status.
func (m *Machine) outcome(err error, op string) string {
	switch {
	case err == nil:
		return metrics.OK
	case errors.Is(err, errdefs.ErrConflict), errors.Is(err, errdefs.ErrNotSupported),
		errors.Is(err, errdefs.ErrBadInput), errors.Is(err, errdefs.ErrExists), errors.Is(err, errdefs.ErrNotFound):
		return ""
	}
	if r := refusalReason(err); r != "" {
		m.cfg.Metrics.Refusal(r, op)
		return metrics.Refused
	}
	return metrics.Failed
}

// CountTransition counts a transition from → to that ended with err
// (took: how long a successful one ran; failed: it ended without err but
// not as asked, as a restore that came back cold).
func (m *Machine) CountTransition(from, to api.Tier, took time.Duration, err error, failed bool) {
	op := "wake"
	if to == api.TierSnapshot {
		op = "snapshot"
	}
	o := m.outcome(err, op)
	if failed && o == metrics.OK {
		o = metrics.Failed
	}
	if o == "" {
		return
	}
	if to == api.TierHot {
		m.cfg.Metrics.Wake(string(from), o, took)
		return
	}
	m.cfg.Metrics.Transition(string(from), string(to), o)
}

// CountCreate counts a create or a clone's child that started as how.
func (m *Machine) CountCreate(how string, err error) {
	if o := m.outcome(err, "create"); o != "" {
		m.cfg.Metrics.Create(how, o)
	}
}
