// Package rootfs extracts untrusted rootfs tarballs into a template
// directory without ever letting an entry reach outside that directory.
//
// Safety model: every filesystem operation is done relative to a file
// descriptor of the destination directory, one path component at a time,
// with O_NOFOLLOW. No symlink is ever followed on the host while
// extracting, so a symlink written by an earlier entry (even one pointing
// inside the tree) cannot be used by a later entry to write elsewhere: an
// entry whose parent path crosses a symlink is rejected. Symlinks
// themselves are recreated verbatim; absolute targets are allowed because
// they are resolved inside the sandbox's root, never on the host.
package rootfs

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/internal/errdefs"
)

// Default limits applied when a Limits field is zero (or negative).
const (
	DefaultMaxBytes int64 = 4 << 30 // 4 GiB
	DefaultMaxFiles int   = 200000
)

// ErrUnsafe is wrapped by every error that rejects an entry because it could
// escape the destination, write through a link, or create a device.
var ErrUnsafe = errdefs.Refine(errdefs.ErrBadInput, "unsafe tar entry")

// ErrTooLarge is wrapped by the error returned when a tarball exceeds its
// Limits.
var ErrTooLarge = errdefs.Refine(errdefs.ErrTooLarge, "tarball exceeds limit")

// Limits bounds an extraction. Zero values mean the defaults.
type Limits struct {
	// MaxBytes bounds the total payload of all entries in bytes (in
	// practice the uncompressed contents of regular files). Default 4 GiB.
	MaxBytes int64
	// MaxFiles bounds the number of filesystem objects created (files,
	// directories including implicitly created parents, symlinks, hard
	// links) and the number of tar entries read. Default 200000.
	MaxFiles int
}

// Stats describes a successful extraction.
type Stats struct {
	// Files is the number of filesystem objects created: regular files,
	// directories (including parents created implicitly), symlinks and hard
	// links.
	Files int
	// Bytes is the number of regular-file content bytes written.
	Bytes int64
	// Skipped is the number of entries left out rather than refused:
	// UnpackLayer's device nodes and fifos (a sandbox gets its /dev from
	// gVisor, so an image's are of no use and not worth refusing it for).
	Skipped int
}

// Extract reads a tar stream from r and writes it under dir, which must
// exist, be a directory, and be empty. The stream may be plain or
// gzip-compressed (detected by the magic bytes 1f 8b).
//
// Entries are rejected with an error wrapping ErrUnsafe and naming the
// entry when: the name is absolute or contains a ".." element; the entry's
// parent path crosses a symlink or a non-directory (so nothing is ever
// written through a link); a relative symlink target escapes dir when
// resolved against the link's directory; a hard link target is absolute,
// contains "..", or was not extracted earlier in the same stream; the entry
// is a character or block device, a fifo, or of an unknown type. Exceeding
// lim yields an error wrapping ErrTooLarge.
//
// Regular files, directories, symlinks and hard links are created with the
// tar's permission bits (including setuid, setgid and sticky) and
// modification times; when running as root, ownership is set to the tar's
// numeric uid/gid. A later entry with the same name as an earlier
// non-directory replaces it (the old one is unlinked first, never written
// through). Global PAX headers and "." entries are ignored.
//
// On any error Extract removes everything it wrote under dir (dir itself is
// left in place, empty) and returns zero Stats. If dir is missing, not a
// directory or not empty, Extract returns an error and touches nothing.
func Extract(r io.Reader, dir string, lim Limits) (Stats, error) {
	x, err := newExtractor(dir, lim, false)
	if err != nil {
		return Stats{}, err
	}
	defer unix.Close(x.root)
	if err := x.run(r); err != nil {
		if cerr := clean(dir); cerr != nil {
			err = fmt.Errorf("%w (cleanup of %s also failed: %v)", err, dir, cerr)
		}
		return Stats{}, err
	}
	return x.st, nil
}

// newExtractor opens dir, which must be an empty directory, for an
// extractor within lim (its zero fields: the defaults); the caller closes
// its root.
func newExtractor(dir string, lim Limits, overlay bool) (*extractor, error) {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultMaxBytes
	}
	if lim.MaxFiles <= 0 {
		lim.MaxFiles = DefaultMaxFiles
	}
	rootFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("rootfs: destination: %w", &os.PathError{Op: "open", Path: dir, Err: err})
	}
	if err := checkEmpty(rootFD, dir); err != nil {
		unix.Close(rootFD)
		return nil, err
	}
	return &extractor{root: rootFD, lim: lim, chown: os.Geteuid() == 0,
		kinds: map[string]byte{}, dirs: map[string]*tar.Header{}, overlay: overlay}, nil
}

