// Package sandbox defines the interface between the node (which knows about
// tiers, networks and the gateway) and a sandbox runtime (which only knows
// how to run, pause, checkpoint and remove one OCI bundle). Backends know
// nothing of tiers: the tier manager composes these calls into the seed's
// hot → frozen → snapshot → detached ladder.
package sandbox

import (
	"context"

	"sandstorm/internal/errdefs"
)

// A backend returns errdefs.ErrNotSupported for an operation it cannot do
// on this machine (e.g. checkpoint in the process backend, where criu
// fails).

// ErrNotFound is returned when the backend has no container with that ID.
var ErrNotFound = errdefs.Refine(errdefs.ErrNotFound, "container not found")

// State is what a backend reports for one container.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	// StateStopped: the container exists but its processes are gone.
	StateStopped State = "stopped"
	// StateAbsent: the backend has no record of the container.
	StateAbsent State = "absent"
)

// Spec is what a backend needs to start one container.
type Spec struct {
	// ID is the container ID (also the sandbox ID); [a-z0-9-], ≤ 63 chars.
	ID string
	// Bundle is an OCI bundle directory: config.json (runtime-spec) plus
	// the rootfs it names. The backend may rewrite config.json.
	Bundle string
	// Netns is the path of the network namespace the container joins
	// (e.g. /var/run/netns/ss-<id>). Created and owned by the caller.
	Netns string
	// LogPath is a file that receives the container's stdout and stderr.
	LogPath string
	// Runtime, when set, is the runtime binary every command for this
	// container runs (gvisor: the runsc build its memory belongs to,
	// internal/runtimes); "" is the backend's own.
	Runtime string
}

// Capabilities says which tiers a backend can implement on this machine.
type Capabilities struct {
	Pause      bool `json:"pause"`
	Checkpoint bool `json:"checkpoint"`
	// Why says in words why a capability is missing.
	Why string `json:"why,omitempty"`
}

// Backend runs containers. Every method is safe for concurrent use on
// different IDs; the caller serialises calls for one ID. Every method takes
// the full Spec because runsc's control socket is an abstract Unix socket
// that lives in the container's network namespace: a command for it must
// run there, so the backend needs Netns even to ask for its state.
type Backend interface {
	// Name is "gvisor" or "process".
	Name() string
	Capabilities() Capabilities
	// Start creates and starts a container from spec; when it returns nil
	// the container's init process is running.
	Start(ctx context.Context, spec Spec) error
	// Pause stops every process of a running container in place; Resume
	// undoes it.
	Pause(ctx context.Context, spec Spec) error
	Resume(ctx context.Context, spec Spec) error
	// Checkpoint saves the container's whole state into imageDir (which
	// must exist and be empty) and stops it. On error the container may
	// be gone too (gVisor kills it when a save fails): callers must check
	// State afterwards.
	Checkpoint(ctx context.Context, spec Spec, imageDir string) error
	// Restore starts spec's container from an image written by Checkpoint.
	Restore(ctx context.Context, spec Spec, imageDir string) error
	// Remove kills and deletes the container; removing an absent one is
	// not an error.
	Remove(ctx context.Context, spec Spec) error
	// State reports the container's state.
	State(ctx context.Context, spec Spec) (State, error)
	// List returns the IDs of every container this backend has a record
	// of, for reconciliation after a restart.
	List(ctx context.Context) ([]string, error)
}

// CheckpointLeaver is implemented by backends whose Checkpoint ends by
// removing the container it stopped (gvisor: runsc delete, which waits for
// the sandbox process to go: ≈ 30 ms here). CheckpointLeaving saves the
// image exactly as Checkpoint does — complete when it returns nil — and
// leaves the stopped container for the caller's Remove, so the node can
// answer before that removal (internal/node: checkpoint).
type CheckpointLeaver interface {
	CheckpointLeaving(ctx context.Context, spec Spec, imageDir string) error
}

// Reclaimer is implemented by backends that can push a paused container's
// memory out to swap (zswap when enabled): the seed's frozen tier "squeezes
// its cold pages into zswap". Before and After are the container's memory
// cgroup usage in bytes.
type Reclaimer interface {
	Reclaim(ctx context.Context, spec Spec) (before, after int64, err error)
}

// InFlightWaiter is implemented by backends whose commands can outlive the
// daemon that started them (runsc checkpoint and restore run on after a
// kill -9 of sandstormd). Reconcile calls WaitInFlight first, so it reads
// the state those commands leave rather than a state they are still
// changing.
type InFlightWaiter interface {
	WaitInFlight(ctx context.Context) error
}

// BinaryRuntime is implemented by backends whose runtime is a binary that
// checkpoint images are tied to (gvisor: runsc, whose image restores only
// on the build that wrote it). The node keeps a copy of every build it
// has used (internal/runtimes), runs the backend from the current one's
// copy (UseBinary), and each container with the build its memory belongs
// to (Spec.Runtime).
type BinaryRuntime interface {
	// Binary is the runtime binary the backend was configured with.
	Binary() string
	// UseBinary makes path, a copy of Binary, the one the backend runs.
	UseBinary(path string)
	// VersionOf is the version the binary at path says it is.
	VersionOf(ctx context.Context, path string) (string, error)
}
