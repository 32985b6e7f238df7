// Command baselines puts sandstormd beside what a user would run instead,
// measured in one run on this machine with one harness (issue 34; the
// Sandstorm seed's two baseline tables): a plain process, bubblewrap,
// Podman (crun), Docker (runc), Docker and Podman with gVisor (the pinned
// runsc, registered as a runtime of the benchmark's own engine), and
// sandstormd with every sandbox awake (cold-started, and from a warm
// template) and with idle ones tiered. Each
// runs the seed's two programs — the demo web server and the 64 MiB numpy
// app — from the same rootfs.
//
// For each runtime and program it measures, in this order:
//   - start → first answer, one copy at a time, polled every 50 ms as the
//     seed polled, and on the gateway's dial schedule (-n each);
//   - density: copies started one after another, each waited for, until
//     MemAvailable has dropped by --budget-mib (the seed's 1.9 GB node
//     kept 512 MiB back: 1,400 MiB), then how many of them still answer.
//     Tiered (from a warm template), the node holds up to --tiered-count, and --pick of them,
//     chosen at random, are called once the rest have gone idle.
//
// Every engine runs with state of its own under the run's work directory
// (a dockerd of its own with its own socket and data root, Podman with its
// own --root), so the host's daemons, images and runtime registrations
// are neither used nor changed, and nothing is left when it ends.
//
//	sudo make bench-baselines-deps     # docker.io, podman, crun, bubblewrap, criu
//	sudo go run ./bench/baselines      # every runtime, both programs
//	sudo go run ./bench/baselines --runtimes process,sandstormd --max-copies 3 -n 3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sandstorm/internal/bench"
)

// allRuntimes are the rows, in the tables' order.
var allRuntimes = []string{"process", "bwrap", "podman-crun", "podman-runc", "docker-runc", "docker-runsc", "podman-runsc", "sandstormd", "sandstormd-warm", "sandstormd-tiered"}

type config struct {
	runtimes, programs []string
	n                  int
	budgetMiB          int64
	maxCopies          int
	tieredCount, pick  int
	runsc              string
	rootfs             map[string]string // a program's rootfs given, not built
	subnet, gwPorts    string
	timers             bench.IdleTimers
	idleWait           time.Duration
	daemonLogLevel     string
	bench.Flags
}

