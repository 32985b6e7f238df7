package nodeside

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/layercache"
	"sandstorm/internal/node"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/sandbox/process"
	"sandstorm/internal/store"
)

// side is a node with its own templates (a paired node's side), its
// trees and layers under dir; its runtime runs nothing here.
func side(t *testing.T) (*Side, *bytes.Buffer) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	be, err := process.New(filepath.Join(dir, "process"))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	nd, err := node.New(node.Config{Name: "far", DataDir: dir, Store: st, Backend: be, PortMin: 40000, PortMax: 40010, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return &Side{N: nd, St: st, OwnTemplates: true, Rootfs: rootfs.Cache{Dir: filepath.Join(dir, "rootfs")},
		LayerCache: layercache.Cache{Dir: filepath.Join(dir, "layer-cache")}, Log: log}, &logs
}

// layerDir is a layer in the master's store: files under store/name.
func layerDir(t *testing.T, store, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(store, name)
	for p, body := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// image is a template of dirs as the master makes it: flattened, named
// by its tree's digest and its layers'.
func image(t *testing.T, name string, dirs ...string) (api.Template, map[string][]byte) {
	t.Helper()
	tree := t.TempDir()
	if err := rootfs.Flatten(dirs, tree); err != nil {
		t.Fatal(err)
	}
	d, err := rootfs.Digest(tree)
	if err != nil {
		t.Fatal(err)
	}
	tp := api.Template{Name: name, Digest: d, Process: api.Process{Args: []string{"/bin/app"}}}
	tars := map[string][]byte{}
	for _, dir := range dirs {
		var b bytes.Buffer
		if err := layercache.Pack(dir, &b); err != nil {
			t.Fatal(err)
		}
		ld, _ := layercache.Digest(dir)
		tp.Layers = append(tp.Layers, ld)
		tars[ld] = b.Bytes()
	}
	return tp, tars
}

// TestTemplatesByLayers: a paired node's side lacks an image template's
// tree and its layers, refuses a layer that is not its digest, takes
// the right ones and makes the tree from them; a second template of the
// same base needs only its own layer; layers that do not make a tree
// are refused; a layer goes with the last template that uses it.
func TestTemplatesByLayers(t *testing.T) {
	ctx := context.Background()
	s, logs := side(t)
	store := t.TempDir()
	base := layerDir(t, store, "base", map[string]string{"etc/os-release": "base\n", "bin/app": "#!/bin/sh\n"})
	one, tars := image(t, "one", base, layerDir(t, store, "one", map[string]string{"srv/app": "one\n"}))
	two, tars2 := image(t, "two", base, layerDir(t, store, "two", map[string]string{"srv/app": "two\n"}))
	received := func() int { return strings.Count(logs.String(), "image layer received") }

	if m, err := s.Layers(ctx, one.Layers); err != nil || !slices.Equal(m, one.Layers) {
		t.Fatalf("layers missing: %v %v", m, err)
	}
	if err := s.PrepareTemplate(ctx, one); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("a template whose tree and layers the node lacks: %v", err)
	}
	if err := s.PutLayer(ctx, one.Layers[0], bytes.NewReader(tars[one.Layers[1]])); !errors.Is(err, errdefs.ErrBadInput) || received() != 0 {
		t.Errorf("a layer sent under another's digest: %v (%d received)", err, received())
	}
	for _, d := range one.Layers {
		if err := s.PutLayer(ctx, d, bytes.NewReader(tars[d])); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PrepareTemplate(ctx, one); err != nil {
		t.Fatalf("a template whose layers the node has: %v", err)
	}
	rec, err := s.St.GetTemplate(ctx, "one")
	if p, ok := s.Rootfs.Path(one.Digest); err != nil || !ok || rec.Rootfs != p || !slices.Equal(rec.Layers, one.Layers) {
		t.Errorf("template one recorded as %+v (%v); want its tree in the cache (%s) and its layers", rec, err, p)
	}
	if m, err := s.Layers(ctx, two.Layers); err != nil || !slices.Equal(m, two.Layers[1:]) {
		t.Errorf("a second template of the base lacks %v (%v); want only its own layer", m, err)
	}
	if err := s.PutLayer(ctx, two.Layers[1], bytes.NewReader(tars2[two.Layers[1]])); err != nil {
		t.Fatal(err)
	}
	if err := s.PrepareTemplate(ctx, two); err != nil {
		t.Fatal(err)
	}
	if received() != 3 || strings.Count(logs.String(), one.Layers[0]) != 1 {
		t.Errorf("%d layers received (want 3: the base once):\n%s", received(), logs)
	}

	// The base alone does not make template one's tree.
	wrong := api.Template{Name: "wrong", Digest: two.Digest, Layers: one.Layers[:1], Process: one.Process}
	s.Rootfs.Remove(two.Digest)
	if err := s.PrepareTemplate(ctx, wrong); !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "flatten to") {
		t.Errorf("layers that do not make the tree: %v", err)
	}
	if _, ok := s.Rootfs.Path(two.Digest); ok {
		t.Error("a tree that is not its digest was kept")
	}

	if err := s.DropTemplate(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Layers(ctx, one.Layers); !slices.Equal(m, one.Layers[1:]) {
		t.Errorf("after template one went, the node lacks %v; want its own layer only (the base is two's)", m)
	}
	if err := s.DropTemplate(ctx, "two"); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Layers(ctx, two.Layers); !slices.Equal(m, two.Layers) {
		t.Errorf("after the last template went, the node lacks %v; want every layer", m)
	}
}
