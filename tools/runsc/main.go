// Command runsc is gVisor's runsc at the version go.mod pins, with one
// change to how its two long-lived processes use memory.
//
// A sandbox's sentry (`runsc boot`) and gofer (`runsc gofer`) are Go
// programs that allocate most of what they ever will while they start (the
// seccomp filters they build, the config, the loader; after a restore, the
// decoded state), and then mostly sit idle, as most sandboxes do here. Go
// returns freed heap to the kernel only down to about its heap goal, which
// startup left high, and an idle process never collects again to lower it:
// measured here, an idle web sandbox's sentry kept 8.7 MiB anonymous and
// its gofer 5.5 MiB, and neither shrank in the next 135 s. So once each has
// settled it collects and returns what is free, once (bench/README,
// "Memory per idle sandbox": −1.2 MiB gofer, −0.6 MiB sentry, −1.0 MiB
// sentry after a restore). Lower GC percentages were measured too and
// bought less than this while costing every busy sandbox CPU.
//
// runsc clears the environment of the processes it starts, so this cannot
// be asked for with GOGC or GODEBUG; it is built in instead.
package main

import (
	"os"
	"runtime/debug"
	"time"

	"gvisor.dev/gvisor/runsc/cli/maincli"
	"gvisor.dev/gvisor/runsc/version"
)

var _ = version.Version()

// settle is how long after it starts a sentry or gofer returns its free
// heap: past a cold start (≈0.5 s here) and a restore (≈0.4 s), with room
// for a slow machine, and short beside the 2 s and more before a sandbox
// is idle enough to freeze.
const settle = 5 * time.Second

func main() {
	if longLived(os.Args[1:]) {
		time.AfterFunc(settle, debug.FreeOSMemory)
	}
	maincli.Main()
}

// longLived reports whether args run a sandbox's sentry or gofer: the
// subcommand is the first argument that is not a flag (runsc's flags are
// all --name=value when runsc starts these two).
func longLived(args []string) bool {
	for _, a := range args {
		if len(a) > 0 && a[0] == '-' {
			continue
		}
		return a == "boot" || a == "gofer"
	}
	return false
}
