package fleet

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/layercache"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/store"
)

// layerNode is a fake node's image layers: a real layer cache (digests
// checked, layers extracted) and the trees it flattens from them, with
// what it was sent counted.
type layerNode struct {
	cache layercache.Cache
	trees rootfs.Cache
	puts  []string // the layers it was sent, in order
	bytes int64    // what those streams held
}

func (n *node) Layers(_ context.Context, digests []string) ([]string, error) {
	return n.layers.cache.Missing(digests)
}

func (n *node) PutLayer(_ context.Context, d string, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.layers.puts = append(n.layers.puts, d)
	n.layers.bytes += int64(len(b))
	n.mu.Unlock()
	return n.layers.cache.Put(d, bytes.NewReader(b), rootfs.Limits{})
}

// fromLayers makes t's tree from the layers it has, as a node does (n.mu
// held); false if it cannot.
func (n *node) fromLayers(t api.Template) bool {
	if n.layers == nil || len(t.Layers) == 0 {
		return false
	}
	if _, err := n.layers.cache.Flatten(t.Layers, t.Digest, n.layers.trees); err != nil {
		return false
	}
	n.rootfs[t.Digest] = true
	return true
}

// masterLayer is a layer in the master's store: dir's files.
func masterLayer(t *testing.T, store, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(store, name)
	for p, body := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// imageTemplate is a template of the layers (dirs of idx), flattened as
// the master does, named by its tree's digest and its layers'.
func imageTemplate(t *testing.T, idx layercache.Index, name string, dirs ...string) store.Template {
	t.Helper()
	tree := t.TempDir()
	if err := rootfs.Flatten(dirs, tree); err != nil {
		t.Fatal(err)
	}
	tp := store.Template{Name: name, Rootfs: tree}
	var err error
	if tp.Digest, err = rootfs.Digest(tree); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		ld, err := idx.Digest(d)
		if err != nil {
			t.Fatal(err)
		}
		tp.Layers = append(tp.Layers, ld)
	}
	return tp
}

// TestPrepareSendsOnlyTheLayersANodeLacks: a paired node gets an image
// template as the layers it lacks and makes the tree itself; a second
// template of the same base image costs only its own layer (a node that
// has the layers fetches nothing more); a template whose layers do not
// make its tree is sent its tree whole.
func TestPrepareSendsOnlyTheLayersANodeLacks(t *testing.T) {
	ctx := context.Background()
	layers := t.TempDir()
	idx := layercache.Index{Dir: layers}
	base := masterLayer(t, layers, "sha256-base", map[string]string{"etc/os-release": "base\n", "usr/bin/tool": string(make([]byte, 64<<10))})
	app1 := masterLayer(t, layers, "sha256-app1", map[string]string{"srv/app": "one\n"})
	app2 := masterLayer(t, layers, "sha256-app2", map[string]string{"srv/app": "two\n"})
	one := imageTemplate(t, idx, "one", base, app1)
	two := imageTemplate(t, idx, "two", base, app2)

	remote := &node{name: "far", rootfs: map[string]bool{}, layers: &layerNode{
		cache: layercache.Cache{Dir: filepath.Join(t.TempDir(), "layer-cache")}, trees: rootfs.Cache{Dir: filepath.Join(t.TempDir(), "rootfs")}}}
	f := fleetOf(t, &node{name: "local"}, remote)
	f.cfg.Layer = idx.Layer

	if err := f.PrepareTemplate(ctx, one); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(remote.layers.puts, one.Layers) || remote.sent != 0 || !remote.rootfs[one.Digest] {
		t.Fatalf("template one: layers sent %v (want %v), trees sent %d (want none), tree made %v", remote.layers.puts, one.Layers, remote.sent, remote.rootfs[one.Digest])
	}
	before := remote.layers.bytes
	if err := f.PrepareTemplate(ctx, two); err != nil {
		t.Fatal(err)
	}
	var app2Tar countingWriter
	layercache.Pack(app2, &app2Tar)
	if got := remote.layers.puts[2:]; !slices.Equal(got, two.Layers[1:]) || remote.layers.bytes-before != app2Tar.n || remote.sent != 0 {
		t.Errorf("template two: layers sent %v (want only %v), %d bytes (its layer is %d), trees sent %d", got, two.Layers[1:], remote.layers.bytes-before, app2Tar.n, remote.sent)
	}
	if p, ok := remote.layers.trees.Path(two.Digest); !ok {
		t.Error("the node has no tree of template two")
	} else if b, _ := os.ReadFile(filepath.Join(p, "srv", "app")); string(b) != "two\n" {
		t.Errorf("template two's tree on the node has srv/app %q", b)
	}

	// Layers that do not make the template's tree: its tree goes whole.
	tree := masterLayer(t, t.TempDir(), "tree", map[string]string{"other": "x\n"})
	wrong := store.Template{Name: "wrong", Rootfs: tree, Layers: one.Layers}
	wrong.Digest, _ = rootfs.Digest(tree)
	if err := f.PrepareTemplate(ctx, wrong); err != nil {
		t.Fatal(err)
	}
	if remote.sent != 1 || !remote.rootfs[wrong.Digest] || len(remote.layers.puts) != 3 {
		t.Errorf("a template its layers do not make: trees sent %d (want 1), layers sent %v", remote.sent, remote.layers.puts)
	}
}

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }
