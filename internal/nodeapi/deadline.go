package nodeapi

import (
	"time"

	"sandstorm/internal/sandbox"
)

// How long a master waits for a node to answer each kind of call (issue
// 14: "every call to a node has a deadline of its kind"). Each is the
// node's own bound on the work — the runtime's deadlines
// (internal/sandbox/deadline.go), which the node's backend enforces
// whatever its caller does — plus callMargin for the node's own steps (its store,
// the netns, the gateway) and the network. A call past its deadline is
// not known to have failed: the node may still finish it, and its
// report then says so (fleet). A node the master takes for lost fails
// its calls at once, before any of these.
const (
	// ReadDeadline bounds a read (a sandbox, a status): no runsc.
	ReadDeadline = 5 * time.Second
	// FenceDeadline bounds a fence: store writes only (node.Fence stops
	// what it retires after it answers).
	FenceDeadline = 10 * time.Second
	// TemplateDeadline bounds preparing a template (a warm one's first
	// start, its probe and checkpoint; its tree flattened from its
	// layers) and sending a rootfs or one layer.
	TemplateDeadline = 10 * time.Minute
	// callMargin is what each deadline allows on top of runsc's.
	callMargin = 15 * time.Second
	// admission is the longest a node holds a create or wake before its
	// work starts: waiting for memory or a wake slot (node.Config.Admission,
	// 2 s by default), for a start slot (MaxStarts), or for the sandbox's
	// lock, which a transition under way holds up to 30 s.
	admission = 30 * time.Second
)

// memoryTime is what a checkpoint or restore of memMiB may take
// (sandbox.CheckpointBase + the memory at sandbox.CheckpointRate).
func memoryTime(memMiB int) time.Duration {
	if memMiB <= 0 {
		memMiB = sandbox.FallbackMemory >> 20
	}
	return sandbox.CheckpointBase + time.Duration(int64(memMiB)<<20/sandbox.CheckpointRate)*time.Second
}

// CreateDeadline bounds a create of a sandbox of memMiB: admission, a run
// or a restore of a warm image, and the clean-up of one that failed.
func CreateDeadline(memMiB int) time.Duration {
	return admission + max(sandbox.RunTimeout, memoryTime(memMiB)) + sandbox.RemoveTimeout + callMargin
}

// TransitionDeadline bounds a freeze, snapshot, detach or wake: the wait
// for the sandbox's lock, then a checkpoint, or a restore that fails and
// is re-created cold.
func TransitionDeadline(memMiB int) time.Duration {
	return admission + memoryTime(memMiB) + sandbox.RunTimeout + sandbox.RemoveTimeout + callMargin
}

// DeleteDeadline bounds a delete: a transition that holds the sandbox
// finishes first, then the removal.
func DeleteDeadline(memMiB int) time.Duration {
	return TransitionDeadline(memMiB) + sandbox.RemoveTimeout
}

// CloneDeadline bounds a clone of count children of a memMiB parent: its
// checkpoint, then each child's restore.
func CloneDeadline(memMiB, count int) time.Duration {
	return admission + memoryTime(memMiB) + time.Duration(max(count, 1))*(memoryTime(memMiB)+callMargin) + callMargin
}

// MoveVolumeAllowance is what a live move allows for its volume on top
// of its image: a volume's size is not known until the stream says it.
const MoveVolumeAllowance = 5 * time.Minute

// MoveDeadline bounds each stream of a live move of a memMiB sandbox
// (MoveOut on the node it leaves, MoveIn on the one it goes to): a wait
// for its lock or for memory, its checkpoint, its image copied and its
// restore (each at the runsc rate of memoryTime), a run's worth of
// margin, and MoveVolumeAllowance for its volume.
func MoveDeadline(memMiB int) time.Duration {
	return admission + 3*memoryTime(memMiB) + sandbox.RunTimeout + MoveVolumeAllowance + callMargin
}
