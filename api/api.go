// Package api holds the wire types of the sandstormd HTTP API (docs/API.md).
// Every component that speaks the API (master, CLI, benchmarks, tests) uses
// these types and nothing else, so the JSON names are defined in one place.
package api

import "time"

// Tier is where a sandbox is in the tier ladder of the Sandstorm seed's
// "How it works" table. A sandbox drops one tier at a time as it stays idle,
// and any request takes it straight back to TierHot.
type Tier string

const (
	// TierHot: running; holds its memory.
	TierHot Tier = "hot"
	// TierFrozen: paused in place (runsc pause / cgroup.freeze); holds memory.
	TierFrozen Tier = "frozen"
	// TierSnapshot: checkpointed to the node's disk; processes and network
	// namespace released; holds no memory.
	TierSnapshot Tier = "snapshot"
	// TierDetached: only its volume is left; a wake is a cold start from
	// its template.
	TierDetached Tier = "detached"
)

// Valid reports whether t is one of the four tiers.
func (t Tier) Valid() bool {
	switch t {
	case TierHot, TierFrozen, TierSnapshot, TierDetached:
		return true
	}
	return false
}

// Process is what a template runs: argv, environment (KEY=VALUE) and working
// directory inside the rootfs.
type Process struct {
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// User is who the process runs as, "UID:GID" in numbers ("": root).
	// A template made from an image gets its config's user resolved
	// against the image's own /etc/passwd and /etc/group. With Envd set,
	// envd runs as root and the commands it starts as Envd.User.
	User string `json:"user,omitempty"`
	// Envd, when set, runs the sandbox's envd (commands and files, the
	// E2B API) as its init, with the process as its child: then envd and
	// the commands it runs are in every checkpoint and survive a snapshot.
	// Without it, envd is started in a sandbox on first use, and its
	// commands survive a freeze but not a snapshot (gVisor ends what
	// `runsc exec` started when it restores). docs/ARCHITECTURE.md, "envd".
	Envd *Envd `json:"envd,omitempty"`
}

// Envd is how envd runs in a template's sandboxes.
type Envd struct {
	// User runs commands and owns files when a call names none ("":
	// root).
	User string `json:"user,omitempty"`
	// Workdir is a command's directory when it asks for none ("": the
	// user's home).
	Workdir string `json:"workdir,omitempty"`
}

// TemplateRequest is the body of POST /v1/templates as JSON, or the form
// fields of the multipart variant (field "template" holds this JSON and
// field "rootfs" the tarball; then RootfsDir must be empty).
type TemplateRequest struct {
	Name      string `json:"name"`
	RootfsDir string `json:"rootfs_dir,omitempty"`
	// Image, instead of RootfsDir or an upload, is an OCI image the master
	// pulls and unpacks (docs/TEMPLATES.md). Its config gives what Process,
	// Ports leave empty: Entrypoint + Cmd, Env (Process.Env adds or
	// overrides by key), WorkingDir, User and ExposedPorts.
	Image   *ImageSource `json:"image,omitempty"`
	Process Process      `json:"process"`
	// Ports are the TCP ports the process serves inside the sandbox; each
	// gets a gateway endpoint per sandbox.
	Ports []int `json:"ports"`
	// MemoryMiB is its sandboxes' memory limit in MiB (0: the node's
	// default, --sandbox-memory). Enforced: the sandbox's cgroup limit and
	// the memory gVisor reports to it.
	MemoryMiB int `json:"memory_mib,omitempty"`
	// Principal is who its sandboxes are to their boundary and the mesh,
	// unless a sandbox names its own ("" = each sandbox's name).
	Principal string `json:"principal,omitempty"`
	// Warm, when set, makes the template warm (see Warm).
	Warm *Warm `json:"warm,omitempty"`
	// Serves are the mesh services its sandboxes serve on their ports
	// (see Serve).
	Serves []Serve `json:"serves,omitempty"`
}

