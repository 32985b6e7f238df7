package layercache

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
)

// Cache is a node's layers by tree digest under Dir: Dir/<hex> is the
// layer whose Pack digest is sha256:<hex>, in overlayfs form. As
// rootfs.Cache's trees, an entry appears whole or not at all (extracted
// beside it, renamed into place once its stream hashed right), and what
// it is sent is untrusted: extracted with the live move's overlay-form
// rules (rootfs.NewTree: nothing outside the layer, nothing through a
// link, no device but a whiteout, bounded).
type Cache struct{ Dir string }

// ErrBadDigest is wrapped when a digest is not "sha256:" and 64 hex digits.
var ErrBadDigest = errdefs.Refine(errdefs.ErrBadInput, "not a layer digest")

func (c Cache) path(d string) (string, error) {
	if c.Dir == "" {
		return "", errdefs.New(errdefs.ErrNotSupported, "no layer cache (its directory is not set)")
	}
	if !rootfs.ValidDigest(d) {
		return "", fmt.Errorf("%w: %q (want sha256:<64 lowercase hex digits>)", ErrBadDigest, d)
	}
	return filepath.Join(c.Dir, strings.TrimPrefix(d, rootfs.DigestPrefix)), nil
}

// Path is where layer d is, and whether it is there.
func (c Cache) Path(d string) (string, bool) {
	p, err := c.path(d)
	if err != nil {
		return "", false
	}
	fi, err := os.Lstat(p)
	return p, err == nil && fi.IsDir()
}

// Missing is those of ds the cache has not got, in their order.
func (c Cache) Missing(ds []string) ([]string, error) {
	out := []string{}
	for _, d := range ds {
		if _, err := c.path(d); err != nil {
			return nil, err
		}
		if _, ok := c.Path(d); !ok {
			out = append(out, d)
		}
	}
	return out, nil
}

// Put extracts the layer r (Pack's tar) as digest d and keeps it only if
// the SHA-256 of the whole stream is d; on any error nothing is kept.
// Putting a layer the cache has is a no-op that does not read r.
func (c Cache) Put(d string, r io.Reader, lim rootfs.Limits) error {
	p, err := c.path(d)
	if err != nil {
		return err
	}
	if _, ok := c.Path(d); ok {
		return nil
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(c.Dir, ".put-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	h := sha256.New()
	tee := io.TeeReader(r, h)
	if err := extract(tee, tmp, lim); err != nil {
		return err
	}
	// What follows the tar's end is hashed too: the digest is of every
	// byte sent, so nothing rides along unchecked.
	if _, err := io.Copy(io.Discard, io.LimitReader(tee, 1<<20)); err != nil {
		return err
	}
	if got := rootfs.DigestPrefix + hex.EncodeToString(h.Sum(nil)); got != d {
		return fmt.Errorf("%w: layer sent as %s, received %s", rootfs.ErrDigestMismatch, d, got)
	}
	if err := os.Rename(tmp, p); err != nil {
		if _, ok := c.Path(d); ok {
			return nil // another Put of the same layer won
		}
		return err
	}
	return nil
}

// extract writes the layer tar r into the empty dir, as a live move's
// volume is (whiteouts and opaque marks kept).
func extract(r io.Reader, dir string, lim rootfs.Limits) error {
	t, err := rootfs.NewTree(dir, lim)
	if err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err == nil {
			err = t.Add(hdr, tr)
		}
		if err != nil {
			t.Abort()
			if errors.Is(err, tar.ErrHeader) {
				err = errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("layer: not a tar: %w", err))
			}
			return err
		}
	}
	if _, err := t.Finish(); err != nil {
		t.Abort()
		return err
	}
	return nil
}

// Remove deletes layer d, if the cache has it.
func (c Cache) Remove(d string) error {
	p, ok := c.Path(d)
	if !ok {
		return nil
	}
	return os.RemoveAll(p)
}

// Flatten makes the tree whose digest is want from the cached layers
// (bottom first) and keeps it in trees, returning its path: flattened
// beside trees' entries, packed to check its digest, renamed into place.
// A cached layer missing is errdefs.ErrNotFound; a tree that is not want
// (the layers are not that template's) is rootfs.ErrDigestMismatch, and
// nothing is kept.
func (c Cache) Flatten(layers []string, want string, trees rootfs.Cache) (string, error) {
	if p, ok := trees.Path(want); ok {
		return p, nil
	}
	if !rootfs.ValidDigest(want) {
		return "", fmt.Errorf("%w: tree %q", ErrBadDigest, want)
	}
	dirs := make([]string, len(layers))
	for i, d := range layers {
		p, ok := c.Path(d)
		if !ok {
			return "", errdefs.New(errdefs.ErrNotFound, "layer %s is not on this node", d)
		}
		dirs[i] = p
	}
	if err := os.MkdirAll(trees.Dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(trees.Dir, ".flat-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	// 0o755 as the master's trees are (and the sandbox's gofer reads it).
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := rootfs.Flatten(dirs, tmp); err != nil {
		return "", err
	}
	got, err := rootfs.Digest(tmp)
	if err != nil {
		return "", err
	}
	if got != want {
		return "", fmt.Errorf("%w: the layers %v flatten to %s, not %s", rootfs.ErrDigestMismatch, layers, got, want)
	}
	dst := filepath.Join(trees.Dir, strings.TrimPrefix(want, rootfs.DigestPrefix))
	if err := os.Rename(tmp, dst); err != nil {
		if p, ok := trees.Path(want); ok {
			return p, nil
		}
		return "", err
	}
	return dst, nil
}
