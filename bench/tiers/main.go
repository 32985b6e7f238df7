// Command tiers measures a running sandstormd the way the Sandstorm seed
// quotes it: start to first answer, hot request latency through the
// gateway, and the wake from each tier (frozen, snapshot, detached), both as
// a client sees it through the gateway and as the node times itself
// (last_wake_ms). It writes every raw sample, with the machine and the
// commit, to bench/results/<date>-<commit>/results.{json,md}.
//
//	go run ./bench/tiers --start            # start a private sandstormd, measure, clean up
//	go run ./bench/tiers -n 20 --start      # a quicker run
//	go run ./bench/tiers --api https://127.0.0.1:8080   # measure a daemon already running
//
// See bench/README.md, or run it with --help.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/demo"
	"sandstorm/internal/sandbox/gvisor"
)

// config is the command line.
type config struct {
	api     string
	dataDir string

	start       bool
	isolate     bool
	sandstormd  string
	backend     string
	platform    string
	runsc       string
	subnet      string
	gwPorts     string
	daemonArgs  []string
	keepDataDir bool

	templates []string
	series    []string
	port      int

	n, startN, hotN, wakeN int
	hotWarmup              int
	cloneN, cloneRounds    int
	rounds                 int
	interleave             int
	warmProbe              string // HTTP path of the warm copies' probe
	reseedSignal           string // how warm sandboxes and clone children are reseeded
	poll                   time.Duration
	timeout                time.Duration
	dwell                  time.Duration
	settle                 time.Duration
	maxConsecutiveFailures int

	out  string
	repo string
}

// allSeries are the measurements, in the order they run. Each raw-runsc
// measurement runs right after the sandstormd one it is compared with, so
// that the two share the machine's load as closely as a serial run can;
// warm-start runs right before the cold start it is compared with.
var allSeries = []string{"warm-start", "start", "raw-start", "hot", "raw-hot", "frozen", "raw-pause", "snapshot", "raw-restore", "detached", "clone"}

// rawSeries are the measurements of raw runsc, outside sandstormd.
var rawSeries = []string{"raw-start", "raw-hot", "raw-pause", "raw-restore"}

