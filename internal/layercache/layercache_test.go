package layercache

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
)

type entry struct {
	name, body string
	typ        byte
}

// layer unpacks an OCI layer of ents into store/name, as the master's
// layer store does (rootfs.UnpackLayer: whiteouts as devices 0:0).
func layer(t *testing.T, store, name string, ents ...entry) string {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, ModTime: time.Unix(1700000000, 123456789)}
		if e.typ == tar.TypeDir {
			hdr.Mode = 0o755
		}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	dir := filepath.Join(store, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := rootfs.UnpackLayer(&b, dir, rootfs.Limits{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// base and top are an image's two layers: top deletes a file of base's
// (a whiteout) and makes a directory of base's anew (opaque).
func baseAndTop(t *testing.T, store string) (string, string) {
	base := layer(t, store, "sha256-base",
		entry{name: "etc/", typ: tar.TypeDir}, entry{name: "etc/os", body: "base\n", typ: tar.TypeReg},
		entry{name: "opt/", typ: tar.TypeDir}, entry{name: "opt/old", body: "old\n", typ: tar.TypeReg},
		entry{name: "gone", body: "deleted above\n", typ: tar.TypeReg})
	top := layer(t, store, "sha256-top",
		entry{name: ".wh.gone", typ: tar.TypeReg},
		entry{name: "opt/", typ: tar.TypeDir}, entry{name: "opt/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "opt/new", body: "new\n", typ: tar.TypeReg})
	return base, top
}

func packed(t *testing.T, dir string) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Pack(dir, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestDigestIsTheTreeAlone: a layer's digest stays what it was after its
// files are read and linked into a template's tree (their atime and
// ctime move: rootfs.PackVolume's own tar would change).
func TestDigestIsTheTreeAlone(t *testing.T) {
	base, _ := baseAndTop(t, t.TempDir())
	before, err := Digest(base)
	if err != nil {
		t.Fatal(err)
	}
	os.ReadFile(filepath.Join(base, "etc", "os"))
	if err := rootfs.Flatten([]string{base}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if after, err := Digest(base); err != nil || after != before {
		t.Errorf("the digest moved: %s, then %s (%v)", before, after, err)
	}
	var pv bytes.Buffer
	tw := tar.NewWriter(&pv)
	rootfs.PackVolume(base, tw, "")
	tw.Close()
	if !strings.Contains(pv.String(), "ctime=") || strings.Contains(string(packed(t, base)), "ctime=") {
		t.Error("Pack should be PackVolume's tar less its change times")
	}
}

// TestIndex: a layer's digest is learnt once and the layer found by it;
// a directory outside the store has none.
func TestIndex(t *testing.T) {
	store := t.TempDir()
	base, _ := baseAndTop(t, store)
	x := Index{Dir: store}
	d, err := x.Digest(base)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := Digest(base); d != want {
		t.Errorf("index digest %s, packed %s", d, want)
	}
	if dir, ok := x.Layer(d); !ok || dir != base {
		t.Errorf("Layer(%s) = %s, %v; want %s", d, dir, ok, base)
	}
	// What it learnt is what it answers from then on.
	kept, err := os.ReadFile(filepath.Join(store, ".trees", "sha256-base"))
	if err != nil || string(kept) != d {
		t.Errorf("kept %q (%v), want %s", kept, err, d)
	}
	if again, err := x.Digest(base); err != nil || again != d {
		t.Errorf("second Digest: %s %v", again, err)
	}
	if _, ok := x.Layer("sha256:" + strings.Repeat("0", 64)); ok {
		t.Error("an unknown digest has a layer")
	}
	if _, err := x.Digest(t.TempDir()); err == nil {
		t.Error("a directory outside the store got a digest")
	}
}

// TestCacheShipsAnImage: a node sent an image's layers (Pack's streams)
// keeps each only if it hashes to its digest, and flattens them into
// the same tree the master flattened from its own, or into nothing if
// the tree asked for is another.
func TestCacheShipsAnImage(t *testing.T) {
	master := t.TempDir()
	base, top := baseAndTop(t, master)
	tree := t.TempDir()
	if err := rootfs.Flatten([]string{base, top}, tree); err != nil {
		t.Fatal(err)
	}
	want, _ := rootfs.Digest(tree)
	db, _ := Digest(base)
	dt, _ := Digest(top)
	c := Cache{Dir: filepath.Join(t.TempDir(), "layer-cache")}
	trees := rootfs.Cache{Dir: filepath.Join(t.TempDir(), "rootfs")}
	if m, err := c.Missing([]string{db, dt}); err != nil || !slices.Equal(m, []string{db, dt}) {
		t.Fatalf("missing %v %v", m, err)
	}
	if _, err := c.Missing([]string{"sha256:../x"}); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a digest that is not one: %v", err)
	}
	if err := c.Put(db, bytes.NewReader(packed(t, top)), rootfs.Limits{}); !errors.Is(err, rootfs.ErrDigestMismatch) {
		t.Errorf("a layer under another's digest: %v", err)
	}
	if ents, _ := os.ReadDir(c.Dir); len(ents) != 0 {
		t.Errorf("a refused layer left %v", ents)
	}
	if _, err := c.Flatten([]string{db, dt}, want, trees); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("flatten without the layers: %v", err)
	}
	for _, l := range []struct{ d, dir string }{{db, base}, {dt, top}} {
		if err := c.Put(l.d, bytes.NewReader(packed(t, l.dir)), rootfs.Limits{}); err != nil {
			t.Fatalf("put %s: %v", l.dir, err)
		}
	}
	if m, err := c.Missing([]string{db, dt}); err != nil || len(m) != 0 {
		t.Errorf("missing after the puts: %v %v", m, err)
	}
	other := rootfs.DigestPrefix + strings.Repeat("ab", 32)
	if _, err := c.Flatten([]string{db, dt}, other, trees); !errors.Is(err, rootfs.ErrDigestMismatch) {
		t.Errorf("flatten to another tree's digest: %v", err)
	}
	if ents, _ := os.ReadDir(trees.Dir); len(ents) != 0 {
		t.Errorf("a refused tree left %v", ents)
	}
	p, err := c.Flatten([]string{db, dt}, want, trees)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := rootfs.Digest(p); got != want {
		t.Errorf("the node's tree is %s, the master's %s", got, want)
	}
	if _, err := os.Lstat(filepath.Join(p, "gone")); !os.IsNotExist(err) {
		t.Errorf("the whiteout did not delete: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(p, "opt", "old")); !os.IsNotExist(err) {
		t.Errorf("the opaque directory did not hide: %v", err)
	}
}

// TestCacheRefusesAnUnsafeLayer: a layer that climbs out of itself is
// refused and leaves nothing, whatever its digest.
func TestCacheRefusesAnUnsafeLayer(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	c := Cache{Dir: t.TempDir()}
	err := c.Put(rootfs.DigestPrefix+strings.Repeat("0", 64), &b, rootfs.Limits{})
	if !errors.Is(err, rootfs.ErrUnsafe) {
		t.Errorf("a climb out: %v", err)
	}
	if ents, _ := os.ReadDir(c.Dir); len(ents) != 0 {
		t.Errorf("a refused layer left %v", ents)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(c.Dir), "escape")); !os.IsNotExist(err) {
		t.Error("the layer wrote outside the cache")
	}
}
