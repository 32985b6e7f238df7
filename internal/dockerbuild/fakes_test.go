package dockerbuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sandstorm/internal/errdefs"
)

// fakeStore keeps layers as directories under root/layers, made in
// root/tmp.
type fakeStore struct {
	root string
	n    int
}

func newFakeStore(t *testing.T) *fakeStore {
	s := &fakeStore{root: t.TempDir()}
	for _, d := range []string{"tmp", "layers"} {
		if err := os.Mkdir(filepath.Join(s.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *fakeStore) TempDir() (string, error) {
	return os.MkdirTemp(filepath.Join(s.root, "tmp"), "layer-")
}

func (s *fakeStore) Add(_ context.Context, dir string) (string, error) {
	s.n++
	id := fmt.Sprintf("layer-%d", s.n)
	return id, os.Rename(dir, filepath.Join(s.root, "layers", id))
}

func (s *fakeStore) Dir(id string) (string, error) {
	d := filepath.Join(s.root, "layers", id)
	if _, err := os.Lstat(d); err != nil {
		return "", errdefs.Mark(errdefs.ErrNotFound, err)
	}
	return d, nil
}

// tmpLeft is what is left in the store's temporary directory.
func (s *fakeStore) tmpLeft(t *testing.T) []string {
	ents, err := os.ReadDir(filepath.Join(s.root, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// fakeRunner "runs" a step by writing a file named after it into a new
// layer; a command containing "exit 1" fails after printing.
type fakeRunner struct {
	store *fakeStore
	steps []RunStep
}

func (r *fakeRunner) Run(_ context.Context, img Image, step RunStep, out io.Writer) (string, error) {
	r.steps = append(r.steps, step)
	cmd := step.Args[len(step.Args)-1]
	fmt.Fprintf(out, "running %s\n", cmd)
	dir, err := r.store.TempDir()
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	name := fmt.Sprintf("run-%d", len(r.steps))
	if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(step.Args, " ")), 0o644); err != nil {
		return "", err
	}
	if strings.Contains(cmd, "exit 1") {
		os.RemoveAll(dir)
		return "", errors.New("exit status 1")
	}
	return dir, nil
}

// commands are the commands run, the shell's last word of each.
func (r *fakeRunner) commands() []string {
	var c []string
	for _, s := range r.steps {
		c = append(c, s.Args[len(s.Args)-1])
	}
	return c
}

// fakeBase knows images by name.
type fakeBase map[string]Image

func (b fakeBase) From(_ context.Context, name string) (Image, error) {
	img, ok := b[name]
	if !ok {
		return Image{}, errdefs.New(errdefs.ErrNotFound, "image %s not found", name)
	}
	return cloneImage(img), nil
}

// env is one test's build setting.
type env struct {
	t      *testing.T
	store  *fakeStore
	runner *fakeRunner
	base   fakeBase
	ctxDir string
	cache  string
	out    bytes.Buffer
}

// newEnv is a store with a "debian" image (a passwd with app 1000:1000,
// /home/app 0750 of app, /bin -> usr/bin) and an empty build context.
func newEnv(t *testing.T) *env {
	e := &env{t: t, store: newFakeStore(t), ctxDir: t.TempDir(), cache: filepath.Join(t.TempDir(), "cache")}
	e.runner = &fakeRunner{store: e.store}
	dir, err := e.store.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.Chmod(dir, 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "usr/bin"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "home"), 0o755))
	must(t, os.Mkdir(filepath.Join(dir, "home/app"), 0o750))
	must(t, os.Chown(filepath.Join(dir, "home/app"), 1000, 1000))
	must(t, os.Symlink("usr/bin", filepath.Join(dir, "bin")))
	must(t, os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\nstaff:x:50:\n"), 0o644))
	id, err := e.store.Add(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	e.base = fakeBase{"debian": {Layers: []string{id}, Config: ImageConfig{
		Env: []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}, Cmd: []string{"bash"}}}}
	return e
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// file writes a file of the build context.
func (e *env) file(name, content string) {
	p := filepath.Join(e.ctxDir, name)
	must(e.t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(e.t, os.WriteFile(p, []byte(content), 0o644))
}

func (e *env) build(dockerfile string, args map[string]string) (Image, error) {
	e.out.Reset()
	return Build(context.Background(), BuildOptions{
		Dockerfile: []byte(dockerfile), ContextDir: e.ctxDir, BuildArgs: args, CacheDir: e.cache,
		Base: e.base, Runner: e.runner, Store: e.store, Out: &e.out,
	})
}

func (e *env) mustBuild(dockerfile string, args map[string]string) Image {
	e.t.Helper()
	img, err := e.build(dockerfile, args)
	if err != nil {
		e.t.Fatalf("build: %v\noutput:\n%s", err, e.out.String())
	}
	return img
}

// layer is the directory of img's top layer.
func (e *env) layer(img Image, fromTop int) string {
	d, err := e.store.Dir(img.Layers[len(img.Layers)-1-fromTop])
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// cacheEntries is how many entries the step cache holds.
func (e *env) cacheEntries() []string {
	ents, err := os.ReadDir(e.cache)
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	slices.Sort(names)
	return names
}