// ImageSource is where an image template's rootfs comes from.
type ImageSource struct {
	// Ref is an image in a registry ("host[:port]/repo:tag" or
	// "…@sha256:<hex>"), "oci:DIR" (an OCI image layout) or
	// "docker-archive:FILE" (a `docker save` tarball); the paths are on
	// the master's machine.
	Ref string `json:"ref"`
	// Auth is the registry's credential for this pull only: used, never
	// stored or logged. Without it the master uses its own Docker config
	// (~/.docker/config.json, $DOCKER_CONFIG).
	Auth *RegistryAuth `json:"auth,omitempty"`
}

// RegistryAuth is a registry's username and password (or token).
type RegistryAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// String keeps the password out of anything that prints an ImageSource.
func (a *RegistryAuth) String() string { return "RegistryAuth{" + a.Username + ", ***}" }

// Serve is a mesh service a template's sandboxes serve on one of its
// ports: an MCP server (Kind "mcp", Streamable HTTP at Path) or a model
// (Kind "inference", an OpenAI-compatible API whose base is Path, e.g.
// "/v1"). The node's sam-node publishes Name to the mesh and sends calls
// to it through the node's gateway — so a call from anywhere in the mesh
// wakes the sandbox from any tier, as a request to its port does — to
// whoever the policy grants "<kind>://<name>".
type Serve struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	Port int    `json:"port"`
	Path string `json:"path"`
}

// Warm makes a template warm (the seed's "Sandstorm, warm template"): when
// it is registered, the node starts it once, waits for Probe to answer and
// checkpoints it; from then on each of its sandboxes is created by
// restoring that image, with its own address, hostname, boundary and
// principal, and then reseeded. It is opt-in because every sandbox starts
// from the same memory: whatever the program drew from its random source
// before the checkpoint (a PRNG's seed, a session key) is the same in all
// of them until Reseed runs.
type Warm struct {
	Probe  Probe  `json:"probe"`
	Reseed Reseed `json:"reseed"`
	// Pool is how many of its sandboxes each node keeps restored and
	// paused ahead of demand (0–16, default 0): a create that gives no
	// name takes one and only resumes and reseeds it. Each costs a
	// frozen sandbox's memory; the node gives them up first under
	// memory pressure.
	Pool int `json:"pool,omitempty"`
}

// Probe says when the template's process is ready to be checkpointed: an
// HTTP GET of Path on Port answered 2xx, or with Path empty a TCP connect
// to Port. Port 0 is the template's first port. With Command set, neither:
// the command (absolute path, then its arguments) run inside the sandbox
// as root until it exits 0 — E2B's setReadyCmd, e.g.
// ["/bin/sh", "-c", "test -f /tmp/ready"].
type Probe struct {
	Port    int      `json:"port,omitempty"`
	Path    string   `json:"http_path,omitempty"`
	Command []string `json:"command,omitempty"`
}

// Reseed is what runs in every sandbox right after it is restored from the
// warm image, before it is handed out: Signal (e.g. "SIGUSR1") sent to its
// process, or Command run inside it (absolute path and arguments) to its
// end. Exactly one is set.
type Reseed struct {
	Signal  string   `json:"signal,omitempty"`
	Command []string `json:"command,omitempty"`
}

