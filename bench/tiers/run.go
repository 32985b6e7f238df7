package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/bench/raw"
	"sandstorm/internal/client"
	"sandstorm/internal/demo"
	"sandstorm/internal/sandbox/gvisor"
)

// runner holds one run's state.
type runner struct {
	cfg   config
	runID string
	c     *client.Client
	gw    *http.Client // to gateway endpoints: a new TCP connection per request
	res   *bench.Results
	dir   *bench.Dir

	started bool // the daemon is ours (--start)
	round   int  // the round being measured, 1 to cfg.rounds
	pass    int  // the pass within it, 1 to cfg.interleave
	// warmReg is each template's warm copy as registered ("" if that
	// failed), made in the first round.
	warmReg map[string]string
	workDir string

	// tmpl maps a template as the series name it (web) to its name on the
	// daemon, which differs when the benchmark registered it itself.
	tmpl         map[string]string
	ownTemplates []string
	sandboxes    map[string]bool // IDs created and not yet deleted
	seq          int

	// tmplDef is each template as the daemon has it (rootfs, process),
	// which the raw series lay their bundles out from, and limitMiB the
	// memory limit the daemon gave its sandboxes (memory_mib), so that the
	// raw sandbox gets the same.
	tmplDef  map[string]api.Template
	limitMiB map[string]int
	// nodeRunsc reads the memory of the daemon's sandboxes through runsc's
	// state under the daemon's --root (nil: not a gvisor daemon, or its
	// data dir is unknown).
	nodeRunsc *gvisor.Backend
	raw       *raw.Env // the raw series' runsc root and network (nil until needed)
	daemonPID int      // the sandstormd this run started (0: one it did not)
	mem       memory
}

// run measures and writes the results; it returns the results directory.
func run(ctx context.Context, cfg config) (string, error) {
	isolated := os.Getenv(bench.IsolatedEnv) != ""
	if isolated {
		if err := bench.SetupIsolation(); err != nil {
			return "", err
		}
	}
	res := bench.NewResults("bench/tiers", "Sandstorm benchmark: start, hot requests and wakes from each tier")
	absOut, err := filepath.Abs(cfg.out)
	if err != nil {
		return "", err
	}
	res.Machine = bench.CollectMachine(ctx)
	res.Source = bench.CollectSource(ctx, cfg.repo, absOut)
	if res.Source.Error != "" {
		fmt.Fprintf(os.Stderr, "warning: source tree unknown: %s\n", res.Source.Error)
	}
	// The platform in the name: runs on both platforms from one commit on
	// one day are told apart at a glance (NewDir's -2 suffix would keep them
	// apart too, but not say which is which).
	dir, err := bench.NewDir(cfg.out, res.DirName()+"-"+cfg.runsOn())
	if err != nil {
		return "", err
	}
	if cfg.runsc, err = resolveRunsc(ctx, cfg, res); err != nil {
		os.RemoveAll(dir.Path)
		return "", err
	}
	r := newRunner(cfg, res, dir)
	r.recordParams(isolated)
	res.Note("load average at start: %s", loadavg())
	if n := countProcs("runsc-sandbox"); n > 0 {
		res.Note("%d runsc sandbox(es) of other programs were running on this machine when the run started: the figures share the CPUs with them", n)
	}
	fmt.Fprintf(os.Stderr, "machine: %s\nsource: %s\nresults: %s\n", res.Machine, res.Source, dir.Path)
	d, err := r.connect(ctx)
	if d == nil && err != nil && cfg.start {
		res.Note("sandstormd did not start: %v", err)
		dir.Write(res)
		return dir.Path, err
	}
	if err == nil {
		err = r.describeNode(ctx)
	}
	if err == nil {
		err = r.setupTemplates(ctx)
	}
	if err == nil {
		err = r.measureAll(ctx)
	}
	if ctx.Err() != nil && err == nil {
		err = ctx.Err()
	}
	cerr := r.cleanup(d, isolated)
	res.Tables = r.tables()
	res.Finished = time.Now().UTC()
	res.Note("load average at the end: %s", loadavg())
	if err != nil && len(res.Series) == 0 && d == nil {
		// Nothing measured and no daemon log to keep: leave no directory.
		os.RemoveAll(dir.Path)
		return "", errors.Join(err, cerr)
	}
	if err != nil {
		res.Note("run ended early: %v", err)
	}
	if werr := dir.Write(res); werr != nil {
		return dir.Path, errors.Join(err, cerr, werr)
	}
	if err != nil {
		return dir.Path, errors.Join(err, cerr)
	}
	final, ferr := dir.Finish()
	fmt.Fprintf(os.Stderr, "\n%s", res.Table())
	return final, errors.Join(cerr, ferr)
}