const usageText = `Usage: go run ./bench/tiers [flags]

Measures Sandstorm's latencies against a real sandstormd, from a client
through the gateway and (where the node times itself) from the node's own
last_wake_ms:

  warm-start  the same as start for a warm copy of the template (registered
            as <template>-warm: started once, probed on --warm-probe and
            checkpointed; each sandbox is a restore of that image, reseeded
            by --reseed-signal), and how long making the warm image took;
            then warm-pool: the same creates without a name, each taken
            from the copy's warm pool of one (restored ahead, paused)
  start     POST /v1/sandboxes to the first 200 from the sandbox's gateway
            endpoint, polling every --poll (the seed polled every 50 ms);
            each sandbox is deleted afterwards
  hot       GET / through the gateway to a hot sandbox, a new TCP
            connection each request
  frozen    freeze via the API, then time one GET / (the wake is in it);
  snapshot  likewise after a snapshot to disk,
  detached  and after a detach (the wake is a cold start)
  clone     a parent called a few times, cloned into --clone-n children
            (POST /v1/sandboxes/{id}/clone): the parent's pause and each
            child's time as the node reports them, the call, and each
            child's first answer (which must count on from the parent's)

and, for comparison, raw runsc outside sandstormd, on the same bundle (the
node's OCI spec and rootfs overlay), the same runsc and flags, in a network
namespace of the benchmark's own, polled with the same client:

  raw-start    runsc run -detach to the first 200 from the sandbox's address
  raw-hot      GET / to a raw sandbox's own address, a new TCP connection each
  raw-pause    runsc pause, then runsc resume to the first answer
  raw-restore  runsc checkpoint, then runsc restore -detach to the first answer

each for the templates in --templates (default: the demo "web" server and
"app64", the same server with numpy and a 64 MiB heap).

Either --start a private sandstormd (needs root; it gets a temporary data
dir, its own network and mount namespaces unless --isolate=false, and is
stopped and cleaned up at the end), or point --api at one already running
(token from SANDSTORM_TOKEN or <--data-dir>/pki/api-token). A template that
the daemon lacks is built from this machine's Debian packages and registered
under a temporary name, and removed at the end.

Results go to <--out>/<YYYY-MM-DD>-<short commit>-<platform>/ (results.json
with the raw samples, results.md with the table; "process" instead of the
platform with --backend process); while the run lasts the directory is named
….tmp. Progress goes to stderr.

Examples:
  go run ./bench/tiers --start                   full run (a few minutes)
  go run ./bench/tiers --start -n 20             quicker
  go run ./bench/tiers --start --series hot,frozen --templates web
  go run ./bench/tiers --start --series start,raw-start --platform ptrace
  go run ./bench/tiers --api https://127.0.0.1:8080 --data-dir /var/lib/sandstorm

Flags:
`

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("tiers", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.api, "api", envOr("SANDSTORM_API", "https://127.0.0.1:8080"), "API URL of a running sandstormd (env SANDSTORM_API); ignored with --start")
	fs.StringVar(&c.dataDir, "data-dir", envOr("SANDSTORM_DATA_DIR", "/var/lib/sandstorm"), "data dir of that sandstormd, for its API token (env SANDSTORM_DATA_DIR; SANDSTORM_TOKEN overrides)")
	fs.BoolVar(&c.start, "start", false, "start a private sandstormd with a temporary data dir, and stop and clean it up at the end (needs root)")
	fs.BoolVar(&c.isolate, "isolate", true, "with --start: run the daemon and the measurements in their own network and mount namespaces, so they neither see nor disturb other sandstormd on this machine")
	fs.StringVar(&c.sandstormd, "sandstormd", "", "with --start: sandstormd binary to run (default: go build ./cmd/sandstormd from --repo)")
	fs.StringVar(&c.backend, "backend", "gvisor", "with --start: sandbox backend, gvisor or process")
	fs.StringVar(&c.platform, "platform", gvisor.DefaultPlatform, "runsc platform ("+strings.Join(gvisor.Platforms, " or ")+"): given to the sandstormd --start runs (serve --platform) and to the raw runsc series")
	fs.StringVar(&c.runsc, "runsc", "", "runsc binary for the raw series and the sandstormd --start runs (default: <--repo>/bin/runsc, the pinned one `make runsc` builds)")
	fs.StringVar(&c.subnet, "subnet", "10.219.0.0/16", "with --start: sandbox subnet")
	fs.StringVar(&c.gwPorts, "gateway-ports", "31000-31999", "with --start: gateway port range")
	fs.Func("daemon-arg", "with --start: extra argument for sandstormd serve (repeatable), e.g. --daemon-arg=--memory-reserve=512", func(s string) error {
		c.daemonArgs = append(c.daemonArgs, s)
		return nil
	})
	fs.BoolVar(&c.keepDataDir, "keep-data-dir", false, "with --start: keep the temporary data dir (to debug the daemon)")
	var templates, series string
	fs.StringVar(&templates, "templates", "web,app64", "templates to measure, comma-separated; a missing demo template ("+strings.Join(demo.Names(), ", ")+") is built and registered")
	fs.StringVar(&series, "series", strings.Join(allSeries, ","), "measurements to run, comma-separated, of "+strings.Join(allSeries, ","))
	fs.IntVar(&c.port, "port", demo.Port, "template port whose gateway endpoint is measured")
	fs.IntVar(&c.n, "n", 50, "samples per series")
	fs.IntVar(&c.rounds, "rounds", 5, "split every series into this many rounds, each running all series in turn, so that what is compared is measured close together in time")
	fs.IntVar(&c.interleave, "interleave", 4, "measure each round in this many passes over the series, template by template with each series beside its raw baseline, so that the two alternate every few samples")
	fs.IntVar(&c.startN, "start-n", 0, "samples of start to first answer (0: -n)")
	fs.IntVar(&c.hotN, "hot-n", 0, "samples of hot requests (0: 4 × -n; they are cheap)")
	fs.IntVar(&c.wakeN, "wake-n", 0, "samples of each tier's wake (0: -n)")
	fs.IntVar(&c.hotWarmup, "hot-warmup", 3, "unrecorded requests before the hot series")
	fs.StringVar(&c.warmProbe, "warm-probe", "/healthz", "warm-start: HTTP path on --port that must answer 2xx before the warm image is taken (the demo's health path)")
	fs.StringVar(&c.reseedSignal, "reseed-signal", "SIGUSR1", "warm-start and clone: signal that reseeds a restored sandbox's process (the demo reseeds Python's random on SIGUSR1)")
	fs.IntVar(&c.cloneN, "clone-n", 5, "children per clone in the clone series")
	fs.IntVar(&c.cloneRounds, "clone-rounds", 0, "clones (each of a new parent) in the clone series (0: enough for -n children, -n / --clone-n rounded up)")
	fs.DurationVar(&c.poll, "poll", 10*time.Millisecond, "interval between attempts while waiting for a first answer")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "longest wait for a first answer or one request")
	fs.DurationVar(&c.settle, "settle", 0, "wait between a sandbox's last answer and putting it into a tier")
	fs.DurationVar(&c.dwell, "dwell", 0, "time a sandbox stays in a tier before the request that wakes it")
	fs.IntVar(&c.maxConsecutiveFailures, "max-failures", 3, "stop a series after this many failed attempts in a row")
	fs.StringVar(&c.out, "out", "bench/results", "directory that receives the results directory")
	fs.StringVar(&c.repo, "repo", ".", "the Sandstorm source tree (for the commit, and to build sandstormd)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q (flags only; see --help)", fs.Args())
	}
	c.templates = splitList(templates)
	c.series = splitList(series)
	if len(c.templates) == 0 {
		return c, errors.New("--templates: name at least one template")
	}
	for _, s := range c.series {
		if !slices.Contains(allSeries, s) {
			return c, fmt.Errorf("--series: unknown measurement %q (known: %s)", s, strings.Join(allSeries, ", "))
		}
	}
	if !slices.Contains(gvisor.Platforms, c.platform) {
		return c, fmt.Errorf("--platform %q: use %s", c.platform, strings.Join(gvisor.Platforms, " or "))
	}
	if c.rounds < 1 {
		return c, fmt.Errorf("--rounds %d: want at least 1", c.rounds)
	}
	if c.interleave < 1 {
		return c, fmt.Errorf("--interleave %d: want at least 1", c.interleave)
	}
	if c.n < 1 {
		return c, fmt.Errorf("-n %d: want at least 1", c.n)
	}
	for _, p := range []*int{&c.startN, &c.wakeN} {
		if *p <= 0 {
			*p = c.n
		}
	}
	if c.hotN <= 0 {
		c.hotN = 4 * c.n
	}
	if !strings.HasPrefix(c.warmProbe, "/") {
		return c, fmt.Errorf("--warm-probe %q: give an HTTP path, e.g. /healthz", c.warmProbe)
	}
	if c.cloneN < 1 || c.cloneN > api.MaxClone {
		return c, fmt.Errorf("--clone-n %d: want 1 to %d", c.cloneN, api.MaxClone)
	}
	if c.cloneRounds <= 0 {
		c.cloneRounds = cloneRounds(c.n, c.cloneN)
	}
	if c.poll <= 0 || c.timeout <= 0 {
		return c, errors.New("--poll and --timeout must be positive")
	}
	if c.maxConsecutiveFailures < 1 {
		c.maxConsecutiveFailures = 1
	}
	return c, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (c config) wants(series string) bool { return slices.Contains(c.series, series) }