func main() {
	var c config
	var runtimes, programs, rootfs string
	fs := flag.NewFlagSet("baselines", flag.ContinueOnError)
	fs.StringVar(&runtimes, "runtimes", strings.Join(allRuntimes, ","), "the runtimes to measure, of "+strings.Join(allRuntimes, ","))
	fs.StringVar(&programs, "programs", "web,app64", "the programs: web (the demo's Python HTTP server), app64 (the same with a 64 MiB numpy heap)")
	fs.StringVar(&rootfs, "rootfs", "", "use these demo rootfs directories instead of building them, as web=DIR,app64=DIR (e.g. a test's)")
	fs.IntVar(&c.n, "n", 20, "start → first answer samples per runtime, program and poll")
	fs.Int64Var(&c.budgetMiB, "budget-mib", 1400, "the memory each runtime may use: copies are started until MemAvailable has dropped this much")
	fs.IntVar(&c.maxCopies, "max-copies", 0, "stop density at this many copies (0: only the memory budget stops it)")
	fs.IntVar(&c.tieredCount, "tiered-count", 200, "copies the tiered sandstormd is given (the memory budget may stop it first)")
	fs.IntVar(&c.pick, "pick", 50, "tiered: copies called at random once the rest are idle")
	fs.StringVar(&c.runsc, "runsc", "bin/runsc", "runsc binary (make runsc), for sandstormd and registered with Docker and Podman")
	fs.StringVar(&c.subnet, "subnet", "10.151.0.0/16", "sandstormd's sandbox subnet; must be unused on this host")
	fs.StringVar(&c.gwPorts, "gateway-ports", "21000-30999", "sandstormd's gateway ports")
	fs.DurationVar(&c.idleWait, "idle-wait", 0, "after density, measure the copies again once idle this long (and sandstormd's again after a snapshot and a wake); 0: not at all")
	fs.StringVar(&c.daemonLogLevel, "daemon-log-level", "warn", "sandstormd's --log-level (its log is kept beside the results); info logs every transition, to find why a wake failed")
	c.timers.Register(fs, "the tiered sandstormd's")
	c.Flags.Register(fs)
	bench.ParseFlags(fs, func() error {
		c.runtimes, c.programs = splitList(runtimes), splitList(programs)
		c.rootfs = map[string]string{}
		for _, kv := range splitList(rootfs) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || (k != "web" && k != "app64") || v == "" {
				return fmt.Errorf("--rootfs %q: want web=DIR or app64=DIR", kv)
			}
			c.rootfs[k] = v
		}
		for _, r := range c.runtimes {
			if !slices.Contains(allRuntimes, r) {
				return fmt.Errorf("unknown runtime %q: want some of %s", r, strings.Join(allRuntimes, ","))
			}
		}
		for _, p := range c.programs {
			if p != "web" && p != "app64" {
				return fmt.Errorf("unknown program %q: want web, app64 or both", p)
			}
		}
		if c.n < 1 || c.budgetMiB < 1 || c.maxCopies < 0 || c.tieredCount < 1 || c.pick < 0 || len(c.runtimes) == 0 || len(c.programs) == 0 {
			return bench.ErrBadArguments
		}
		return nil
	})
	bench.Main("baselines", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func run(ctx context.Context, c config) (string, error) {
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/baselines",
		Title: "Side by side: density and start → first answer against a plain process, bubblewrap, Podman, Docker and Docker + gVisor",
		Out:   c.Out, Repo: c.Repo, Prefix: "baselines-", Runsc: c.runsc, Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer br.Close()
	res := br.Results
	res.Params = map[string]any{"runtimes": c.runtimes, "programs": c.programs, "n": c.n, "budget_mib": c.budgetMiB,
		"max_copies": c.maxCopies, "tiered_count": c.tieredCount, "pick": c.pick, "timers": c.timers}
	m := &measurer{c: c, br: br, versions: map[string]string{}}
	for _, name := range c.programs {
		if ctx.Err() != nil {
			break
		}
		prog, err := buildProgram(name, filepath.Join(br.Work, "rootfs-"+name), c.rootfs[name])
		if err != nil {
			return "", err
		}
		for _, rt := range c.runtimes {
			if ctx.Err() != nil {
				break
			}
			m.measure(ctx, rt, prog)
			br.Dir.Write(res)
		}
	}
	res.Params["versions"] = m.versions
	res.Params["criu_check"] = criuCheck(ctx)
	res.Tables = append(res.Tables, m.densityTable(), m.breakdownTable(), m.startTable())
	path, err := br.Dir.Done(res)
	if err == nil {
		err = ctx.Err()
	}
	return path, err
}

// newRuntime makes the runtime named name for this run.
func (m *measurer) newRuntime(name string) runtime {
	work := m.br.Work
	switch name {
	case "process":
		return &plain{}
	case "bwrap":
		return &bwrap{}
	case "sandstormd", "sandstormd-warm", "sandstormd-tiered":
		// Cold starts the program from its rootfs, as every other
		// runtime does; warm (and tiered, as bench/fill runs it)
		// restores an image of it already answering.
		return &sandstormd{bin: m.br.Binary.Path, runsc: m.br.Runsc, work: work, logDir: m.br.Dir.Path,
			tiered: name == "sandstormd-tiered", warm: name != "sandstormd", timers: m.c.timers, subnet: m.c.subnet, gwPorts: m.c.gwPorts, logLevel: m.c.daemonLogLevel}
	}
	kind, rt, _ := strings.Cut(name, "-")
	return newEngine(kind, rt, m.br.Runsc, work)
}

// settleFor is how long density waits after a copy first answers before
// it reads memory: the program's heap is filled before it listens, but
// a runtime may still be finishing its own start.
const settleFor = 200 * time.Millisecond

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// criuCheck is what `criu check` says on this machine: whether CRIU's
// checkpoint and restore (Podman's container checkpoint) can run here at
// all, and if not, exactly why.
func criuCheck(ctx context.Context) string {
	if _, err := exec.LookPath("criu"); err != nil {
		return "criu is not installed (make bench-baselines-deps)"
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "criu", "check").CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return fmt.Sprintf("criu check failed (%v): %s", err, text)
	}
	return text
}