// checkEmpty fails unless the directory open at fd has no entries.
func checkEmpty(fd int, dir string) error {
	dupFD, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("rootfs: open destination %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(dupFD), dir)
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("rootfs: read destination %s: %w", dir, err)
	}
	if len(names) > 0 {
		return fmt.Errorf("rootfs: destination %s is not empty", dir)
	}
	return nil
}

// clean removes every entry under dir without following symlinks.
func clean(dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := root.Open(".")
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if err := root.RemoveAll(n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type extractor struct {
	root  int // O_DIRECTORY fd of the destination
	lim   Limits
	chown bool
	st    Stats
	// cur is the raw name of the entry being processed, for errors.
	cur string
	// entries counts tar headers read, bounded by lim.MaxFiles.
	entries int
	// kinds records the type of every non-directory object extracted so
	// far, by cleaned name; hard links may only point at these.
	kinds map[string]byte
	// dirs holds the header of each explicit directory entry; its mode and
	// times are applied once all entries are written.
	dirs     map[string]*tar.Header
	dirOrder []string
	// overlay: the tree is an overlayfs upper dir (a sandbox's volume,
	// volume.go): its whiteouts and opaque directories are kept.
	overlay bool
	// layer: the tree is an OCI image layer (layer.go), nil otherwise.
	layer *layerState
}

func (x *extractor) run(r io.Reader) error {
	br := bufio.NewReader(r)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("rootfs: gzip: %w", err)
		}
		defer zr.Close()
		src = zr
	}
	if err := x.readAll(src); err != nil {
		return err
	}
	return x.finishDirs()
}

// readAll extracts every entry of the tar stream src, within the limits;
// the directories' modes and times are left to finishDirs.
func (x *extractor) readAll(src io.Reader) error {
	tr := tar.NewReader(src)
	var payload int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("rootfs: read tar: %w", err)
		}
		x.entries++
		if x.entries > x.lim.MaxFiles {
			return fmt.Errorf("rootfs: entry %q: %w: more than %d entries", hdr.Name, ErrTooLarge, x.lim.MaxFiles)
		}
		// Every entry's payload counts, even for types whose data is
		// skipped, so a stream cannot make us decompress unbounded data.
		if hdr.Size > x.lim.MaxBytes-payload {
			return fmt.Errorf("rootfs: entry %q: %w: more than %d bytes", hdr.Name, ErrTooLarge, x.lim.MaxBytes)
		}
		payload += hdr.Size
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
	return nil
}

// unsafe returns an ErrUnsafe error naming the current entry.
func (x *extractor) unsafe(format string, args ...any) error {
	return unsafeErr(x.cur, format, args...)
}

func unsafeErr(name, format string, args ...any) error {
	return fmt.Errorf("rootfs: entry %q: %w: %s", name, ErrUnsafe, fmt.Sprintf(format, args...))
}

// cleanName validates a tar member name (or hard link target) and returns it
// cleaned and relative. It returns "." for the root itself.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", unsafeErr(name, "empty name")
	}
	if strings.HasPrefix(name, "/") {
		return "", unsafeErr(name, "absolute path")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", unsafeErr(name, "NUL byte in name")
	}
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", unsafeErr(name, `".." path element`)
	}
	// With no leading "/" and no ".." element, Clean cannot leave the root.
	return path.Clean(name), nil
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	x.cur = hdr.Name
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		if hdr.Typeflag == tar.TypeDir {
			return nil // the destination itself; its mode is the caller's
		}
		return x.unsafe("non-directory entry for the root")
	}
	if x.layer != nil {
		if done, err := x.layerEntry(name, hdr); done || err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.mkdir(name, hdr)
	case tar.TypeReg:
		return x.file(name, hdr, tr)
	case tar.TypeSymlink:
		return x.symlink(name, hdr)
	case tar.TypeLink:
		return x.hardlink(name, hdr)
	case tar.TypeChar:
		if x.overlay && hdr.Devmajor == 0 && hdr.Devminor == 0 {
			return x.whiteout(name, hdr)
		}
		return x.unsafe("device node")
	case tar.TypeBlock:
		return x.unsafe("device node")
	case tar.TypeFifo:
		return x.unsafe("fifo")
	default:
		return x.unsafe("unsupported entry type %q", hdr.Typeflag)
	}
}

// count reserves one filesystem object against MaxFiles.
func (x *extractor) count() error {
	if x.st.Files >= x.lim.MaxFiles {
		return fmt.Errorf("rootfs: entry %q: %w: more than %d files", x.cur, ErrTooLarge, x.lim.MaxFiles)
	}
	x.st.Files++
	return nil
}

