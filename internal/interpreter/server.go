// Package interpreter is the code interpreter server E2B's
// @e2b/code-interpreter SDK talks to inside a sandbox (port 49999): it
// runs code in Jupyter kernels it starts and drives over the Jupyter
// messaging protocol (ZeroMQ), and streams what the code prints,
// displays and raises back as the SDK reads it.
//
// The API (the SDK's sandbox.ts): POST /execute runs code in a context
// (a kernel with its own variables and working directory) and answers
// newline-delimited JSON (execute.go); POST /contexts makes a context,
// GET /contexts lists them, DELETE /contexts/{id} removes one, POST
// /contexts/{id}/restart starts its kernel afresh; GET /health answers
// once the default Python context's kernel is running. Python,
// JavaScript, TypeScript, R, Java and bash kernels are served (languages.go):
// other languages are refused.
package interpreter

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// Port is where the server listens in a sandbox: the SDK's JUPYTER_PORT.
const Port = api.CodeInterpreterPort

// bootstrap is what every kernel runs first: the chart format
// (charts.py), then the other formats, which install it (bootstrap.py).
//
//go:embed charts.py
var charts string

//go:embed bootstrap.py
var formats string

// bashKernelSource is the bash kernel (languages.go).
//
//go:embed bashkernel.py
var bashKernelSource string

// jsKernelSource and jsRunnerSource are the JavaScript and TypeScript
// kernel (languages.go) and the Node.js evaluator it drives.
//
//go:embed jskernel.py
var jsKernelSource string

//go:embed jsrunner.js
var jsRunnerSource string

// javaKernelSource and javaRunnerSource are the Java kernel (languages.go)
// and the JShell evaluator it drives.
//
//go:embed javakernel.py
var javaKernelSource string

//go:embed JavaRunner.java
var javaRunnerSource string

var bootstrap = charts + "\n" + formats

// Config is how the server starts kernels.
type Config struct {
	// Python is the interpreter with ipykernel (default "python3"); the
	// bash kernel runs on it too.
	Python string
	// R is R with IRkernel installed (default "R").
	R string
	// Bash is the shell the bash kernel runs (default "bash").
	Bash string
	// Node is the Node.js the JavaScript and TypeScript kernel runs
	// (default "node"), with TypeScript's compiler where it finds its
	// modules (Debian's node-typescript).
	Node string
	// Java is the JDK's java launcher the Java kernel runs JShell with
	// (default "java"; Debian's openjdk-17-jdk-headless).
	Java string
	// Workdir is a context's working directory when its create names none
	// (default: the current directory).
	Workdir string
	// StateDir holds the kernels' startup file (default: a new temporary
	// directory).
	StateDir string
	// Env is every kernel's environment; nil: this process's.
	Env []string
	// User, when set, is the account kernels run as (a name in
	// /etc/passwd), with its home as HOME: E2B's kernels run as "user".
	User string
	// KernelReady bounds a kernel's start (default 2 min: a Python with
	// numpy and pandas installed starts in seconds, more on a loaded
	// machine).
	KernelReady time.Duration
}

// Server serves the code interpreter API.
type Server struct {
	cfg        Config
	startup    string // bootstrap.py's path
	bashKernel string // bashkernel.py's path
	jsKernel   string // jskernel.py's path (jsrunner.js is beside it)
	javaKernel string // javakernel.py's path (JavaRunner.java is beside it)
	cred       *syscall.Credential
	ready      chan struct{} // closed once the default context answers

	mu       sync.Mutex
	contexts map[string]*codeContext
	made     uint64 // contexts made so far (codeContext.seq)
	// defaults is the context /execute uses for a language when it names
	// no context: made on first use, the default Python one at start.
	defaults map[string]string
}

// codeContext is one context: a kernel and what it was made with.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
	// seq orders contexts by creation: a list gives them in that order,
	// the newest last, as E2B's does.
	seq uint64

	// run is held by the execution in progress: a kernel runs one cell at
	// a time, and per-call environment variables must not leak into the
	// next call's.
	run sync.Mutex
	// kmu guards kernel, which a restart replaces while an execution may
	// hold run.
	kmu    sync.Mutex
	kernel *kernel
	// env is the sandbox environment last set in the kernel.
	env map[string]string
}

