// Package nodeapi is the seam between a master and its nodes (issue 9):
// what a master may ask of a node, in wire types and IDs only — no store
// rows, no paths of the node's own files — and the deadlines of those
// calls (deadline.go, built on the runtime's own in internal/sandbox).
// Its implementations live apart, as containerd's runtime and its remote
// task service do: nodeside.Side, the node's side (in the master's own
// process, or behind remote.Server on a node of its own), and
// remote.Client, a node reached over the network; fleettest.Node, one in
// memory. nodeapitest runs one contract against all of them. Errors are
// the errdefs kinds on both sides; the wire carries their codes
// (errdefs.Table), so errors.Is works on the master's side as on the
// node's.
package nodeapi

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/inject"
)

// Node is what a master may ask of one node.
type Node interface {
	// Name is the node's name.
	Name() string
	// Create starts a sandbox of req.Template and returns it hot.
	Create(ctx context.Context, req CreateRequest) (api.Sandbox, error)
	// Get returns the sandbox whose ID or name is ref.
	Get(ctx context.Context, ref string) (api.Sandbox, error)
	// List returns every sandbox on the node.
	List(ctx context.Context) ([]api.Sandbox, error)
	// Delete removes sandbox id and all it had.
	Delete(ctx context.Context, id string) error
	// Transition moves sandbox id: freeze, snapshot, detach or wake.
	Transition(ctx context.Context, id string, op Op) (api.Sandbox, error)
	// Clone makes children of a running sandbox from its memory. With an
	// error, the result holds the children made before it (if any).
	Clone(ctx context.Context, id string, req CloneRequest) (api.CloneResult, error)
	// Logs writes sandbox id's console output to w: the last 64 KiB, then
	// with Follow what is appended, until ctx ends or the sandbox is
	// deleted.
	Logs(ctx context.Context, id string, opt LogOptions, w io.Writer) error
	// Layer writes to w what sandbox id wrote over its template (its
	// overlay's upper layer) as rootfs.PackVolume's tar: overlayfs's
	// whiteouts and opaque directories included. A template build takes
	// a RUN step's result this way (internal/imagetemplate).
	Layer(ctx context.Context, id string, w io.Writer) error
	// Usage is what sandbox id uses now (CPU, memory, disk), read from
	// outside it: it neither wakes the sandbox nor keeps it from idling.
	Usage(ctx context.Context, id string) (api.Usage, error)
	// SetEgress replaces sandbox id's egress rules (empty: none) in its
	// row and its boundary, for its new flows at once. Malformed rules
	// are errdefs.ErrBadInput; a name its policy does not grant its
	// principal, errdefs.ErrForbidden (the rules only narrow).
	SetEgress(ctx context.Context, id string, e api.Egress) (api.Sandbox, error)
	// EgressLog writes sandbox id's egress log to w as JSON lines, each
	// an api.EgressPage: one of the flows after opt.After (at most
	// opt.Limit; 0: all it keeps); with Follow, then one for each batch
	// of new flows, until ctx ends or the sandbox is deleted.
	EgressLog(ctx context.Context, id string, opt EgressLogOptions, w io.Writer) error
	// Status is the node's headroom and tier counts.
	Status(ctx context.Context) (api.NodeStatus, error)
	// PrepareTemplate readies a template on the node before its first
	// sandbox (for a warm template: starts it once and checkpoints it).
	// t names its rootfs by t.Digest only. A node that has no tree of
	// that digest makes it from t.Layers if it has them all (flattened,
	// and kept only if it is t.Digest); otherwise it answers
	// errdefs.ErrPrecondition, and the master sends the layers it lacks
	// (Layers, PutLayer) or the whole tree (PutRootfs) and asks again.
	PrepareTemplate(ctx context.Context, t api.Template) error
	// PutRootfs gives the node the rootfs tree whose digest is digest, as
	// rootfs.Pack's tarball; the node keeps it only if the stream's
	// SHA-256 is digest, and keeps it until no template of its uses it.
	PutRootfs(ctx context.Context, digest string, tar io.Reader) error
	// Layers answers which of the image layers digests (api.Template's
	// Layers) the node has not got, in their order.
	Layers(ctx context.Context, digests []string) (missing []string, err error)
	// PutLayer gives the node the image layer whose digest is digest, as
	// layercache.Pack's tar (overlayfs form: whiteouts, opaque
	// directories); the node keeps it only if the stream's SHA-256 is
	// digest, and keeps it until no template of its uses it.
	PutLayer(ctx context.Context, digest string, tar io.Reader) error
	// DropTemplate removes what the node holds of template name.
	DropTemplate(ctx context.Context, name string) error
	// Watch sends the node's reports to send (watch.go): all it has, then
	// every change as it commits it, and a heartbeat; until ctx ends,
	// send fails or the node is gone.
	Watch(ctx context.Context, send func(Report) error) error
	// ServeEnvd forwards r to the envd of sandbox id (the E2B API for
	// commands and files inside it) as a call of path, waking the sandbox
	// first, and streams the answer to w. It returns an error only when it
	// wrote nothing, for the caller to answer with.
	ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error
	// ServePort forwards r, as it came (path, query, an upgrade), to the
	// sandbox's own port (E2B's https://<port>-<id>.<domain>), waking
	// the sandbox first, and streams the answer to w; an error only when
	// it wrote nothing.
	ServePort(w http.ResponseWriter, r *http.Request, id string, port int) error
	// PutRoutes gives the node's ingress the fleet's routes (routes.go):
	// the table whole, or a change to the version it has. A node with no
	// ingress accepts and ignores them.
	PutRoutes(ctx context.Context, u Routes) error
	// Ingress is where the node's own ingress listens (errdefs.ErrNotFound:
	// it serves none). A peer's ingress passes a client's connection for
	// a sandbox held here straight to it, unread (internal/ingress,
	// passthrough.go); peers may call it (enrol.peerPath).
	Ingress(ctx context.Context) (IngressInfo, error)
	// Fence tells the node which of its sandboxes are its master's
	// (node.Fence: the rule is there); it returns those it retired.
	Fence(ctx context.Context, req FenceRequest) (FenceResult, error)

	// A live move (node.MoveOut and the rest: the rule is there). The
	// master streams what MoveOut writes on the node a sandbox leaves
	// into MoveIn on the node it goes to, records the move done, then
	// confirms it there (MoveCommit) and deletes the copy it left; or
	// gives it up on both (MoveAbort).

	// MoveOut writes sandbox id to w as the move stream of move gen
	// (checkpointing it first if it runs).
	MoveOut(ctx context.Context, id string, gen int64, w io.Writer) error
	// MoveIn takes the sandbox a move stream brings as move gen: restored
	// (if it ran) but not served until MoveCommit.
	MoveIn(ctx context.Context, gen int64, r io.Reader) (api.Sandbox, error)
	// MoveCommit makes the arrived copy of move gen of sandbox id live.
	MoveCommit(ctx context.Context, id string, gen int64) (api.Sandbox, error)
	// MoveAbort gives move gen of sandbox id up on the node: a copy
	// leaving stays, a copy arriving goes.
	MoveAbort(ctx context.Context, id string, gen int64) error
}

