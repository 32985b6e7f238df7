package dockerbuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"sandstorm/internal/errdefs"
)

// stageState is a stage being built.
type stageState struct {
	img Image
	// key is the cache key of the last step: the chain of every step so
	// far, so that a step's key names everything before it.
	key string
	// env is what RUN sees and what words are expanded with: the image's
	// ENV and the ARGs in scope, later ones in place of earlier ones.
	env []string
	// args are the ARGs in scope (KEY=value), part of every RUN's key.
	args  []string
	shell []string
	// cmdSet: a CMD in this stage (an ENTRYPOINT clears an inherited one
	// only).
	cmdSet bool
}

// scratch is FROM scratch: nothing, and a PATH (buildkit's too).
func scratch() Image {
	return Image{Config: ImageConfig{Env: []string{defaultPath}}}
}

func (st *stageState) clone() *stageState {
	c := *st
	c.img = cloneImage(st.img)
	c.env = slices.Clone(st.env)
	c.args = slices.Clone(st.args)
	c.shell = slices.Clone(st.shell)
	c.cmdSet = false
	return &c
}

func cloneImage(img Image) Image {
	c := img
	c.Layers = slices.Clone(img.Layers)
	c.Config.Entrypoint = slices.Clone(img.Config.Entrypoint)
	c.Config.Cmd = slices.Clone(img.Config.Cmd)
	c.Config.Env = slices.Clone(img.Config.Env)
	c.Config.ExposedPorts = slices.Clone(img.Config.ExposedPorts)
	c.Config.Labels = maps.Clone(img.Config.Labels)
	return c
}

// buildStage builds stage i, its base stage (if any) in done.
func (b *builder) buildStage(ctx context.Context, i int, done map[int]*stageState) (*stageState, error) {
	s := b.stages[i]
	b.step++
	fmt.Fprintf(b.out, "Step %d/%d : %s (Dockerfile:%d)\n", b.step, b.steps, shortCode(s.SourceCode), line(s.Location))
	st, err := b.from(ctx, i, done)
	if err != nil {
		return nil, err
	}
	for _, cmd := range s.Commands {
		b.step++
		fmt.Fprintf(b.out, "Step %d/%d : %s (Dockerfile:%d)\n", b.step, b.steps, shortCode(codeOf(cmd)), line(cmd.Location()))
		if err := ctx.Err(); err != nil {
			return nil, stepErr(cmd.Location(), codeOf(cmd), err)
		}
		if err := b.dispatch(ctx, st, cmd); err != nil {
			return nil, stepErr(cmd.Location(), codeOf(cmd), err)
		}
	}
	return st, nil
}

// from is the state a stage starts in: an earlier stage's end, scratch,
// or what Base resolves.
func (b *builder) from(ctx context.Context, i int, done map[int]*stageState) (*stageState, error) {
	s := b.stages[i]
	if s.Platform != "" {
		return nil, stepErr(s.Location, s.SourceCode, errdefs.New(errdefs.ErrBadInput, "FROM --platform is not supported: a template is built for this node's platform; remove the flag"))
	}
	j, err := b.baseStage(i)
	if err != nil {
		return nil, err
	}
	if j >= 0 {
		return done[j].clone(), nil
	}
	name, _ := b.fromName(i)
	img := scratch()
	if name != "scratch" {
		if img, err = b.opts.Base.From(ctx, name); err != nil {
			return nil, stepErr(s.Location, s.SourceCode, err)
		}
	}
	st := &stageState{img: cloneImage(img), env: slices.Clone(img.Config.Env)}
	st.key = chainKey("", "FROM", name, img)
	return st, nil
}

func line(loc []parser.Range) int {
	if len(loc) == 0 {
		return 0
	}
	return loc[0].Start.Line
}

// codeOf is a command's text as written.
func codeOf(cmd instructions.Command) string {
	if s, ok := cmd.(fmt.Stringer); ok {
		return s.String()
	}
	return cmd.Name()
}