// New makes a server and starts its default Python context, returning
// once its kernel answers.
func New(cfg Config) (*Server, error) {
	s, err := Prepare(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Prepare makes a server without starting its default context: its
// Handler may listen at once, answering /health with 503 and holding
// other calls until Start has. A cold-started sandbox's first call then
// waits for the kernel rather than finding the port closed.
func Prepare(cfg Config) (*Server, error) {
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if cfg.Workdir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("interpreter: %w", err)
		}
		cfg.Workdir = wd
	}
	cfg.R = cmp.Or(cfg.R, "R")
	cfg.Bash = cmp.Or(cfg.Bash, "bash")
	cfg.Node = cmp.Or(cfg.Node, "node")
	cfg.Java = cmp.Or(cfg.Java, "java")
	if cfg.KernelReady == 0 {
		cfg.KernelReady = 2 * time.Minute
	}
	if cfg.StateDir == "" {
		d, err := os.MkdirTemp("", "sandstorm-interpreter-")
		if err != nil {
			return nil, fmt.Errorf("interpreter: %w", err)
		}
		cfg.StateDir = d
	}
	// Kernels that run as another user read bootstrap.py from it.
	if err := os.Chmod(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("interpreter: %w", err)
	}
	s := &Server{cfg: cfg, startup: filepath.Join(cfg.StateDir, "bootstrap.py"),
		bashKernel: filepath.Join(cfg.StateDir, "bashkernel.py"), jsKernel: filepath.Join(cfg.StateDir, "jskernel.py"),
		javaKernel: filepath.Join(cfg.StateDir, "javakernel.py"),
		ready:      make(chan struct{}),
		contexts:   map[string]*codeContext{}, defaults: map[string]string{}}
	if cfg.User != "" {
		if err := s.setUser(cfg.User); err != nil {
			return nil, err
		}
	}
	if err := s.setStateDirs(); err != nil {
		return nil, err
	}
	for _, f := range []struct{ path, text string }{{s.startup, bootstrap}, {s.bashKernel, bashKernelSource},
		{s.jsKernel, jsKernelSource}, {filepath.Join(cfg.StateDir, "jsrunner.js"), jsRunnerSource},
		{s.javaKernel, javaKernelSource}, {filepath.Join(cfg.StateDir, "JavaRunner.java"), javaRunnerSource}} {
		if err := os.WriteFile(f.path, []byte(f.text), 0o644); err != nil {
			return nil, fmt.Errorf("interpreter: %w", err)
		}
	}
	return s, nil
}

// Start starts the default contexts, and the server serves. They are
// E2B's (its server's main.py): Python, and JavaScript where Node.js is
// installed. JavaScript's kernel starts at its first execution: a
// sandbox that runs none (most: Python is the default) keeps no idle
// kernel for it in memory, nor in its warm image or snapshots.
func (s *Server) Start() error {
	for _, l := range []string{"python", "javascript"} {
		if _, err := s.lookupLanguage(l); err != nil && l != "python" {
			continue
		}
		c, err := s.newContext(l, "", l == "python")
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.defaults[l] = c.ID
		s.mu.Unlock()
	}
	close(s.ready)
	return nil
}

// setUser makes kernels run as the account name, in its environment.
func (s *Server) setUser(name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return errdefs.New(errdefs.ErrBadInput, "interpreter: user %q: %v", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	env := s.cfg.Env
	if env == nil {
		env = os.Environ()
	}
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "HOME" || k == "USER" || k == "LOGNAME"
	})
	s.cfg.Env = append(env, "HOME="+u.HomeDir, "USER="+name, "LOGNAME="+name)
	return nil
}

// setStateDirs gives IPython and Jupyter directories of their own under
// StateDir (a temporary directory: in a sandbox, runsc's /tmp is memory),
// not under HOME: a warm template's process must write nothing to its
// filesystem before its checkpoint, since its sandboxes are restored onto
// a filesystem without it (internal/node/warm), and IPython makes its
// profile and history database there as it starts.
func (s *Server) setStateDirs() error {
	env := s.cfg.Env
	if env == nil {
		env = os.Environ()
	}
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "IPYTHONDIR" || k == "JUPYTER_RUNTIME_DIR"
	})
	for _, d := range []struct{ env, dir string }{{"IPYTHONDIR", "ipython"}, {"JUPYTER_RUNTIME_DIR", "runtime"}} {
		p := filepath.Join(s.cfg.StateDir, d.dir)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("interpreter: %w", err)
		}
		if c := s.cred; c != nil {
			if err := os.Chown(p, int(c.Uid), int(c.Gid)); err != nil {
				return fmt.Errorf("interpreter: %w", err)
			}
		}
		env = append(env, d.env+"="+p)
	}
	s.cfg.Env = env
	return nil
}

// Close ends every kernel.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range s.contexts {
		c.current().close()
		delete(s.contexts, id)
	}
}

// normalizeLanguage is E2B's spelling of a language: python by default,
// js and ts for javascript and typescript.
func normalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

// createContext starts a kernel for language in cwd ("" the default).
func (s *Server) createContext(language, cwd string) (*codeContext, error) {
	return s.newContext(language, cwd, true)
}

