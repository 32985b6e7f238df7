package tiering

import (
	"context"

	"sandstorm/api"
	"sandstorm/internal/sam/boundary"
)

// egress is what a sandbox's boundary tells the node of its way out
// (boundary.Activity), as the gateway does of its way in: the idle timers
// and the memory guard must not take an agent that is calling out, with
// nothing coming in, for an idle one.
type egress struct {
	m  *Machine
	id string
}

// Egress is what sandbox id's boundary tells the node (boundary.Activity).
func (m *Machine) Egress(id string) boundary.Activity { return egress{m, id} }

func (a egress) Touch() { a.m.Touch(a.id) }

func (a egress) Busy(delta int) {
	if e, ok := a.m.Lookup(a.id); ok {
		e.egressCalls.Add(int32(delta))
	}
}

// Thaw resumes the sandbox if it is frozen (the bytes of an answer on their
// way into it); any other tier is left as it is: a sandbox on disk or
// detached had its boundary's flows reset, so nothing is waiting in it.
func (a egress) Thaw(ctx context.Context) error {
	e, ok := a.m.Lookup(a.id)
	if !ok || e.Tier() != api.TierFrozen {
		return nil
	}
	return a.m.Wake(ctx, a.id)
}