// dispatch does one instruction.
func (b *builder) dispatch(ctx context.Context, st *stageState, cmd instructions.Command) error {
	if arg, ok := cmd.(*instructions.ArgCommand); ok {
		return b.arg(st, arg)
	}
	if ex, ok := cmd.(instructions.SupportsSingleWordExpansion); ok {
		if err := ex.Expand(b.expander(st)); err != nil {
			return errdefs.Mark(errdefs.ErrBadInput, err)
		}
	}
	switch c := cmd.(type) {
	case *instructions.RunCommand:
		return b.run(ctx, st, c)
	case *instructions.CopyCommand:
		return b.copyCmd(ctx, st, c)
	case *instructions.AddCommand:
		return b.addCmd(ctx, st, c)
	case *instructions.WorkdirCommand:
		return b.workdir(ctx, st, c)
	}
	if err := b.configCmd(st, cmd); err != nil {
		return err
	}
	// A config-only step adds no layer; its key still joins the chain, so
	// that every step after it is keyed by it too.
	st.key = chainKey(st.key, cmd.Name(), cmd)
	return nil
}

func (b *builder) expander(st *stageState) instructions.SingleWordExpander {
	return func(word string) (string, error) {
		v, _, err := b.lex.ProcessWord(word, shell.EnvsFromSlice(st.env))
		return v, err
	}
}

// arg is ARG: a --build-arg's value, else the default, else the meta
// ARG's. It changes no key by itself: a value reaches the cache through
// the steps that use it (Docker's rule: a changed ARG misses the cache
// where it is first used, not where it is declared).
func (b *builder) arg(st *stageState, c *instructions.ArgCommand) error {
	for _, kv := range c.Args {
		b.usedArgs[kv.Key] = true
		v, ok := b.opts.BuildArgs[kv.Key]
		if !ok && kv.Value != nil {
			var err error
			if v, _, err = b.lex.ProcessWord(*kv.Value, shell.EnvsFromSlice(st.env)); err != nil {
				return errdefs.Mark(errdefs.ErrBadInput, err)
			}
			ok = true
		}
		if !ok {
			v, ok = shell.EnvsFromSlice(b.global).Get(kv.Key)
		}
		if ok {
			st.env = setEnv(st.env, kv.Key, v)
			st.args = setEnv(st.args, kv.Key, v)
		}
	}
	return nil
}

// configCmd does an instruction that changes the config only.
func (b *builder) configCmd(st *stageState, cmd instructions.Command) error {
	cfg := &st.img.Config
	switch c := cmd.(type) {
	case *instructions.EnvCommand:
		for _, kv := range c.Env {
			cfg.Env = setEnv(cfg.Env, kv.Key, kv.Value)
			st.env = setEnv(st.env, kv.Key, kv.Value)
		}
	case *instructions.LabelCommand:
		if cfg.Labels == nil {
			cfg.Labels = map[string]string{}
		}
		for _, kv := range c.Labels {
			cfg.Labels[kv.Key] = kv.Value
		}
	case *instructions.CmdCommand:
		cfg.Cmd = st.shellForm(c.ShellDependantCmdLine)
		st.cmdSet = true
	case *instructions.EntrypointCommand:
		cfg.Entrypoint = st.shellForm(c.ShellDependantCmdLine)
		if !st.cmdSet {
			cfg.Cmd = nil // Docker: an inherited CMD does not outlive a new ENTRYPOINT
		}
	case *instructions.UserCommand:
		cfg.User = c.User
	case *instructions.ExposeCommand:
		return b.expose(st, c)
	case *instructions.StopSignalCommand:
		cfg.StopSignal = c.Signal
	case *instructions.ShellCommand:
		st.shell = slices.Clone(c.Shell)
	case *instructions.MaintainerCommand:
		// Deprecated in Docker and kept nowhere a sandbox reads.
	case *instructions.VolumeCommand:
		fmt.Fprintln(b.out, "VOLUME ignored: a sandbox's whole file system is its own and persists")
	case *instructions.HealthCheckCommand:
		return errdefs.New(errdefs.ErrBadInput, "HEALTHCHECK is not supported: nothing runs health checks in a sandbox; remove it")
	case *instructions.OnbuildCommand:
		return errdefs.New(errdefs.ErrBadInput, "ONBUILD is not supported: put the instructions in the Dockerfile that builds FROM this template")
	default:
		return errdefs.New(errdefs.ErrBadInput, "%s is not supported", strings.ToUpper(cmd.Name()))
	}
	return nil
}