// Template is a registered template: a rootfs plus an OCI runtime spec
// derived from Process.
type Template struct {
	Name   string `json:"name"`
	Rootfs string `json:"rootfs"`
	// Digest identifies the rootfs across the fleet: the SHA-256 of its
	// tree packed as a tarball ("sha256:<hex>", internal/rootfs.Pack).
	// Each node fetches it from the master once and caches it by this.
	Digest string `json:"digest,omitempty"`
	// Image is the image it was made from, pinned by digest
	// ("ref@sha256:…"), when it was made from one.
	Image string `json:"image,omitempty"`
	// Layers are the image layers its rootfs was flattened from, bottom
	// first, each by the digest of its tree ("sha256:<hex>" of
	// internal/layercache.Pack): a node fetches the layers it lacks and
	// makes the tree from them. Empty for a template from a directory or
	// an upload, whose tree a node fetches whole.
	Layers    []string  `json:"layers,omitempty"`
	Process   Process   `json:"process"`
	Ports     []int     `json:"ports"`
	MemoryMiB int       `json:"memory_mib,omitempty"`
	Principal string    `json:"principal,omitempty"`
	Warm      *Warm     `json:"warm,omitempty"`
	Serves    []Serve   `json:"serves,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// SandboxRequest is the body of POST /v1/sandboxes.
type SandboxRequest struct {
	Template string `json:"template"`
	Name     string `json:"name,omitempty"`
	// Principal overrides the template's principal.
	Principal string `json:"principal,omitempty"`
	// MemoryMiB overrides the template's memory limit (0: the template's,
	// or the node's default).
	MemoryMiB int `json:"memory_mib,omitempty"`
	// Env is added to the environment of every command run in it
	// (sandbox exec, the E2B API's envVars).
	Env map[string]string `json:"env,omitempty"`
	// Labels are the caller's own key/value pairs: listed, shown in the
	// console, and what GET /v1/sandboxes?label=k=v filters by (the E2B
	// API's metadata are the same labels).
	Labels map[string]string `json:"labels,omitempty"`
	// Lifetime ends it this long after its create (a Go duration, "90s",
	// "2h"; "": never): it is deleted then, or with OnTimeout "snapshot"
	// snapshotted (E2B's timeout and autoPause).
	Lifetime  string `json:"lifetime,omitempty"`
	OnTimeout string `json:"on_timeout,omitempty"`
	// Idle overrides the node's idle timers for this sandbox.
	Idle *IdleTimers `json:"idle,omitempty"`
	// Egress narrows what its boundary lets out (nil: the policy alone).
	Egress *Egress `json:"egress,omitempty"`
	// Secrets binds stored secrets to it, environment variable → secret
	// name: the variable holds a marker, never the secret, and its
	// boundary puts the secret in place of the marker only in HTTPS
	// requests to the secret's hosts (docs/API.md, "Secrets").
	Secrets map[string]string `json:"secrets,omitempty"`
}

// Egress is a sandbox's own egress rules, E2B's network allowOut and
// denyOut (internal/sam/egress): deny_out lists CIDRs or addresses
// ("0.0.0.0/0" is all traffic, both families); allow_out lists names
// ("api.example.com", "*.example.com"), addresses and CIDRs that go out
// even so. They only narrow what the policy grants the sandbox's
// principal: a name in allow_out that the policy does not grant is
// refused at create (403), and nothing the policy refuses goes out.
type Egress struct {
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// EgressRouteDNS is an egress log entry's route for a name the boundary's
// DNS refused (NXDOMAIN): a program told "could not resolve" finds why.
const EgressRouteDNS = "dns"

// EgressFlow is one flow a sandbox's boundary allowed or refused: an entry
// of its egress log (GET /v1/sandboxes/{id}/egress, sandbox egress).
type EgressFlow struct {
	// Seq numbers the sandbox's flows from 1, in the order they were
	// decided (a page's next is the last Seq it holds).
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"` // when it was decided
	// Name is the destination as the sandbox named it (a name, or an
	// address it dialled); Port its port.
	Name string `json:"name"`
	Port int    `json:"port"`
	// Addr is the address the boundary connected to (external flows).
	Addr string `json:"addr,omitempty"`
	// Route is external, mesh, service or transparent_unknown, or
	// EgressRouteDNS for a name the boundary's DNS refused (no flow
	// followed; Port is 0); Outcome allowed, denied, unreachable, refused
	// or error.
	Route   string `json:"route"`
	Outcome string `json:"outcome"`
	// Rule is what decided it: "policy" (and the sandbox's own rule, if
	// it has rules) for an allowed flow, the refusal's reason otherwise.
	Rule string `json:"rule"`
	// BytesOut and BytesIn are what the flow carried, sandbox → far and
	// back (external flows; mesh requests are sam-node's to count).
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	// Secrets are the names of the secrets the boundary put into its
	// requests in the sandbox's place (a TLS flow to a secret's host).
	Secrets []string `json:"secrets,omitempty"`
}