// newRunner is a runner for one run, with a gateway client that never
// reuses a connection (a wake must be measured from the dial).
func newRunner(cfg config, res *bench.Results, dir *bench.Dir) *runner {
	return &runner{
		cfg: cfg, runID: newRunID(), res: res, dir: dir, started: cfg.start,
		tmpl: map[string]string{}, sandboxes: map[string]bool{}, warmReg: map[string]string{},
		tmplDef: map[string]api.Template{}, limitMiB: map[string]int{},
		gw: &http.Client{
			Transport: &http.Transport{
				Proxy:             nil,
				DisableKeepAlives: true,
				DialContext:       (&net.Dialer{Timeout: cfg.timeout}).DialContext,
			},
		},
	}
}

// connect starts the run's own sandstormd (--start) or reaches the one
// given, and finds the node's runsc state. With --start, a nil daemon and
// an error mean it did not start.
func (r *runner) connect(ctx context.Context) (*daemon, error) {
	cfg := r.cfg
	if !cfg.start {
		// Its runsc state, where `serve --data-dir` puts it; readable only
		// when it runs on this machine (memory readings fail otherwise, and
		// say so).
		r.nodeRunsc = &gvisor.Backend{Root: filepath.Join(cfg.dataDir, "runsc")}
		var err error
		r.c, err = externalClient(cfg)
		return nil, err
	}
	d, err := startDaemon(ctx, cfg, filepath.Join(r.dir.Path, "sandstormd.log"))
	if err != nil {
		return nil, err
	}
	r.workDir = d.dataDir
	r.daemonPID = d.cmd.Process.Pid
	if cfg.backend == "gvisor" {
		r.nodeRunsc = &gvisor.Backend{Root: filepath.Join(d.dataDir, "data", "runsc")}
	}
	r.res.Params["sandstormd"] = map[string]any{"binary": d.bin, "built_from_tree": d.built, "sha256": d.binHash, "args": d.args}
	r.c, err = d.client()
	return d, err
}

// resolveRunsc finds the runsc the run uses — --runsc, or the pinned
// bin/runsc of --repo — when the raw series or a --start gvisor daemon need
// one, and records its version in the parameters and as the machine's
// runsc (bench.CollectMachine guesses the default one, which --runsc or
// --repo may not be).
func resolveRunsc(ctx context.Context, cfg config, res *bench.Results) (string, error) {
	if !cfg.wantsRaw() && !(cfg.start && cfg.backend == "gvisor") {
		return cfg.runsc, nil
	}
	path, err := bench.FindRunsc(cfg.repo, cfg.runsc)
	if err != nil {
		return "", err
	}
	v, err := gvisor.Version(ctx, path)
	if err != nil {
		return "", err
	}
	sum, _ := bench.FileSHA256(path)
	res.Params["runsc"] = map[string]any{"binary": path, "version": v, "sha256": sum, "platform": cfg.platform, "pinned": gvisor.PinnedVersion}
	if v != gvisor.PinnedVersion {
		res.Note("runsc %s is %s, not the version this tree pins (%s)", path, v, gvisor.PinnedVersion)
	}
	if def := res.Machine.RunscPath; def != path {
		res.Note("machine.runsc is the runsc this run used (%s); the default one (%s) is %s", path, def, res.Machine.Runsc)
	}
	res.Machine.RunscPath, res.Machine.Runsc = path, v
	return path, nil
}

