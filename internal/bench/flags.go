package bench

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"
)

// Flags are the flags the node benchmarks that start their own sandstormd
// share: where the results go, the source tree they are of, and the
// sandstormd they measure.
type Flags struct {
	Out, Repo, Sandstormd string
}

// Register adds --out, --repo and --sandstormd to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Out, "out", "bench/results", "where the results directory goes")
	fs.StringVar(&f.Repo, "repo", ".", "the source tree (for the commit, and to build sandstormd from)")
	fs.StringVar(&f.Sandstormd, "sandstormd", "", "sandstormd binary (default: built from --repo)")
}

// ErrBadArguments is what a benchmark's check of its flags says of values
// it does not take.
var ErrBadArguments = errors.New("bad arguments; see --help")

// ParseFlags parses the command line into fs, as a benchmark's main does:
// --help prints the flags and exits 0; a flag that does not parse, an
// argument that is not a flag, or an error from check (nil: none; it
// runs once the flags are parsed) ends the program with status 2.
func ParseFlags(fs *flag.FlagSet, check func() error) {
	if err := fs.Parse(os.Args[1:]); err != nil {
		// fs has said what is wrong, and printed the flags.
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	var err error
	switch {
	case fs.NArg() > 0:
		err = ErrBadArguments
	case check != nil:
		err = check()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", fs.Name(), err)
		os.Exit(2)
	}
}

// IdleTimers are a node's idle timers as a fill benchmark sets them: how
// long a sandbox is idle before it is frozen, snapshotted to disk, or
// detached. The zero value has them all off: only the benchmark moves a
// sandbox between tiers.
type IdleTimers struct {
	Freeze, Snapshot, Detach time.Duration
}

// Register adds --freeze-after, --snapshot-after and --detach-after to fs,
// shortened as the seed's runs did; whose says whose flags they set (e.g.
// "sandstormd", "nodes'").
func (t *IdleTimers) Register(fs *flag.FlagSet, whose string) {
	fs.DurationVar(&t.Freeze, "freeze-after", 2*time.Second, whose+" --freeze-after (shortened, as the seed's runs did)")
	fs.DurationVar(&t.Snapshot, "snapshot-after", 5*time.Second, whose+" --snapshot-after")
	fs.DurationVar(&t.Detach, "detach-after", time.Minute, whose+" --detach-after (a detached sandbox costs only its volume)")
}

// Args are sandstormd serve's flags for t.
func (t IdleTimers) Args() []string {
	return []string{"--freeze-after", t.Freeze.String(), "--snapshot-after", t.Snapshot.String(), "--detach-after", t.Detach.String()}
}