// EgressPage is a page of a sandbox's egress log: its flows after the
// asked seq, oldest first, and Next, the seq to ask after for the next
// page. Missed counts flows after the asked seq that the log's bound
// already dropped. End is set on the last page of a followed log that
// ended because its sandbox left the node that kept it (EgressEndGone);
// a followed log that stops without it was cut (its daemon stopped or
// reloaded), and its reader may go on after Next.
type EgressPage struct {
	Items  []EgressFlow `json:"items"`
	Next   int64        `json:"next"`
	Missed int64        `json:"missed,omitempty"`
	End    string       `json:"end,omitempty"`
}

// EgressEndGone is EgressPage.End when the sandbox was deleted, or moved
// (a moved sandbox's log starts again on its new node).
const EgressEndGone = "gone"

// IdleTimers are how long a sandbox may stay idle before it drops a tier
// (Go durations, "30s"; "0" never): hot → frozen, frozen → snapshot,
// snapshot → detached. A field left out keeps the node's own
// (sandstormd serve --freeze-after and the others).
type IdleTimers struct {
	FreezeAfter   string `json:"freeze_after,omitempty"`
	SnapshotAfter string `json:"snapshot_after,omitempty"`
	DetachAfter   string `json:"detach_after,omitempty"`
}

// CloneRequest is the body of POST /v1/sandboxes/{id}/clone.
type CloneRequest struct {
	// Count is how many children to make (1-100).
	Count int `json:"count"`
	// Principal is the children's principal ("" = the parent's principal
	// with ".<n>" appended, n the child's number).
	Principal string `json:"principal,omitempty"`
	// Reseed is run in every child right after its restore (default: the
	// template's warm reseed). One of them is required: children start
	// from the parent's memory, random state included.
	Reseed *Reseed `json:"reseed,omitempty"`
	// Idle overrides the node's idle timers for the children (nil: the
	// node's). A snapshot (E2B's) is a child never detached, so that
	// what is made from it has its memory.
	Idle *IdleTimers `json:"idle,omitempty"`
}

