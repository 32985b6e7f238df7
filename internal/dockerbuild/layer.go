package dockerbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"sandstorm/internal/errdefs"
)

// layerWriter makes a layer directory for COPY, ADD or WORKDIR: every
// write through an os.Root of it, so nothing lands outside it, and every
// directory on the way to what it writes made with the image's own mode
// and owner (overlayfs shows the upper directory's, so a made-up 0755
// root:root would change the image's).
type layerWriter struct {
	b        *builder
	img      Image
	dir      string
	root     *os.Root
	uid, gid int             // owner of what is new: --chown, else root
	made     map[string]bool // directories made so far
	// dirModes are the modes of the directories copied, applied last and
	// deepest first (a read-only one is still filled).
	dirModes map[string]fs.FileMode
	chown    bool
}

func (b *builder) newLayerWriter(img Image, uid, gid int) (*layerWriter, error) {
	dir, err := b.opts.Store.TempDir()
	if err != nil {
		return nil, fmt.Errorf("layer directory: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	w := &layerWriter{b: b, img: img, dir: dir, root: root, uid: uid, gid: gid,
		made: map[string]bool{".": true}, dirModes: map[string]fs.FileMode{}, chown: os.Geteuid() == 0}
	// The layer's root is the merged root's look: the image's own.
	info, err := b.lookup(img, "/")
	if err == nil {
		err = w.setMeta(".", info.mode, info.uid, info.gid)
	}
	if err != nil {
		return nil, w.abort(err)
	}
	return w, nil
}

// abort removes the layer directory and returns err.
func (w *layerWriter) abort(err error) error {
	w.root.Close()
	os.RemoveAll(w.dir)
	return err
}

// finish applies the copied directories' modes and hands the directory
// over.
func (w *layerWriter) finish() (string, error) {
	names := make([]string, 0, len(w.dirModes))
	for n := range w.dirModes {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, n := range names {
		if err := w.root.Chmod(n, w.dirModes[n]); err != nil {
			return "", w.abort(err)
		}
	}
	w.root.Close()
	return w.dir, nil
}

// setMeta gives name (made by this writer) its owner, then its mode
// (chown clears setuid bits).
func (w *layerWriter) setMeta(name string, mode fs.FileMode, uid, gid int) error {
	if w.chown {
		if err := w.root.Lchown(name, uid, gid); err != nil {
			return err
		}
	}
	if mode&fs.ModeSymlink != 0 {
		return nil
	}
	return w.root.Chmod(name, mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}

// ensureDir makes rel (relative to /) and the directories above it: each
// one the image has with the image's mode and owner, a new one 0755 and
// owned by the writer's owner.
func (w *layerWriter) ensureDir(rel string) error {
	rel = path.Clean(rel)
	if w.made[rel] {
		return nil
	}
	if parent := path.Dir(rel); parent != rel {
		if err := w.ensureDir(parent); err != nil {
			return err
		}
	}
	info, err := w.b.lookup(w.img, "/"+rel)
	if err != nil {
		return err
	}
	mode, uid, gid := fs.ModeDir|0o755, w.uid, w.gid
	if info != nil {
		switch {
		case info.mode&fs.ModeSymlink != 0:
			return errdefs.New(errdefs.ErrBadInput, "/%s is a symbolic link in the image, not followed: name the directory it points to", rel)
		case !info.mode.IsDir():
			return errdefs.New(errdefs.ErrBadInput, "/%s is not a directory in the image", rel)
		}
		mode, uid, gid = info.mode, info.uid, info.gid
	}
	if err := w.root.Mkdir(rel, 0o700); err != nil {
		return err
	}
	w.made[rel] = true
	return w.setMeta(rel, mode, uid, gid)
}

// clear makes room for a non-directory at rel: an earlier source's file
// is replaced (the last source wins), a directory is not.
func (w *layerWriter) clear(rel string) error {
	fi, err := w.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return errdefs.New(errdefs.ErrBadInput, "/%s: a file and a directory of the same name", rel)
	}
	return w.root.Remove(rel)
}

// copyFile writes e's content from the build context, and checks it is
// what was hashed for the key.
func (w *layerWriter) copyFile(e *entry) error {
	if err := w.clear(e.Dst); err != nil {
		return err
	}
	src, err := openContext(w.b.ctxRoot, e.Src)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := w.root.OpenFile(e.Dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(dst, io.TeeReader(src, h))
	if err == nil && w.chown {
		err = dst.Chown(w.uid, w.gid)
	}
	if err == nil {
		err = dst.Chmod(e.Mode)
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if hex.EncodeToString(h.Sum(nil)) != e.Digest {
		return errdefs.New(errdefs.ErrConflict, "%s changed in the build context during the build; build again", e.Src)
	}
	return w.root.Chtimes(e.Dst, e.mtime, e.mtime)
}

// symlink writes e as the symlink it is in the context (never followed).
func (w *layerWriter) symlink(e *entry) error {
	if err := w.clear(e.Dst); err != nil {
		return err
	}
	if err := w.root.Symlink(e.Link, e.Dst); err != nil {
		return err
	}
	if w.chown {
		return w.root.Lchown(e.Dst, w.uid, w.gid)
	}
	return nil
}

// dirEntry makes a directory copied from the context; its mode is applied
// by finish.
func (w *layerWriter) dirEntry(e *entry) error {
	if err := w.ensureDir(e.Dst); err != nil {
		return err
	}
	if w.chown {
		if err := w.root.Lchown(e.Dst, w.uid, w.gid); err != nil {
			return err
		}
	}
	w.dirModes[e.Dst] = e.Mode
	return nil
}

// openContext opens a regular file of the build context, not through a
// final symlink (os.Root keeps every other component inside).
func openContext(root *os.Root, name string) (*os.File, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = errdefs.New(errdefs.ErrBadInput, "%s: not a regular file", name)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// moveInto moves the tree at src (a directory this build made) into the
// layer at rel, merging directories; what is there already of the same
// name and not a directory is replaced.
func (w *layerWriter) moveInto(src, rel string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, de := range ents {
		from := filepath.Join(src, de.Name())
		to := path.Join(rel, de.Name())
		fi, err := w.root.Lstat(to)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			err = os.Rename(from, filepath.Join(w.dir, to))
		case err != nil:
		case fi.IsDir() && de.IsDir():
			err = w.moveInto(from, to)
		default:
			if err = w.root.RemoveAll(to); err == nil {
				err = os.Rename(from, filepath.Join(w.dir, to))
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