// FenceRequest is a master's fence: Generation is the highest placement
// generation it had handed out when it looked, Keep the IDs it placed on
// the node, InFlight the generations of its creates and clones still
// under way there.
type FenceRequest struct {
	Generation int64    `json:"generation"`
	Keep       []string `json:"keep"`
	InFlight   []int64  `json:"in_flight,omitempty"`
}

// FenceResult says which sandboxes a fence retired.
type FenceResult struct {
	Retired []string `json:"retired"`
}

// CloneRequest is a clone, as a master asks a node for it: the API's,
// and the generation its children carry.
type CloneRequest struct {
	api.CloneRequest
	Generation int64 `json:"generation,omitempty"`
}

// CreateRequest is a create, as a master places it on a node.
type CreateRequest struct {
	Template  api.Template `json:"template"`
	Name      string       `json:"name,omitempty"`
	Principal string       `json:"principal,omitempty"`
	MemoryMiB int          `json:"memory_mib,omitempty"`
	// Note, if set, is the new sandbox's note (a move says what it lost).
	Note string `json:"note,omitempty"`
	// Generation is the master's number for this placement (node.Fence).
	Generation int64 `json:"generation,omitempty"`
	// Idle overrides the node's idle timers for this sandbox.
	Idle *api.IdleTimers `json:"idle,omitempty"`
	// Egress is its own egress rules, in force from its first flow.
	Egress *api.Egress `json:"egress,omitempty"`
	// Secrets are its bound secrets, values and all: the master sends
	// them only over the node's mutual TLS, and the node keeps them
	// sealed (internal/node/secretbind).
	Secrets []inject.Binding `json:"secrets,omitempty"`
}

// Op is a transition a master may ask for.
type Op string

// The transitions.
const (
	Freeze   Op = "freeze"
	Snapshot Op = "snapshot"
	Detach   Op = "detach"
	Wake     Op = "wake"
)

// ParseOp reads a transition's name.
func ParseOp(s string) (Op, bool) {
	switch op := Op(s); op {
	case Freeze, Snapshot, Detach, Wake:
		return op, true
	}
	return "", false
}

// EgressLogOptions say which of a sandbox's egress log to send.
type EgressLogOptions struct {
	After  int64 // flows after this seq
	Limit  int   // at most this many in the first page (0: all kept)
	Follow bool  // then each new flow as it comes
}

// ParseEgressLogOptions reads an egress log's options from a query: after (a
// seq), limit, follow (1 or true).
func ParseEgressLogOptions(q url.Values) (EgressLogOptions, error) {
	var opt EgressLogOptions
	var err error
	if v := q.Get("after"); v != "" {
		if opt.After, err = strconv.ParseInt(v, 10, 64); err != nil || opt.After < 0 {
			return opt, errdefs.New(errdefs.ErrBadInput, "after %q: want a seq, 0 or more", v)
		}
	}
	if v := q.Get("limit"); v != "" {
		if opt.Limit, err = strconv.Atoi(v); err != nil || opt.Limit < 0 {
			return opt, errdefs.New(errdefs.ErrBadInput, "limit %q: want a count, 0 (all) or more", v)
		}
	}
	opt.Follow = q.Get("follow") == "1" || q.Get("follow") == "true"
	return opt, nil
}

// LogOptions say how much of a console log to send.
type LogOptions struct {
	Follow     bool // go on sending what is appended
	Timestamps bool // prefix every line with when it was written
}