// Snapshot is a sandbox's snapshot (E2B's createSnapshot): a copy of it,
// memory and files, kept in the snapshot tier on its node, from which
// sandboxes are made with that memory (POST /v1/snapshots/{id}/sandboxes).
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Of        string    `json:"of"` // the sandbox it was taken of
	Team      string    `json:"team,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotRequest is POST /v1/sandboxes/{id}/snapshots' body (optional).
type SnapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// PauseRequest is POST /v1/sandboxes/{id}/pause's body (optional).
type PauseRequest struct {
	// Memory false keeps its files only (the detached tier): a resume
	// cold-boots it. Default true: the snapshot tier, processes and all.
	Memory *bool `json:"memory,omitempty"`
}

// CloneResult is what a clone made.
type CloneResult struct {
	Parent   Sandbox   `json:"parent"`
	Children []Sandbox `json:"children"`
	// ParentPauseMs is how long the parent was paused (its checkpoint and
	// the copy of its volume); ChildMs how long each child took, restore
	// and reseed included.
	ParentPauseMs float64   `json:"parent_pause_ms"`
	ChildMs       []float64 `json:"child_ms"`
}

// Sandbox is what GET /v1/sandboxes/{id} returns.
type Sandbox struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Template string `json:"template"`
	Node     string `json:"node"`
	Backend  string `json:"backend"`
	Tier     Tier   `json:"tier"`
	// Transition is the tier a transition in progress is heading to, or "".
	Transition Tier `json:"transition,omitempty"`
	// Address is the sandbox's own address on its veth (stable across
	// snapshot and restore).
	Address string `json:"address"`
	// Endpoints maps each template port ("8000") to the gateway URL that
	// reaches it ("http://127.0.0.1:20001"); a request there wakes the
	// sandbox from any tier.
	Endpoints map[string]string `json:"endpoints"`
	// HostEndpoints are the same ports on the node's Host-routed listener
	// ("http://8000-<name>.sandbox.localhost:8090"), when it has one
	// (sandstormd serve --gateway-host-listen): HTTP only.
	HostEndpoints map[string]string `json:"host_endpoints,omitempty"`
	LastActive    time.Time         `json:"last_active"`
	CreatedAt     time.Time         `json:"created_at"`
	// LastWakeMs is how long the last wake took, in milliseconds, and
	// LastWakeFrom the tier it woke from; before any wake, LastWakeMs is
	// how long the create took and LastWakeFrom is empty.
	LastWakeMs   float64 `json:"last_wake_ms,omitempty"`
	LastWakeFrom Tier    `json:"last_wake_from,omitempty"`
	// Principal is who the sandbox is: its boundary decides every flow
	// for this principal under the node's policy.
	Principal string `json:"principal"`
	// Boundary is the host-side Unix socket of its boundary (SOCKS5 and
	// HTTP CONNECT), for tools on the node such as sam-bench.
	Boundary string `json:"boundary,omitempty"`
	// MemoryMiB is its memory limit (its own, its template's or the node's
	// default), enforced by its cgroup.
	MemoryMiB int `json:"memory_mib,omitempty"`
	// Labels, EndsAt and OnTimeout are what its create asked
	// (SandboxRequest); Team is the team that owns it ("": the operator).
	Labels    map[string]string `json:"labels,omitempty"`
	Idle      *IdleTimers       `json:"idle,omitempty"`
	Egress    *Egress           `json:"egress,omitempty"`
	EndsAt    *time.Time        `json:"ends_at,omitempty"`
	OnTimeout string            `json:"on_timeout,omitempty"`
	Team      string            `json:"team,omitempty"`
	// Note says what the node last had to do that a caller should know
	// (e.g. a failed checkpoint re-created the sandbox cold).
	Note string `json:"note,omitempty"`
	// Generation is the number of the master's placement that made it
	// (docs/ARCHITECTURE.md, "One place"): its node fences by it.
	Generation int64 `json:"generation,omitempty"`
	// Paused: someone paused it (POST .../pause, E2B's pause): it stays
	// in its tier until a resume, not only until traffic comes.
	Paused bool `json:"paused,omitempty"`
	// Revision counts the changes its node made to it: of two accounts
	// of one sandbox from one node, the higher is the newer.
	Revision int64 `json:"revision,omitempty"`
	// LeftBehind: its master had not placed it on its node (a create cut
	// short, a move while the node was lost). It never runs again: it
	// was stopped, its principal cleared, and it is kept detached only
	// for the files in its volume; delete it by its ID.
	LeftBehind bool `json:"left_behind,omitempty"`
	// Runsc is the runsc build its memory belongs to (RunscBuild.Key):
	// the one it runs on, or that wrote its snapshot; "" when detached.
	Runsc string `json:"runsc,omitempty"`
	// Moving is set while a live move of it is under way: "leaving" on the
	// node it is leaving (it is not served there meanwhile), "arriving" on
	// the one it goes to (not served until the master confirms it); the
	// master's list shows the side its placement is on.
	Moving string `json:"moving,omitempty"`
	// MoveGeneration is, while it is leaving, the generation of the move
	// taking it.
	MoveGeneration int64 `json:"move_generation,omitempty"`
}

// Moving values of a Sandbox.
const (
	MovingOut = "leaving"
	MovingIn  = "arriving"
)

// MoveRequest is the body of POST /v1/sandboxes/{id}/move (optional): To
// names the node it goes to (default: the one placement picks).
type MoveRequest struct {
	To string `json:"to,omitempty"`
}

// DrainEvent is one line of POST /v1/nodes/{name}/drain's answer (JSON
// lines): a sandbox moved (or not, with Error), then a last line with
// Done set.
type DrainEvent struct {
	Sandbox string  `json:"sandbox,omitempty"`
	ID      string  `json:"id,omitempty"`
	From    string  `json:"from,omitempty"`
	To      string  `json:"to,omitempty"`
	Tier    Tier    `json:"tier,omitempty"`
	Ms      float64 `json:"ms,omitempty"`
	Error   string  `json:"error,omitempty"`
	// Done ends the answer: Moved and Failed count its lines, Left what
	// is still on the node.
	Done   bool `json:"done,omitempty"`
	Moved  int  `json:"moved,omitempty"`
	Failed int  `json:"failed,omitempty"`
	Left   int  `json:"left,omitempty"`
}

// List is the envelope of every list response: {"items": [...]}.
type List[T any] struct {
	Items []T `json:"items"`
}

// Error is the body of every error response.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes, one per HTTP status family the API returns.
const (
	CodeBadRequest   = "bad_request"        // 400
	CodeUnauthorized = "unauthorized"       // 401
	CodeForbidden    = "forbidden"          // 403: e.g. a pairing with a wrong code
	CodeNotFound     = "not_found"          // 404
	CodeConflict     = "conflict"           // 409
	CodeTooLarge     = "too_large"          // 413
	CodeUnavailable  = "unavailable"        // 503
	CodeStandby      = "standby"            // 503: this master stands by; another leads
	CodeInternal     = "internal"           // 500
	CodeNodeDown     = "node_down"          // 503 with Retry-After: the sandbox's node does not answer (or stopped answering mid-call)
	CodeNotSupported = "not_supported"      // 409: the backend lacks the tier
	CodeExists       = "exists"             // 409: the name or ID is taken
	CodeTimeout      = "timeout"            // 504: it did not finish in time, and did not happen
	CodePrecondition = "precondition"       // 412: the callee lacks what the call needs first (a node without a rootfs)
	CodeMethod       = "method_not_allowed" // 405: the path is served, not with this method
	CodeUpstream     = "upstream"           // 502: what the server called for the caller failed
)

// TierLost marks, in a list, a sandbox whose node does not answer: what
// it is doing is not known until the node is back.
const TierLost Tier = "lost"

// NodeRequest is POST /v1/nodes: pair the node listening at Address
// (host:port, its --node-listen) that holds PairingCode.
type NodeRequest struct {
	Address     string `json:"address"`
	PairingCode string `json:"pairing_code"`
}

// JoinToken is POST /v1/nodes/join-tokens: what a node behind NAT needs
// to join (Command spells it out).
type JoinToken struct {
	Token         string    `json:"token"`
	ExpiresAt     time.Time `json:"expires_at"`
	CAFingerprint string    `json:"ca_fingerprint"`
	Command       string    `json:"command"`
}

// NodeStatus is GET /v1/node: the node's headroom as the memory guard sees it.
type NodeStatus struct {
	Name            string       `json:"name"`
	Backend         string       `json:"backend"`
	MemAvailableMiB int64        `json:"mem_available_mib"`
	MemReserveMiB   int64        `json:"mem_reserve_mib"`
	Sandboxes       map[Tier]int `json:"sandboxes"`
	// Reconciling is how many sandboxes the node is still repairing after
	// a restart (their transitions wait until it is done with each).
	Reconciling int `json:"reconciling"`
	// WarmPool is how many sandboxes each warm template's pool holds
	// (restored and paused ahead of demand; not in Sandboxes).
	WarmPool map[string]int `json:"warm_pool"`
	// Runsc is every runsc build the node keeps, and why: the current
	// one, and each older one that sandboxes still run on or that wrote
	// snapshots still on disk (an image restores only on the build that
	// wrote it).
	Runsc []RunscBuild `json:"runsc,omitempty"`
	// PromisedMiB is what sandboxes admitted but still starting have yet
	// to take: placement counts it as used.
	PromisedMiB int64 `json:"promised_mib"`
	// Transitions is how many transitions have ended in each tier on the
	// node since it started, those that reached it ("hot": wakes): its
	// sandstorm_transitions_total{outcome="ok"} summed by "to" (the
	// console charts their rates).
	Transitions map[Tier]uint64 `json:"transitions,omitempty"`
	// State is "ready", or "lost" when the master cannot reach the node
	// (GET /v1/nodes); Address is a paired node's seam address.
	State   string `json:"state,omitempty"`
	Address string `json:"address,omitempty"`
	// Error says why a lost node is lost.
	Error string `json:"error,omitempty"`
	// Draining: the master places nothing new on it (node drain); it is
	// drained once it holds no sandbox the master placed.
	Draining bool `json:"draining,omitempty"`
}

// RunscBuild is a runsc build a node keeps (NodeStatus.Runsc).
type RunscBuild struct {
	// Key is "<version>-<first 16 hex digits of its SHA-256>": two builds
	// that claim one version are two keys.
	Key     string `json:"key"`
	Version string `json:"version,omitempty"`
	SHA256  string `json:"sha256,omitempty"`
	// Current: new sandboxes and cold starts run on it.
	Current bool `json:"current,omitempty"`
	// Running is how many sandboxes run on it (hot or frozen), Images how
	// many of their snapshots it wrote (only it restores them).
	Running int `json:"running"`
	Images  int `json:"images"`
	// Why says in words why it is kept.
	Why string `json:"why"`
	// Missing: sandboxes need it but the node does not have it (removed
	// by hand, or refused because its bytes changed since it was kept):
	// they are started cold instead.
	Missing bool `json:"missing,omitempty"`
}

// APIKeyRequest is the body of POST /v1/api-keys.
// SecretCAPath is where a sandbox created with secrets finds its own CA,
// the one its boundary ends TLS to a secret's hosts with; it is in the
// sandbox's system trust store too.
const SecretCAPath = "/usr/local/share/ca-certificates/sandstorm-egress-ca.crt"

// SecretRequest stores a secret (POST /v1/secrets): its value, and the
// only names it may be sent to ("api.example.com", "*.example.com").
// Storing a name again replaces it; sandboxes made before keep the value
// they were given. Body: its marker is replaced in request bodies too
// (a form's client_secret), not only in headers, path and query; off by
// default, as a service can keep a body and show it back (docs/API.md).
type SecretRequest struct {
	Name  string   `json:"name"`
	Value string   `json:"value"`
	Hosts []string `json:"hosts"`
	Body  bool     `json:"body,omitempty"`
}

// Secret is a stored secret as listed: never its value.
type Secret struct {
	Name      string    `json:"name"`
	Team      string    `json:"team,omitempty"`
	Hosts     []string  `json:"hosts"`
	Body      bool      `json:"body,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

