package layercache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sandstorm/internal/rootfs"
)

// Index is the master's way from the layers in its layer store (Dir:
// <data-dir>/layers, ociimage.Store's, whose entries are named by diffID
// or, for a build's, by another digest) to their tree digests and back.
// Each layer is packed once to learn its digest, which is kept under
// Dir/.trees: <layer's name> holds the digest, tree-<hex> is a symlink to
// the layer. A layer directory never changes once it is in the store, so
// neither does what is kept of it.
type Index struct{ Dir string }

// treesDir is where the index keeps what it learnt.
const treesDir = ".trees"

// Digest is the tree digest of the layer at dir, which must be an entry
// of the store; packed the first time it is asked for.
func (x Index) Digest(dir string) (string, error) {
	name := filepath.Base(dir)
	if filepath.Clean(filepath.Dir(dir)) != filepath.Clean(x.Dir) || !safeName(name) {
		return "", fmt.Errorf("layer %s is not in the layer store %s", dir, x.Dir)
	}
	idx := filepath.Join(x.Dir, treesDir)
	if b, err := os.ReadFile(filepath.Join(idx, name)); err == nil && rootfs.ValidDigest(string(b)) {
		return string(b), x.link(string(b), name)
	}
	d, err := Digest(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(idx, 0o700); err != nil {
		return "", err
	}
	// Written whole or not at all: a crash leaves a temporary file, never
	// a digest cut short.
	f, err := os.CreateTemp(idx, ".new-")
	if err != nil {
		return "", err
	}
	_, err = f.WriteString(d)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(idx, name))
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return d, x.link(d, name)
}

// link makes tree-<hex> name the layer called name (if it names none).
func (x Index) link(d, name string) error {
	p := filepath.Join(x.Dir, treesDir, "tree-"+strings.TrimPrefix(d, rootfs.DigestPrefix))
	err := os.Symlink(filepath.Join("..", name), p)
	if errors.Is(err, os.ErrExist) {
		return nil // the same tree in two layers: either will do
	}
	return err
}

// Layer is the layer whose tree digest is d, if the index knows one
// that is still in the store.
func (x Index) Layer(d string) (string, bool) {
	if !rootfs.ValidDigest(d) {
		return "", false
	}
	target, err := os.Readlink(filepath.Join(x.Dir, treesDir, "tree-"+strings.TrimPrefix(d, rootfs.DigestPrefix)))
	if err != nil {
		return "", false
	}
	name, ok := strings.CutPrefix(target, "../")
	if !ok || !safeName(name) {
		return "", false
	}
	p := filepath.Join(x.Dir, name)
	fi, err := os.Lstat(p)
	return p, err == nil && fi.IsDir()
}

// safeName is a plain entry name: no separator, not "." or "..", not a
// temporary one.
func safeName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\x00") && !strings.HasPrefix(name, ".")
}
