package imagetemplate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/ociimage"
)

// rootfsWith is a rootfs with python3 on /usr/bin (a link, as Debian's)
// and an account "app".
func rootfsWith(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "usr", "bin"), 0o755)
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "usr", "bin", "python3.11"), []byte("#!"), 0o755)
	os.Symlink("python3.11", filepath.Join(dir, "usr", "bin", "python3"))
	os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc", "group"), []byte("root:x:0:\napp:x:1002:\n"), 0o644)
	return dir
}

// TestFill: what the request leaves unsaid comes from the image, as
// docker run takes it; what it says wins.
func TestFill(t *testing.T) {
	dir := rootfsWith(t)
	cfg := ociimage.ImageConfig{Args: []string{"python3", "-m", "http.server"}, Env: []string{"PATH=/usr/bin", "A=1", "B=2"}, WorkingDir: "/srv", User: "app", Ports: []int{8000}}
	req := api.TemplateRequest{Name: "t", Process: api.Process{Env: []string{"B=3", "C=4"}}}
	if err := Fill(&req, cfg, dir); err != nil {
		t.Fatal(err)
	}
	p := req.Process
	if !slices.Equal(p.Args, []string{"/usr/bin/python3", "-m", "http.server"}) || p.Cwd != "/srv" || p.User != "1001:1002" || !slices.Equal(req.Ports, []int{8000}) {
		t.Errorf("filled: %+v ports %v", p, req.Ports)
	}
	if !slices.Equal(p.Env, []string{"PATH=/usr/bin", "A=1", "B=3", "C=4"}) {
		t.Errorf("env: %v; want the image's with the request's replacing by key", p.Env)
	}

	own := api.TemplateRequest{Name: "t", Process: api.Process{Args: []string{"/usr/bin/python3", "x.py"}, Cwd: "/", User: "0:0"}, Ports: []int{9000}}
	if err := Fill(&own, cfg, dir); err != nil || own.Process.Args[1] != "x.py" || own.Process.Cwd != "/" || own.Process.User != "0:0" || !slices.Equal(own.Ports, []int{9000}) {
		t.Errorf("a request that says it all: %+v %v, %v", own.Process, own.Ports, err)
	}

	for name, c := range map[string]ociimage.ImageConfig{
		"no command":      {},
		"no such program": {Args: []string{"node"}, Env: []string{"PATH=/usr/bin"}},
		"no such user":    {Args: []string{"/usr/bin/python3"}, User: "nobody-here"},
	} {
		r := api.TemplateRequest{Name: "t"}
		if err := Fill(&r, c, dir); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%s: %v, want bad input", name, err)
		}
	}
}

// TestNodeFiles: a RUN's layer leaves out what the node put in the
// sandbox's upper layer, and nothing else.
func TestNodeFiles(t *testing.T) {
	for _, n := range []string{"proc", "dev/null", "sys/", "tmp/x", ".sandstorm/sandstorm-envd", "etc/resolv.conf", "./etc/resolv.conf"} {
		if !nodeFile(n) {
			t.Errorf("%s is the node's", n)
		}
	}
	for _, n := range []string{"etc", "etc/hosts", "srv/tmp", "usr/lib/proc", "devices"} {
		if nodeFile(n) {
			t.Errorf("%s is the step's", n)
		}
	}
}

// TestLayerStoreDir: a layer id names a directory of the store and
// nothing outside it.
func TestLayerStoreDir(t *testing.T) {
	store := t.TempDir()
	os.Mkdir(filepath.Join(store, "sha256-abc"), 0o755)
	s := &layerStore{b: &Builder{Puller: &Puller{Layers: &ociimage.Store{Dir: store}}, Templates: func(_ context.Context, name string) (api.Template, error) {
		return api.Template{}, errdefs.New(errdefs.ErrNotFound, "no")
	}}}
	if d, err := s.Dir("sha256-abc"); err != nil || d != filepath.Join(store, "sha256-abc") {
		t.Errorf("a layer: %q, %v", d, err)
	}
	for _, bad := range []string{"", ".", "..", "../x", "a/b", "sha256-gone", "template:x@sha256:1"} {
		if _, err := s.Dir(bad); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%q: %v, want not found", bad, err)
		}
	}
}

// TestLayerStoreMadeByABuild: a build's first step on a data dir where
// nothing was pulled yet makes the layer store (a RUN from a registered
// template failed with "stat …/layers: no such file or directory").
func TestLayerStoreMadeByABuild(t *testing.T) {
	store := filepath.Join(t.TempDir(), "layers")
	s := &layerStore{b: &Builder{Puller: &Puller{Layers: &ociimage.Store{Dir: store}}}}
	d, err := s.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(d) != store {
		t.Errorf("a build's directory %q is not in the store %q", d, store)
	}
	if fi, err := os.Stat(store); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the store: %v %v, want a directory of mode 0700", fi, err)
	}
}