type APIKeyRequest struct {
	Team string `json:"team"`
}

// APIKey is a team's API key as listed: never the key itself, which is
// in Key only in the answer to its creation (it is kept as a hash).
type APIKey struct {
	ID        string    `json:"id"`
	Team      string    `json:"team"`
	Last4     string    `json:"last4"`
	CreatedAt time.Time `json:"created_at"`
	Key       string    `json:"key,omitempty"`
}

// Event is one thing that happened to a sandbox.
type Event struct {
	Seq  uint64    `json:"seq"`
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	ID   string    `json:"id,omitempty"`
	Name string    `json:"name,omitempty"`
	// From and To are tiers: a transition's, a wake's from ("to" hot); a
	// create's To is hot.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// Ms is how long it took, on the node.
	Ms float64 `json:"ms,omitempty"`
	// Node is where it happened; Template what it is of (creates).
	Node     string `json:"node,omitempty"`
	Template string `json:"template,omitempty"`
	// Reason says why (a refusal, a note).
	Reason string `json:"reason,omitempty"`
}

// BuildRequest is the "build" part of POST /v1/templates/{name}/build
// (multipart: this JSON, then the build context as a tarball in part
// "context", plain or gzip; no context part is an empty context).
type BuildRequest struct {
	// Dockerfile is the Dockerfile's text.
	Dockerfile string `json:"dockerfile"`
	// BuildArgs are the --build-arg values.
	BuildArgs map[string]string `json:"build_args,omitempty"`
	// Target is the stage to build ("": the last).
	Target string `json:"target,omitempty"`
	// Template is the template made of the result: its process and ports
	// override the built image's config where set; its name is the path's,
	// and rootfs_dir and image must be empty.
	Template TemplateRequest `json:"template"`
}

// BuildEvent is one line of a build's answer (newline-delimited JSON):
// output as it comes, then the template made or the error that ended it.
type BuildEvent struct {
	Log      string    `json:"log,omitempty"`
	Template *Template `json:"template,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}