// shellForm is a command line as exec form: a shell form wrapped in the
// stage's shell.
func (st *stageState) shellForm(c instructions.ShellDependantCmdLine) []string {
	if !c.PrependShell || c.CmdLine == nil {
		return slices.Clone(c.CmdLine)
	}
	sh := st.shell
	if len(sh) == 0 {
		sh = []string{"/bin/sh", "-c"}
	}
	return append(slices.Clone(sh), strings.Join(c.CmdLine, " "))
}

// expose is EXPOSE: TCP ports and ranges (a sandbox's ports are TCP).
func (b *builder) expose(st *stageState, c *instructions.ExposeCommand) error {
	ports := slices.Clone(st.img.Config.ExposedPorts)
	for _, p := range c.Ports {
		spec, proto, _ := strings.Cut(p, "/")
		if proto != "" && !strings.EqualFold(proto, "tcp") {
			return errdefs.New(errdefs.ErrBadInput, "EXPOSE %s: only TCP ports are served by a sandbox", p)
		}
		lo, hi, isRange := strings.Cut(spec, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err := errors.Join(err1, err2); err != nil || l < 1 || h > 65535 || l > h {
			return errdefs.New(errdefs.ErrBadInput, "EXPOSE %s: a port is a number from 1 to 65535 (or a range N-M)", p)
		}
		if h-l >= 1024 {
			return errdefs.New(errdefs.ErrBadInput, "EXPOSE %s: a range of more than 1024 ports", p)
		}
		for n := l; n <= h; n++ {
			ports = append(ports, n)
		}
	}
	slices.Sort(ports)
	st.img.Config.ExposedPorts = slices.Compact(ports)
	return nil
}

// run is RUN, in the Runner's sandbox.
func (b *builder) run(ctx context.Context, st *stageState, c *instructions.RunCommand) error {
	if len(c.FlagsUsed) > 0 {
		return errdefs.New(errdefs.ErrBadInput, "RUN --%s is not supported: a RUN has the image and its own network only; remove the flag", c.FlagsUsed[0])
	}
	if len(c.Files) > 0 {
		return errdefs.New(errdefs.ErrBadInput, "RUN with a here-document is not supported: write the script to a file in the context, COPY it and RUN it")
	}
	step := RunStep{
		Args:    st.shellForm(c.ShellDependantCmdLine),
		Env:     slices.Clone(st.env),
		User:    st.img.Config.User,
		Workdir: st.img.Config.WorkingDir,
	}
	if !hasEnv(step.Env, "PATH") {
		step.Env = append(step.Env, defaultPath)
	}
	if step.Workdir == "" {
		step.Workdir = "/"
	}
	if len(step.Args) == 0 {
		return errdefs.New(errdefs.ErrBadInput, "RUN needs a command")
	}
	key := chainKey(st.key, "RUN", step, st.args)
	return b.layerStep(ctx, st, key, func(ctx context.Context) (string, error) {
		dir, err := b.opts.Runner.Run(ctx, cloneImage(st.img), step, b.out)
		if err != nil {
			if _, known := errdefs.Lookup(err); !known && ctx.Err() == nil {
				err = errdefs.Mark(errdefs.ErrBadInput, err)
			}
			return "", err
		}
		return dir, nil
	})
}

// workdir is WORKDIR: relative to the one before, and made (as a layer)
// when the image does not have it, as Docker does.
func (b *builder) workdir(ctx context.Context, st *stageState, c *instructions.WorkdirCommand) error {
	wd := c.Path
	if !path.IsAbs(wd) {
		wd = path.Join("/", st.img.Config.WorkingDir, wd)
	}
	wd = path.Clean(wd)
	st.img.Config.WorkingDir = wd
	key := chainKey(st.key, "WORKDIR", wd)
	info, err := b.lookup(st.img, wd)
	if err != nil {
		return err
	}
	if info != nil {
		if !info.mode.IsDir() {
			return errdefs.New(errdefs.ErrBadInput, "%s is not a directory in the image", wd)
		}
		st.key = key
		return nil
	}
	return b.layerStep(ctx, st, key, func(ctx context.Context) (string, error) {
		w, err := b.newLayerWriter(st.img, 0, 0)
		if err != nil {
			return "", err
		}
		if err := w.ensureDir(strings.TrimPrefix(wd, "/")); err != nil {
			return "", w.abort(err)
		}
		return w.finish()
	})
}
