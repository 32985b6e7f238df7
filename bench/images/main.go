// Command images measures templates from OCI images (issue 32) beside
// the tools people use for the same today, in one run: the pull and
// unpack of a 100 MiB and a 500 MiB image from a registry on loopback
// (sandstormd's template create --image against skopeo copy + umoci
// unpack), a Dockerfile build cold and fully cached (template build
// against podman build, RUN in runsc for both), and create → first
// answer from an image template, cold and warm, against podman run with
// the same runsc. It starts its own sandstormd, registry and podman
// storage, in namespaces of its own (--isolate), and leaves the machine
// as it found it. Results go to bench/results/images-<date>-<commit>.
//
//	go run ./bench/images -n 5
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"sandstorm/internal/bench"
	"sandstorm/internal/client"
	"sandstorm/internal/demo"
)

type config struct {
	bench.Flags
	n                 int
	sizes             []int
	layerMiB          int
	parts             string
	runsc             string
	subnet, gwPorts   string
	isolate, baseline bool
}

func main() {
	var c config
	sizes := "100,500"
	fs := flagSet(&c, &sizes)
	bench.ParseFlags(fs, func() error {
		var err error
		c.sizes, err = parseSizes(sizes)
		if err != nil || c.n < 1 || c.layerMiB < 1 {
			return fmt.Errorf("%w (--sizes %q: %v)", bench.ErrBadArguments, sizes, err)
		}
		for _, p := range strings.Split(c.parts, ",") {
			if !slices.Contains(allParts, p) {
				return fmt.Errorf("%w: --parts takes %s", bench.ErrBadArguments, strings.Join(allParts, ","))
			}
		}
		return nil
	})
	if c.isolate && os.Getenv(bench.IsolatedEnv) == "" {
		os.Exit(bench.ReexecIsolated("images"))
	}
	bench.Main("images", func(ctx context.Context) (string, error) {
		if c.isolate {
			if err := bench.SetupIsolation(); err != nil {
				return "", err
			}
		}
		return run(ctx, c)
	})
}

var allParts = []string{"pull", "build", "start"}

// run is one run: the daemon, the registry with the images, the tools'
// footprint, then each part.
func run(ctx context.Context, c config) (string, error) {
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/images", Title: "Templates from OCI images: pull + unpack, Dockerfile builds, create → first answer; beside skopeo + umoci and podman",
		Out: c.Out, Repo: c.Repo, Prefix: "images-", Runsc: c.runsc, Demo: "web", Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer br.Close()
	r := &runner{cfg: c, res: br.Results, work: br.Work, runsc: br.Runsc, webRootfs: br.Rootfs, demo: br.Demo}
	envdBin := filepath.Join(filepath.Dir(br.Binary.Path), "sandstorm-envd")
	if _, err := os.Stat(envdBin); err != nil {
		return "", fmt.Errorf("no sandstorm-envd beside %s (make build puts it there)", br.Binary.Path)
	}
	r.data = filepath.Join(br.Work, "d")
	// No idle timers: nothing moves a sandbox while it is measured. envd:
	// a build's RUN steps run through it.
	args := []string{"--runsc", br.Runsc, "--subnet", c.subnet, "--gateway-ports", c.gwPorts, "--log-level", "info",
		"--envd", envdBin, "--freeze-after", "0", "--snapshot-after", "0", "--detach-after", "0"}
	r.res.Params = map[string]any{"n": c.n, "sizes_mib": c.sizes, "layer_mib": c.layerMiB, "parts": c.parts,
		"sandstormd_args": args, "sandstormd": br.Binary, "isolated": c.isolate}
	sd, err := bench.StartSandstormd(ctx, br.Binary.Path, r.data, filepath.Join(br.Dir.Path, "sandstormd.log"), args...)
	if err != nil {
		return "", err
	}
	defer func() {
		sd.Stop()
		for syscall.Unmount(filepath.Join(r.data, "runsc", "null-netns"), syscall.MNT_DETACH) == nil {
		}
		exec.Command("ip", "route", "del", "unreachable", c.subnet).Run()
	}()
	r.c = sd.Client
	reg, err := startRegistry()
	if err != nil {
		return "", err
	}
	defer reg.Close()
	r.reg = reg
	fmt.Fprintf(os.Stderr, "machine: %s\nbuilding and pushing the images…\n", r.res.Machine)
	if err := r.pushImages(ctx); err != nil {
		return "", err
	}
	// Taken before any tool runs: what they leave outside their
	// directories is removed at the end, and only that.
	fp := takeFootprint(toolPaths())
	defer func() {
		removed, failed := fp.clean()
		if len(removed) > 0 {
			r.res.Note("removed what the tools left outside their directories: %s", strings.Join(removed, ", "))
		}
		for _, f := range failed {
			r.res.Note("could not remove what a tool left: %s", f)
		}
	}()
	if c.baseline {
		r.setupTools(ctx)
		defer r.teardownTools(ctx)
	}
	for _, p := range strings.Split(c.parts, ",") {
		// The machine is shared: what else ran is part of every figure.
		r.res.Note("load average before %s: %s", p, loadAverage())
		if err := r.part(ctx, p); err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
		br.Dir.Write(r.res)
	}
	r.res.Note("load average at the end: %s", loadAverage())
	r.res.Tables = append(r.res.Tables, goals(r.res, c.sizes))
	// The tools' teardown and the footprint's clean run before the
	// results are final (deferred, in order): say so in them.
	r.teardownTools(ctx)
	removed, failed := fp.clean()
	if len(removed) > 0 {
		r.res.Note("removed what the tools left outside their directories: %s", strings.Join(removed, ", "))
	}
	for _, f := range failed {
		r.res.Note("could not remove what a tool left: %s", f)
	}
	return br.Dir.Done(r.res)
}

// loadAverage is the 1, 5 and 15 minute load averages ("?" unreadable).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// runner is one run's state.
type runner struct {
	cfg       config
	res       *bench.Results
	c         *client.Client
	reg       *localRegistry
	work      string
	data      string // the daemon's data dir
	runsc     string
	webRootfs string
	demo      demo.Demo
	// webRef is the web demo's rootfs as an image; sized the images of
	// cfg.sizes, by size in MiB.
	webRef string
	sized  map[int]string
	// pod is podman, nil when it cannot run here (podErr says why).
	pod    *podman
	podErr error
	// skopeoErr says why skopeo + umoci cannot run here (nil: they can).
	skopeoErr error
	torn      bool
}

func (r *runner) part(ctx context.Context, p string) error {
	switch p {
	case "pull":
		return r.measurePull(ctx)
	case "build":
		return r.measureBuild(ctx)
	case "start":
		return r.measureStart(ctx)
	}
	return nil
}