// openParent walks name's parent directories from the root one component at
// a time, never following symlinks, creating missing directories (mode
// 0755) when create is set. It returns an fd of the parent directory, which
// the caller closes, and the final path component.
func (x *extractor) openParent(name string, create bool) (int, string, error) {
	parts := strings.Split(name, "/")
	fd, err := unix.Openat(x.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("rootfs: entry %q: open root: %w", x.cur, err)
	}
	for i, comp := range parts[:len(parts)-1] {
		next, err := openDirNoFollow(fd, comp)
		if err == unix.ENOENT && create {
			if err = x.count(); err != nil {
				unix.Close(fd)
				return -1, "", err
			}
			if err = unix.Mkdirat(fd, comp, 0o755); err != nil {
				unix.Close(fd)
				return -1, "", fmt.Errorf("rootfs: entry %q: mkdir %s: %w", x.cur, strings.Join(parts[:i+1], "/"), err)
			}
			next, err = openDirNoFollow(fd, comp)
		}
		if err != nil {
			err = x.classify(fd, comp, strings.Join(parts[:i+1], "/"), err)
			unix.Close(fd)
			return -1, "", err
		}
		unix.Close(fd)
		fd = next
	}
	return fd, parts[len(parts)-1], nil
}

func openDirNoFollow(dirFD int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// classify turns a failure to open a parent component into a precise error.
func (x *extractor) classify(dirFD int, comp, prefix string, openErr error) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, comp, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			return x.unsafe("parent %q is a symlink; refusing to write through it", prefix)
		case unix.S_IFDIR:
		default:
			return x.unsafe("parent %q is not a directory", prefix)
		}
	}
	return fmt.Errorf("rootfs: entry %q: open parent %s: %w", x.cur, prefix, openErr)
}

// lstatAt returns the type bits of name in dirFD, or 0 if it does not exist.
func lstatAt(dirFD int, name string) (uint32, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.Mode & unix.S_IFMT, nil
}

// makeRoom prepares to create a non-directory at leaf: an existing
// non-directory is unlinked (tar "last entry wins"), a directory is an error.
func (x *extractor) makeRoom(pfd int, leaf, name string) error {
	typ, err := lstatAt(pfd, leaf)
	if err != nil {
		return fmt.Errorf("rootfs: entry %q: %w", x.cur, err)
	}
	switch typ {
	case 0:
		return nil
	case unix.S_IFDIR:
		return x.unsafe("would replace a directory")
	}
	if err := unix.Unlinkat(pfd, leaf, 0); err != nil {
		return fmt.Errorf("rootfs: entry %q: replace: %w", x.cur, err)
	}
	delete(x.kinds, name)
	x.st.Files--
	return nil
}

// openLeaf opens name's parent (made if create) and says what is at its
// leaf (0: nothing); the caller closes pfd.
func (x *extractor) openLeaf(name string, create bool) (pfd int, leaf string, typ uint32, err error) {
	if pfd, leaf, err = x.openParent(name, create); err != nil {
		return -1, "", 0, err
	}
	if typ, err = lstatAt(pfd, leaf); err != nil {
		unix.Close(pfd)
		return -1, "", 0, fmt.Errorf("rootfs: entry %q: %w", x.cur, err)
	}
	return pfd, leaf, typ, nil
}

