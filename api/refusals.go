package api

import "time"

// Agents' refusals on their way to sam-one's console (issue 17, item 7;
// internal/sam/refusals): counted where they are decided — a boundary, a
// sam-node — into bounded tables of (principal, what, target, reason),
// and passed on as a RefusalReport: sandstormd's (or sam-box's)
// boundaries to their sam-node on its agent socket (POST
// SAMRefusalsPath, a request naming no principal), each sam-node to the
// control plane with its member credential (POST RefusalsPath).

// SAMRefusalsPath is where the boundaries of a machine report their
// refusals to its sam-node (POST, a RefusalReport), on sam-node's agent
// listener in a request naming no principal: sandstormd's node and
// sam-box, never an agent (a boundary always names its principal, and
// sam-node refuses the path to a request that does).
const SAMRefusalsPath = "/sam/v1/refusals"

// RefusalsPath is the control plane's endpoint for a member's report
// (POST, a RefusalReport, Authorization: Bearer <member credential>).
const RefusalsPath = "/v1/refusals"

// RefusalReport is what one source refused since its last report:
// Rows, one per (principal, by, what, target, reason, from) with a
// count, and Dropped, the refusals that found its table full and are
// counted but not itemised.
type RefusalReport struct {
	Rows    []RefusalRow `json:"rows"`
	Dropped uint64       `json:"dropped,omitempty"`
}

// RefusalRow is one kind of refusal of one principal, Count times
// between First and Last.
type RefusalRow struct {
	// Principal is the agent refused (for What "foreign": the principal
	// whose boundary was connected to).
	Principal string `json:"principal"`
	// By is where it was decided: RefusedByBoundary or RefusedBySAMNode.
	By string `json:"by"`
	// What was asked for: one of the Refused* kinds below.
	What string `json:"what"`
	// Target is what was asked for: a name, a model, an MCP server, a
	// tool (<server>__<tool>), a path, an address.
	Target string `json:"target"`
	Reason string `json:"reason"`
	// From is the member a mesh call came from, when another member's
	// agent was refused by this member's policy ("": this member's own).
	From  string    `json:"from,omitempty"`
	Count uint64    `json:"count"`
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// Where a refusal was decided.
const (
	RefusedByBoundary = "boundary"
	RefusedBySAMNode  = "sam-node"
)

// What was refused (RefusalRow.What).
const (
	// RefusedName: a flow to a name (or an IP literal) the principal's
	// policy does not grant (SOCKS5 0x02, HTTP 403).
	RefusedName = "name"
	// RefusedDNS: a DNS question for such a name (NXDOMAIN).
	RefusedDNS = "dns"
	// RefusedAddress: an address a granted name resolved to that a
	// sandbox may never reach (internal/sam/dialguard; the reason names its
	// class).
	RefusedAddress = "address"
	// RefusedUnknownAddress: a transparent flow to an address the
	// boundary answered no name with.
	RefusedUnknownAddress = "unknown-address"
	// RefusedMeshRequest: an HTTP request on a mesh flow the boundary
	// does not pass on (a path agents may not use, CONNECT, plain HTTP
	// for an external name).
	RefusedMeshRequest = "mesh-request"
	// RefusedForeign: a connection to a boundary's sandbox-facing
	// listeners from a source that is not its sandbox.
	RefusedForeign = "foreign"
	// RefusedModel, RefusedMCPServer, RefusedTool: what sam-node refused
	// a principal (not granted, or not the service its endpoint is).
	RefusedModel     = "model"
	RefusedMCPServer = "mcp-server"
	RefusedTool      = "tool"
)