func externalClient(cfg config) (*client.Client, error) {
	tok := os.Getenv("SANDSTORM_TOKEN")
	if tok == "" {
		c, err := client.ForDataDir(cfg.api, cfg.dataDir)
		if err != nil {
			return nil, fmt.Errorf("%w; or use --start to run a private sandstormd", err)
		}
		return c, nil
	}
	c := client.New(cfg.api, tok)
	if strings.HasPrefix(cfg.api, "https://") {
		if err := c.TrustCA(client.CAFile(cfg.dataDir)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (r *runner) recordParams(isolated bool) {
	c := r.cfg
	p := r.res.Params
	p["run_id"] = r.runID
	p["templates"] = c.templates
	p["series"] = c.series
	p["n_start"] = c.startN
	p["n_hot"] = c.hotN
	p["n_wake"] = c.wakeN
	p["hot_warmup"] = c.hotWarmup
	p["clone_children"] = c.cloneN
	p["clone_rounds"] = c.cloneRounds
	p["rounds"] = c.rounds
	p["interleave"] = c.interleave
	p["reseed_signal"] = c.reseedSignal
	p["warm_probe"] = c.warmProbe
	p["poll_interval"] = c.poll.String()
	p["timeout"] = c.timeout.String()
	p["settle"] = c.settle.String()
	p["dwell"] = c.dwell.String()
	p["max_consecutive_failures"] = c.maxConsecutiveFailures
	p["endpoint_port"] = c.port
	p["client"] = "Go net/http, keep-alives off: a new TCP connection for every request; time from sending the request to the end of the body"
	p["platform"] = c.platform
	if c.start {
		p["daemon"] = "started by the benchmark (--start): temporary data dir, idle timers off"
		p["isolated"] = isolated
		p["backend"] = c.backend
	} else {
		p["daemon"] = "already running at " + c.api + " (its idle timers may move sandboxes; every sample checks the tier first)"
	}
}

func (r *runner) describeNode(ctx context.Context) error {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := r.c.Node(actx)
	if err != nil {
		return fmt.Errorf("sandstormd API at %s: %w", r.c.Base, err)
	}
	r.res.Params["node"] = st
	if st.Backend != "gvisor" {
		r.nodeRunsc = nil
	}
	return nil
}

// setupTemplates finds each template on the daemon, or builds the demo of
// that name from this machine's Debian packages and registers it (under a
// temporary name on a daemon that is not ours).
func (r *runner) setupTemplates(ctx context.Context) error {
	have, err := r.c.Templates(ctx)
	if err != nil {
		return fmt.Errorf("list templates: %w", err)
	}
	for _, name := range r.cfg.templates {
		if i := slices.IndexFunc(have, func(t api.Template) bool { return t.Name == name }); i >= 0 {
			t := have[i]
			r.tmpl[name] = name
			r.tmplDef[name] = t
			r.res.Params["template_"+name] = map[string]any{"registered_as": name, "by": "the daemon's own", "rootfs": t.Rootfs, "args": t.Process.Args, "ports": t.Ports}
			if t.Warm != nil {
				r.res.Note("the daemon's template %s is warm: its start series are restores of its warm image, not cold starts", name)
			}
			continue
		}
		if !slices.Contains(demo.Names(), name) {
			return fmt.Errorf("template %q: not registered on the daemon and not a demo this benchmark can build (%s)", name, strings.Join(demo.Names(), ", "))
		}
		if r.workDir == "" {
			if r.workDir, err = os.MkdirTemp("", "sandstorm-bench-"); err != nil {
				return err
			}
		}
		dir := filepath.Join(r.workDir, "demo", name)
		start := time.Now()
		var dm demo.Demo
		if pre := os.Getenv(prebuiltEnv); pre != "" {
			dir = filepath.Join(pre, name)
			dm, err = demo.Describe(name)
		} else {
			dm, err = demo.Build(name, dir)
		}
		if err != nil {
			return fmt.Errorf("build demo template %s: %w", name, err)
		}
		reg := name
		if !r.started {
			reg = "bench-" + r.runID + "-" + name
		}
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		def, err := r.c.CreateTemplate(actx, api.TemplateRequest{Name: reg, RootfsDir: dir, Process: api.Process{Args: dm.Args, Env: dm.Env}, Ports: dm.Ports})
		cancel()
		if err != nil {
			return fmt.Errorf("register template %s: %w", reg, err)
		}
		r.ownTemplates = append(r.ownTemplates, reg)
		r.tmpl[name] = reg
		r.tmplDef[name] = def
		r.res.Params["template_"+name] = map[string]any{"registered_as": reg, "by": "this benchmark (demo.Build)", "rootfs": dir, "args": dm.Args, "ports": dm.Ports}
		fmt.Fprintf(os.Stderr, "built and registered template %s (%s) in %.1fs\n", reg, dir, time.Since(start).Seconds())
	}
	return nil
}

// prebuiltEnv names the directory of demos built before the run went into
// its own namespaces (prebuildDemos).
const prebuiltEnv = "SANDSTORM_BENCH_PREBUILT_DEMOS"

// prebuildDemos builds every demo among templates into a new directory,
// named in prebuiltEnv for the isolated run, and returns it.
func prebuildDemos(templates []string) (string, error) {
	dir, err := os.MkdirTemp("", "sandstorm-bench-demos-")
	if err != nil {
		return "", err
	}
	for _, name := range templates {
		if !slices.Contains(demo.Names(), name) {
			continue
		}
		start := time.Now()
		if _, err := demo.Build(name, filepath.Join(dir, name)); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("build demo template %s: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "built demo %s in %.1fs\n", name, time.Since(start).Seconds())
	}
	return dir, os.Setenv(prebuiltEnv, dir)
}

// cleanup deletes every sandbox and template this run made; with --start it
// also stops the daemon, records anything it left behind, and removes its
// data dir. It uses its own context: it must run after an interrupt too.
func (r *runner) cleanup(d *daemon, isolated bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errs []error
	if r.raw != nil {
		if err := r.raw.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: raw runsc: %w", err))
		}
		r.raw = nil
	}
	if r.c != nil {
		ids := make([]string, 0, len(r.sandboxes))
		for id := range r.sandboxes {
			ids = append(ids, id)
		}
		if d != nil {
			// The daemon is ours: whatever it has, we made.
			if all, err := r.c.Sandboxes(ctx); err == nil {
				for _, sb := range all {
					if !slices.Contains(ids, sb.ID) {
						ids = append(ids, sb.ID)
					}
				}
			}
		}
		for _, id := range ids {
			if err := r.c.DeleteSandbox(ctx, id); err != nil && client.StatusOf(err) != http.StatusNotFound {
				errs = append(errs, fmt.Errorf("cleanup: delete sandbox %s: %w", id, err))
				continue
			}
			delete(r.sandboxes, id)
		}
		for _, t := range r.ownTemplates {
			if err := r.c.DeleteTemplate(ctx, t); err != nil && client.StatusOf(err) != http.StatusNotFound {
				errs = append(errs, fmt.Errorf("cleanup: delete template %s: %w", t, err))
			}
		}
	}
	if d != nil {
		if err := d.stop(); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: %w", err))
		}
		if left := d.leftovers(isolated); len(left) > 0 {
			r.res.Note("after every sandbox was deleted through the API and sandstormd stopped, these were left: %s", strings.Join(left, "; "))
			fmt.Fprintf(os.Stderr, "warning: sandstormd left behind: %s\n", strings.Join(left, "; "))
		}
		if r.cfg.keepDataDir {
			r.res.Note("data dir kept: %s", d.dataDir)
		} else if err := d.removeDataDir(); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: %w", err))
		}
	} else if r.workDir != "" {
		if err := os.RemoveAll(r.workDir); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: %w", err))
		}
	}
	for _, e := range errs {
		r.res.Note("%v", e)
	}
	return errors.Join(errs...)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return strings.TrimSpace(string(b))
	}
	return strings.Join(f[:3], " ") + " (1, 5, 15 min)"
}

// countProcs counts processes whose argv[0] is name. Not their command
// name (/proc/PID/comm): the pinned runsc re-executes /proc/self/exe with
// argv[0] "runsc-sandbox", so its sandboxes' comm is "exe".
func countProcs(name string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && argv0(b) == name {
			n++
		}
	}
	return n
}

// argv0 is the base name of the first argument in a /proc/PID/cmdline.
func argv0(cmdline []byte) string {
	first, _, _ := strings.Cut(string(cmdline), "\x00")
	return filepath.Base(first)
}
