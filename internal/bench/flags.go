package bench

import (
	"errors"
	"flag"
	"fmt"
	"os"
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