func (x *extractor) mkdir(name string, hdr *tar.Header) error {
	pfd, leaf, typ, err := x.openLeaf(name, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	switch typ {
	case 0:
		if err := x.count(); err != nil {
			return err
		}
		// Created owner-writable; the tar's mode is applied at the end so
		// read-only directories can still be filled.
		if err := unix.Mkdirat(pfd, leaf, 0o700); err != nil {
			return fmt.Errorf("rootfs: entry %q: mkdir: %w", x.cur, err)
		}
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return x.unsafe("directory would replace a symlink")
	default:
		return x.unsafe("directory would replace a non-directory")
	}
	if _, seen := x.dirs[name]; !seen {
		x.dirOrder = append(x.dirOrder, name)
	}
	x.dirs[name] = hdr
	return nil
}

// newEntry opens the parent of a file, symlink or hard link about to be
// made at name (its directories made as needed), clears the way for it,
// and counts it against the entry limit. The caller closes pfd.
func (x *extractor) newEntry(name string) (pfd int, leaf string, err error) {
	pfd, leaf, err = x.openParent(name, true)
	if err != nil {
		return -1, "", err
	}
	if err = x.makeRoom(pfd, leaf, name); err == nil {
		err = x.count()
	}
	if err != nil {
		unix.Close(pfd)
		return -1, "", err
	}
	return pfd, leaf, nil
}

func (x *extractor) file(name string, hdr *tar.Header, tr io.Reader) error {
	pfd, leaf, err := x.newEntry(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, leaf, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("rootfs: entry %q: create: %w", x.cur, err)
	}
	x.kinds[name] = tar.TypeReg
	f := os.NewFile(uintptr(fd), name)
	n, err := io.Copy(f, tr)
	x.st.Bytes += n
	if err == nil {
		err = x.setOwnerMode(fd, hdr)
	}
	if err == nil {
		err = x.setXattrs(fd, hdr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("rootfs: entry %q: write: %w", x.cur, err)
	}
	return x.setTimes(pfd, leaf, hdr)
}

// setOwnerMode applies ownership (as root) then mode, in that order because
// chown clears setuid/setgid bits.
func (x *extractor) setOwnerMode(fd int, hdr *tar.Header) error {
	if x.chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	return unix.Fchmod(fd, uint32(hdr.Mode&0o7777))
}

func (x *extractor) setTimes(pfd int, leaf string, hdr *tar.Header) error {
	mt := hdr.ModTime
	if mt.IsZero() {
		return nil
	}
	at := hdr.AccessTime
	if at.IsZero() {
		at = mt
	}
	ts := []unix.Timespec{timespec(at), timespec(mt)}
	if err := unix.UtimesNanoAt(pfd, leaf, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("rootfs: entry %q: set times: %w", x.cur, err)
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	return unix.NsecToTimespec(t.UnixNano())
}

func (x *extractor) symlink(name string, hdr *tar.Header) error {
	target := hdr.Linkname
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		return x.unsafe("invalid symlink target %q", target)
	}
	// Absolute targets are resolved inside the sandbox's root, never on the
	// host (nothing here follows symlinks), so they are allowed. Relative
	// targets must stay inside the tree.
	// A layer's are kept verbatim (the image spec's rule): UnpackLayer and
	// Flatten never follow one either.
	if !strings.HasPrefix(target, "/") && x.layer == nil {
		res := path.Join(path.Dir(name), target)
		if res == ".." || strings.HasPrefix(res, "../") {
			return x.unsafe("symlink target %q escapes the root", target)
		}
	}
	pfd, leaf, err := x.newEntry(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Symlinkat(target, pfd, leaf); err != nil {
		return fmt.Errorf("rootfs: entry %q: symlink: %w", x.cur, err)
	}
	x.kinds[name] = tar.TypeSymlink
	if x.chown {
		if err := unix.Fchownat(pfd, leaf, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("rootfs: entry %q: lchown: %w", x.cur, err)
		}
	}
	return x.setTimes(pfd, leaf, hdr)
}

func (x *extractor) hardlink(name string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return x.unsafe("hard link target %q is outside the root", hdr.Linkname)
	}
	if _, ok := x.kinds[target]; !ok {
		return x.unsafe("hard link target %q was not extracted before it", hdr.Linkname)
	}
	if target == name {
		return nil // a link to itself: nothing to do
	}
	tfd, tleaf, err := x.openParent(target, false)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	pfd, leaf, err := x.newEntry(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	// Flags 0: linkat does not follow a symlink at tleaf.
	if err := unix.Linkat(tfd, tleaf, pfd, leaf, 0); err != nil {
		return fmt.Errorf("rootfs: entry %q: link to %q: %w", x.cur, target, err)
	}
	x.kinds[name] = x.kinds[target]
	return nil
}

// finishDirs applies the recorded mode, owner and times of explicit
// directory entries, deepest first so setting a parent's mtime comes last.
func (x *extractor) finishDirs() error {
	order := slices.Clone(x.dirOrder)
	slices.SortStableFunc(order, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	for _, name := range order {
		hdr := x.dirs[name]
		x.cur = hdr.Name
		pfd, leaf, err := x.openParent(name, false)
		if err != nil {
			return err
		}
		err = func() error {
			defer unix.Close(pfd)
			fd, err := openDirNoFollow(pfd, leaf)
			if err != nil {
				return fmt.Errorf("rootfs: entry %q: reopen directory: %w", x.cur, err)
			}
			err = x.setOwnerMode(fd, hdr)
			if err == nil {
				err = x.setXattrs(fd, hdr)
			}
			if err == nil && x.overlay {
				err = setOpaque(fd, hdr)
			}
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("rootfs: entry %q: directory mode: %w", x.cur, err)
			}
			return x.setTimes(pfd, leaf, hdr)
		}()
		if err != nil {
			return err
		}
	}
	return nil
}
