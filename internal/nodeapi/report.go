package nodeapi

import (
	"errors"
	"time"

	"sandstorm/api"
)

// A node reports to its master as it commits (issue 9: "each node keeps
// its own actual state … and reports changes to the master as it commits
// them, so that a GET or a list never waits on a node"). The master opens
// one long request to each node (over the node's tunnel, for one that
// dials in: the calls all go the master's way) and the node streams
// Reports on it: first all it has, then each change, and a heartbeat
// with its status every HeartbeatEvery. A master that hears nothing for
// SilenceLimit takes the node for lost; a node that falls behind its own
// changes sends all it has again rather than miss one.

// HeartbeatEvery is how often a node sends its status when nothing else
// happens.
const HeartbeatEvery = time.Second

// SilenceLimit is how long a master waits for a report before it takes
// the node for lost: three heartbeats.
const SilenceLimit = 3 * HeartbeatEvery

// Report is one message of a node's report stream.
type Report struct {
	// Full, when set, says Sandboxes is every sandbox the node has: what
	// the master knew of the node is replaced by it.
	Full      bool          `json:"full,omitempty"`
	Sandboxes []api.Sandbox `json:"sandboxes,omitempty"`
	// Event is what just happened on the node; Sandbox is the sandbox
	// it concerns as it is after it, or Gone its ID if it no longer is.
	Event   *api.Event   `json:"event,omitempty"`
	Sandbox *api.Sandbox `json:"sandbox,omitempty"`
	Gone    string       `json:"gone,omitempty"`
	// Status is the node's headroom and tier counts (every report
	// with Full, and every heartbeat).
	Status *api.NodeStatus `json:"status,omitempty"`
	// Resume is a sandbox whose traffic reached this node's ingress
	// while it was paused with E2B's autoResume: only the master records
	// a resume (its lifetime, its state), so the node asks, and serves
	// the traffic once the master's next push of routes says it runs.
	Resume string `json:"resume,omitempty"`
}

// ErrNotSent marks (with errdefs.ErrUnavailable) a call that never reached
// the node: not one byte of it left, so the node cannot have acted on it,
// and a create may be tried on another node (internal/fleet).
var ErrNotSent = errors.New("not sent")