// newContext is createContext, whose kernel starts now or, unless start,
// at its first execution (live).
func (s *Server) newContext(language, cwd string, start bool) (*codeContext, error) {
	language = normalizeLanguage(language)
	if _, err := s.lookupLanguage(language); err != nil {
		return nil, err
	}
	if cwd == "" {
		cwd = s.cfg.Workdir
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, errdefs.New(errdefs.ErrBadInput, "working directory %q is not a directory in the sandbox", cwd)
	}
	var k *kernel
	if start {
		var err error
		if k, err = s.startKernel(language, cwd); err != nil {
			return nil, err
		}
	}
	c := &codeContext{ID: newID(), Language: language, Cwd: cwd, kernel: k}
	s.mu.Lock()
	s.made++
	c.seq = s.made
	s.contexts[c.ID] = c
	s.mu.Unlock()
	return c, nil
}

func (s *Server) startKernel(language, cwd string) (*kernel, error) {
	l, err := s.lookupLanguage(language)
	if err != nil {
		return nil, err
	}
	return startKernel(kernelOptions{Argv: func(conn string) []string { return l.argv(s, conn) },
		Dir: cwd, Env: s.cfg.Env, Credential: s.cred, Ready: s.cfg.KernelReady})
}

// context is the context an /execute names, or the language's default
// (made now if it has none).
func (s *Server) context(id, language string) (*codeContext, error) {
	s.mu.Lock()
	if id != "" {
		c := s.contexts[id]
		s.mu.Unlock()
		if c == nil {
			return nil, errdefs.New(errdefs.ErrNotFound, "context %s not found", id)
		}
		return c, nil
	}
	language = normalizeLanguage(language)
	c := s.contexts[s.defaults[language]]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := s.createContext(language, "")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if other := s.contexts[s.defaults[language]]; other != nil {
		// Another call made it meanwhile: use that one.
		delete(s.contexts, c.ID)
		go c.current().close()
		return other, nil
	}
	s.defaults[language] = c.ID
	return c, nil
}

// list is every context, the default ones too, oldest first.
func (s *Server) list() []*codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *codeContext) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// remove ends context id's kernel and forgets it.
func (s *Server) remove(id string) error {
	s.mu.Lock()
	c := s.contexts[id]
	delete(s.contexts, id)
	for l, d := range s.defaults {
		if d == id {
			delete(s.defaults, l)
		}
	}
	s.mu.Unlock()
	if c == nil {
		return errdefs.New(errdefs.ErrNotFound, "context %s not found", id)
	}
	c.current().close()
	return nil
}

// restart replaces context id's kernel by a new one in the same
// directory: its variables are gone, its id is kept. An execution in
// progress ends with an error.
func (s *Server) restart(id string) error {
	s.mu.Lock()
	c := s.contexts[id]
	s.mu.Unlock()
	if c == nil {
		return errdefs.New(errdefs.ErrNotFound, "context %s not found", id)
	}
	c.current().close() // first: it ends the execution holding run
	c.run.Lock()
	defer c.run.Unlock()
	return s.replaceKernel(c)
}

// current is c's kernel now.
func (c *codeContext) current() *kernel {
	c.kmu.Lock()
	defer c.kmu.Unlock()
	return c.kernel
}

// replaceKernel starts a new kernel for c; the caller holds c.run.
func (s *Server) replaceKernel(c *codeContext) error {
	k, err := s.startKernel(c.Language, c.Cwd)
	if err != nil {
		return err
	}
	c.kmu.Lock()
	c.kernel = k
	c.kmu.Unlock()
	c.env = nil
	return nil
}

// live is c's kernel, started now if it has not been (a default context
// Start made without one), or again if it has exited (code that ended
// its process, or a crash), as Jupyter restarts a dead kernel: its
// variables are gone, the context goes on. The caller holds c.run.
func (s *Server) live(c *codeContext) (*kernel, error) {
	k := c.current()
	if k != nil {
		select {
		case <-k.exited:
		default:
			return k, nil
		}
		k.close()
	}
	if err := s.replaceKernel(c); err != nil {
		return nil, err
	}
	return c.current(), nil
}

// reseedCode draws new seeds for Python's and numpy's generators from
// the kernel's entropy source: a sandbox restored from a warm image
// would otherwise draw the same "random" numbers as every other one
// restored from it.
const reseedCode = `import random as __r, sys as __s
__r.seed()
if "numpy" in __s.modules:
    __s.modules["numpy"].random.seed()
del __r, __s
`

// Reseed reseeds every context's kernel (after a restore from a warm
// image, before the sandbox is handed out).
func (s *Server) Reseed(ctx context.Context) error {
	var errs []error
	for _, c := range s.list() {
		code := languages[c.Language].reseed
		if code == "" || c.current() == nil {
			continue
		}
		c.run.Lock()
		err := c.current().execute(ctx, code, true, func(output) {})
		c.run.Unlock()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
