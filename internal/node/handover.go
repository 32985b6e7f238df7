package node

import (
	"context"
	"time"

	"sandstorm/internal/gateway"
)

// HandoverResult says what Handover did.
type HandoverResult struct {
	Gateway gateway.HandoverResult
	// Flows is how many flows through boundaries were reset.
	Flows int
	// Busy is how many sandboxes were still in a transition when the wait
	// ran out (the next process's start-up repair finishes them, as after
	// a kill -9).
	Busy int
}

// Handover readies the node for the process to be replaced by a new binary
// in the same PID (a reload of sandstormd, issue 18 item 3). Unlike Close
// it leaves every listener, boundary and sandbox as it is: the caller has
// already kept the listening sockets for the next process (Config.Listen;
// handoff.Registry.Pause, which also stopped their accept loops). It stops
// the tiering, memory and pool loops, lets the gateway answer the requests
// in flight (gateway.Handover, at most wait), resets the flows through the
// boundaries (the sandbox side sees a reset, not a clean end it could
// take for a whole answer), waits for transitions in flight until ctx
// ends, and writes the sandboxes' last activity to the store. Nothing is
// started afterwards; the node is not usable again in this process.
func (n *Node) Handover(ctx context.Context, wait time.Duration) HandoverResult {
	var res HandoverResult
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	n.hosts.Close() // already closed by the pause; its accept loop ends
	res.Gateway = n.gw.Handover(wait)
	res.Flows = n.bounds.CloseFlows()
	// The loops return once their step in progress is done (a tick's
	// transitions, a pool refill); they are bounded by ctx like the rest.
	loops := make(chan struct{})
	go func() { n.done.Wait(); close(loops) }()
	select {
	case <-loops:
	case <-ctx.Done():
	}
	for _, e := range n.tiers.Entries() {
		if e.Acquire(ctx) != nil {
			res.Busy++
			continue
		}
		e.Envd.Drop()
		e.Release()
	}
	n.tiers.FlushActivity()
	return res
}
