package dockerbuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"

	"sandstorm/internal/errdefs"
)

// defaultPath is the PATH of an image that sets none (buildkit's too).
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// builder is one Build's state.
type builder struct {
	opts    BuildOptions
	out     io.Writer
	ctxRoot *os.Root // the build context, never left
	ignore  *patternmatcher.PatternMatcher
	cache   cache
	lex     *shell.Lex

	stages   []instructions.Stage
	meta     []instructions.ArgCommand
	global   []string        // meta ARGs, KEY=value, for FROM lines
	usedArgs map[string]bool // build args some ARG declared

	step, steps int
}

func newBuilder(opts BuildOptions) (*builder, error) {
	if opts.Base == nil || opts.Runner == nil || opts.Store == nil {
		return nil, errors.New("dockerbuild: Base, Runner and Store are required")
	}
	b := &builder{opts: opts, out: opts.Out, usedArgs: map[string]bool{}}
	if b.out == nil {
		b.out = io.Discard
	}
	if err := b.parse(); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(opts.ContextDir)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "build context %s: %w", opts.ContextDir, err)
	}
	b.ctxRoot = root
	if b.ignore, err = readIgnore(root); err != nil {
		root.Close()
		return nil, err
	}
	if b.cache, err = openCache(opts.CacheDir); err != nil {
		root.Close()
		return nil, err
	}
	return b, nil
}

func (b *builder) close() { b.ctxRoot.Close() }

// parse reads the Dockerfile into stages with buildkit's parser.
func (b *builder) parse() error {
	res, err := parser.Parse(bytes.NewReader(b.opts.Dockerfile))
	if err != nil {
		return badDockerfile(err)
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(b.out, "warning: %s\n", w.Short)
	}
	b.lex = shell.NewLex(res.EscapeToken)
	// A linter that warns nowhere: buildkit's Parse needs one to read
	// "# check=" comments without failing.
	b.stages, b.meta, err = instructions.Parse(res.AST, linter.New(&linter.Config{}))
	if err != nil {
		return badDockerfile(err)
	}
	if len(b.stages) == 0 {
		return errdefs.New(errdefs.ErrBadInput, "Dockerfile: no FROM: a Dockerfile starts with FROM (an image, a template or scratch)")
	}
	return nil
}

// badDockerfile is a parse error, with its line when buildkit knows it.
func badDockerfile(err error) error {
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		return errdefs.New(errdefs.ErrBadInput, "Dockerfile:%d: %v", le.Locations[0][0].Start.Line, le.Unwrap())
	}
	return errdefs.New(errdefs.ErrBadInput, "Dockerfile: %v", err)
}

func (b *builder) build(ctx context.Context) (Image, error) {
	if err := b.metaArgs(); err != nil {
		return Image{}, err
	}
	target, err := b.targetStage()
	if err != nil {
		return Image{}, err
	}
	need, err := b.neededStages(target)
	if err != nil {
		return Image{}, err
	}
	for _, i := range need {
		b.steps += 1 + len(b.stages[i].Commands)
	}
	done := map[int]*stageState{}
	for _, i := range need {
		st, err := b.buildStage(ctx, i, done)
		if err != nil {
			return Image{}, err
		}
		done[i] = st
	}
	b.warnUnusedArgs()
	return done[target].img, nil
}

// metaArgs evaluates the ARGs before the first FROM, which FROM lines see.
func (b *builder) metaArgs() error {
	for _, c := range b.meta {
		for _, kv := range c.Args {
			b.usedArgs[kv.Key] = true
			v, ok := b.opts.BuildArgs[kv.Key]
			if !ok && kv.Value != nil {
				var err error
				v, _, err = b.lex.ProcessWord(*kv.Value, shell.EnvsFromSlice(b.global))
				if err != nil {
					return stepErr(c.Location(), c.String(), errdefs.Mark(errdefs.ErrBadInput, err))
				}
				ok = true
			}
			if ok {
				b.global = setEnv(b.global, kv.Key, v)
			}
		}
	}
	return nil
}

// targetStage is the index of the stage to build.
func (b *builder) targetStage() (int, error) {
	if b.opts.Target == "" {
		return len(b.stages) - 1, nil
	}
	if i, ok := instructions.HasStage(b.stages, b.opts.Target); ok {
		return i, nil
	}
	return 0, errdefs.New(errdefs.ErrBadInput, "target stage %q: no FROM ... AS %s in the Dockerfile", b.opts.Target, b.opts.Target)
}

// fromName is stage i's FROM name with the meta ARGs expanded.
func (b *builder) fromName(i int) (string, error) {
	s := b.stages[i]
	name, _, err := b.lex.ProcessWord(s.BaseName, shell.EnvsFromSlice(b.global))
	if err != nil || name == "" {
		if err == nil {
			err = errors.New("empty image name")
		}
		return "", stepErr(s.Location, s.SourceCode, errdefs.Mark(errdefs.ErrBadInput, err))
	}
	return name, nil
}

// baseStage is the index of the earlier stage stage i is built FROM, or
// -1 when it is built from an image, a template or scratch.
func (b *builder) baseStage(i int) (int, error) {
	name, err := b.fromName(i)
	if err != nil {
		return 0, err
	}
	j, ok := instructions.HasStage(b.stages[:i], name)
	if !ok {
		return -1, nil
	}
	return j, nil
}

// neededStages are the stages target stands on, in build order: stages no
// one needs are not built (buildkit's behaviour).
func (b *builder) neededStages(target int) ([]int, error) {
	var need []int
	for i := target; i >= 0; {
		need = append(need, i)
		j, err := b.baseStage(i)
		if err != nil {
			return nil, err
		}
		i = j
	}
	slices.Reverse(need)
	return need, nil
}

func (b *builder) warnUnusedArgs() {
	var unused []string
	for k := range b.opts.BuildArgs {
		if !b.usedArgs[k] {
			unused = append(unused, k)
		}
	}
	if len(unused) > 0 {
		sort.Strings(unused)
		fmt.Fprintf(b.out, "warning: build args not declared by any ARG, so not used: %s\n", strings.Join(unused, ", "))
	}
}

// stepErr is err as a step's failure: its line and its instruction first.
func stepErr(loc []parser.Range, code string, err error) error {
	line := 0
	if len(loc) > 0 {
		line = loc[0].Start.Line
	}
	return fmt.Errorf("Dockerfile:%d: %s: %w", line, shortCode(code), err)
}

// shortCode is an instruction's text on one line, cut to a readable length.
func shortCode(code string) string {
	code = strings.Join(strings.Fields(code), " ")
	if len(code) > 120 {
		code = code[:117] + "..."
	}
	return code
}

// setEnv is env (KEY=value) with key set to v, in place of an earlier one.
func setEnv(env []string, key, v string) []string {
	out := slices.Clone(env)
	for i, e := range out {
		if k, _, _ := strings.Cut(e, "="); shell.EqualEnvKeys(k, key) {
			out[i] = key + "=" + v
			return out
		}
	}
	return append(out, key+"="+v)
}

// hasEnv reports whether env sets key.
func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if k, _, _ := strings.Cut(e, "="); shell.EqualEnvKeys(k, key) {
			return true
		}
	}
	return false
}