// wantsRaw reports whether any raw-runsc series is to run.
func (c config) wantsRaw() bool {
	return slices.ContainsFunc(rawSeries, c.wants)
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tiers:", err)
		os.Exit(2)
	}
	if cfg.start && cfg.isolate && os.Getenv(bench.IsolatedEnv) == "" {
		// Re-run this program inside fresh namespaces; it comes back here
		// with bench.IsolatedEnv set. Its network namespace has no way
		// out, and a demo is built from Debian's mirror, so the demos are
		// built here first.
		dir, err := prebuildDemos(cfg.templates)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tiers:", err)
			os.Exit(1)
		}
		code := bench.ReexecIsolated("tiers")
		os.RemoveAll(dir)
		os.Exit(code)
	}
	// The first SIGINT/SIGTERM cancels the run, which then still deletes
	// its sandboxes and stops its daemon; later ones are ignored so that
	// the cleanup is not cut short (SIGKILL still works).
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "tiers: %v: stopping after cleanup (signals are ignored until then)\n", s)
		cancel()
		for range sigs {
		}
	}()
	path, err := run(ctx, cfg)
	cancel()
	if path != "" {
		fmt.Fprintln(os.Stderr, "results:", path)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tiers:", err)
		os.Exit(1)
	}
}

// cloneRounds is how many clones of k children make at least n children.
func cloneRounds(n, k int) int {
	return max(1, (n+k-1)/k)
}

// runsOn names what the run's sandboxes run on, for the results directory:
// the runsc platform, or the backend when it has none.
func (c config) runsOn() string {
	if c.start && c.backend != "gvisor" {
		return c.backend
	}
	return c.platform
}

// newRunID returns a short random ID that names this run's sandboxes.
func newRunID() string {
	var b [3]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
