package rootfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Flatten merges the unpacked layers (dirs written by UnpackLayer, bottom
// first) into dst, which must exist and be empty, as an OCI runtime (or
// overlayfs) would see them stacked: a whiteout removes what lower layers
// had at its path, an opaque directory hides lower layers' contents of it.
// Regular files are hard links to the layer's file (so a layer's data is
// kept once on disk and shared by every template using it; a copy when
// linking fails with EXDEV or EMLINK), directories and symlinks are made
// anew with the layer's mode, owner, times and kept xattrs (user.*,
// security.capability). dst ends with no whiteouts and no overlay xattrs.
//
// Every operation is relative to a directory's descriptor and no symlink
// is ever followed, in making or in deleting: a lower layer's symlink
// etc -> /etc under an upper layer's directory etc/ gives a directory etc
// in dst. A name's type may change from layer to layer (a file over a
// directory replaces the directory, and the other way round). Names that
// are one inode in a layer are one inode in dst. A layer holding what
// UnpackLayer never writes (a device, a fifo, an overlay xattr on a file)
// is refused (ErrUnsafe). On any error dst is left empty.
func Flatten(layers []string, dst string) error {
	root, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("rootfs: flatten: %w", &os.PathError{Op: "open", Path: dst, Err: err})
	}
	defer unix.Close(root)
	if err := checkEmpty(root, dst); err != nil {
		return err
	}
	f := &flattener{root: root, chown: os.Geteuid() == 0}
	for i, l := range layers {
		if err = f.layer(l); err != nil {
			err = fmt.Errorf("rootfs: flatten layer %d (%s): %w", i, l, err)
			break
		}
	}
	if err != nil {
		if cerr := clean(dst); cerr != nil {
			err = fmt.Errorf("%w (cleanup of %s also failed: %v)", err, dst, cerr)
		}
	}
	return err
}

type flattener struct {
	root  int // dst
	chown bool
	// copied: within the current layer, where the copy of each of its
	// multiply linked files is in dst (relative), so that its other names
	// link to the copy rather than copy again.
	copied map[fileID]string
}

type fileID struct{ dev, ino uint64 }

func (f *flattener) layer(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	f.copied = map[fileID]string{}
	return f.mergeDir(fd, f.root, ".")
}

// mergeDir merges the layer's directory src into dst's directory dst (rel:
// its name, for errors).
func (f *flattener) mergeDir(src, dst int, rel string) error {
	if v, err := fgetxattr(src, opaqueXattr); err == nil && v == "y" {
		names, err := readNames(dst)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for _, n := range names {
			if err := removeAt(dst, n); err != nil {
				return fmt.Errorf("%s: opaque: %w", path.Join(rel, n), err)
			}
		}
	}
	names, err := readNames(src)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	for _, n := range names {
		if err := f.mergeEntry(src, dst, n, path.Join(rel, n)); err != nil {
			return err
		}
	}
	return nil
}

func (f *flattener) mergeEntry(src, dst int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	var err error
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return f.dir(src, dst, name, rel, &st)
	case unix.S_IFREG:
		err = f.file(src, dst, name, rel, &st)
	case unix.S_IFLNK:
		err = f.symlink(src, dst, name, &st)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return unsafeErr(rel, "device node in a layer")
		}
		err = removeAt(dst, name) // a whiteout
	default:
		return unsafeErr(rel, "%#o in a layer (not a file, directory, symlink or whiteout)", st.Mode&unix.S_IFMT)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// dir makes (or keeps) the directory name in dst, merges the layer's into
// it, then gives it the layer's metadata (last: its times would change).
func (f *flattener) dir(src, dst int, name, rel string, st *unix.Stat_t) error {
	typ, err := lstatAt(dst, name)
	if err == nil && typ != 0 && typ != unix.S_IFDIR {
		err = removeAt(dst, name)
	}
	if err == nil && typ != unix.S_IFDIR {
		err = unix.Mkdirat(dst, name, 0o700)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	sfd, err := openDirNoFollow(src, name)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(sfd)
	dfd, err := openDirNoFollow(dst, name)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(dfd)
	if err := f.mergeDir(sfd, dfd, rel); err != nil {
		return err
	}
	err = f.ownerMode(dfd, st)
	if err == nil {
		err = syncXattrs(sfd, dfd)
	}
	if err == nil {
		err = setStatTimes(dst, name, st)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// file puts the layer's file name at name in dst, as a hard link to it.
func (f *flattener) file(src, dst int, name, rel string, st *unix.Stat_t) error {
	if err := refuseOverlayXattrs(src, name); err != nil {
		return err
	}
	if err := removeAt(dst, name); err != nil {
		return err
	}
	err := unix.Linkat(src, name, dst, name, 0)
	if err != unix.EXDEV && err != unix.EMLINK {
		return err
	}
	id := fileID{st.Dev, st.Ino}
	if prev, ok := f.copied[id]; ok {
		if err := f.linkCopy(prev, dst, name); err == nil {
			return nil
		}
	}
	if err := f.copyFile(src, dst, name, st); err != nil {
		return err
	}
	if st.Nlink > 1 {
		f.copied[id] = rel
	}
	return nil
}

// linkCopy links dst's prev (relative to dst's root, walked without
// following a symlink) at name in the directory dst.
func (f *flattener) linkCopy(prev string, dst int, name string) error {
	fd, err := unix.Openat(f.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	parts := strings.Split(prev, "/")
	for _, comp := range parts[:len(parts)-1] {
		next, err := openDirNoFollow(fd, comp)
		unix.Close(fd)
		if err != nil {
			return err
		}
		fd = next
	}
	defer unix.Close(fd)
	return unix.Linkat(fd, parts[len(parts)-1], dst, name, 0)
}

// copyFile copies the layer's file name to dst with its metadata, where
// it cannot be linked.
func (f *flattener) copyFile(src, dst int, name string, st *unix.Stat_t) error {
	sfd, err := unix.Openat(src, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	in := os.NewFile(uintptr(sfd), name)
	defer in.Close()
	dfd, err := unix.Openat(dst, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(dfd), name)
	_, err = io.Copy(out, in)
	if err == nil {
		err = f.ownerMode(dfd, st)
	}
	if err == nil {
		err = syncXattrs(sfd, dfd)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return setStatTimes(dst, name, st)
}

func (f *flattener) symlink(src, dst int, name string, st *unix.Stat_t) error {
	target, err := readlinkAt(src, name)
	if err != nil {
		return err
	}
	if err := removeAt(dst, name); err != nil {
		return err
	}
	if err := unix.Symlinkat(target, dst, name); err != nil {
		return err
	}
	if f.chown {
		if err := unix.Fchownat(dst, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	return setStatTimes(dst, name, st)
}

// ownerMode gives fd st's owner (as root) then mode (chown clears setuid).
func (f *flattener) ownerMode(fd int, st *unix.Stat_t) error {
	if f.chown {
		if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	return unix.Fchmod(fd, st.Mode&0o7777)
}

func setStatTimes(dirFD int, name string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(dirFD, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// removeAt removes name from the directory dirFD, a directory with all it
// holds, never following a symlink; a name that is not there is no error.
func removeAt(dirFD int, name string) error {
	typ, err := lstatAt(dirFD, name)
	if err != nil || typ == 0 {
		return err
	}
	if typ != unix.S_IFDIR {
		return ignoreENOENT(unix.Unlinkat(dirFD, name, 0))
	}
	fd, err := openDirNoFollow(dirFD, name)
	if err != nil {
		return err
	}
	names, err := readNames(fd)
	for _, n := range names {
		if err != nil {
			break
		}
		err = removeAt(fd, n)
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return ignoreENOENT(unix.Unlinkat(dirFD, name, unix.AT_REMOVEDIR))
}

func ignoreENOENT(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// readNames lists the directory open at fd, sorted (so a merge does the
// same in the same order every time).
func readNames(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(dup), ".")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	slices.Sort(names)
	return names, err
}

func readlinkAt(dirFD int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirFD, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// listXattrs is the names of the xattrs of the file open at fd.
func listXattrs(fd int) ([]string, error) {
	for {
		n, err := unix.Flistxattr(fd, nil)
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = unix.Flistxattr(fd, buf)
		if err == unix.ERANGE {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		return strings.FieldsFunc(string(buf[:n]), func(r rune) bool { return r == 0 }), nil
	}
}

func fgetxattr(fd int, name string) (string, error) {
	for {
		n, err := unix.Fgetxattr(fd, name, nil)
		if err != nil {
			return "", err
		}
		buf := make([]byte, n)
		n, err = unix.Fgetxattr(fd, name, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// syncXattrs gives dst the kept xattrs of src and no other kept ones (an
// upper directory's xattrs replace its lower one's, as overlayfs shows
// them); overlay xattrs are never copied.
func syncXattrs(src, dst int) error {
	have, err := listXattrs(dst)
	if err != nil {
		return err
	}
	for _, name := range have {
		if keptXattr(name) {
			if err := unix.Fremovexattr(dst, name); err != nil && err != unix.ENODATA {
				return err
			}
		}
	}
	want, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range want {
		if !keptXattr(name) {
			continue
		}
		v, err := fgetxattr(src, name)
		if err != nil {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
		if err := unix.Fsetxattr(dst, name, []byte(v), 0); err != nil {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
	}
	return nil
}

// refuseOverlayXattrs fails if the layer's file name carries overlay
// metadata: a hard link would carry it into dst, where an overlay mount
// of the template could act on it.
func refuseOverlayXattrs(src int, name string) error {
	fd, err := unix.Openat(src, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	names, err := listXattrs(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if overlayXattr(n) {
			return unsafeErr(name, "file carries overlay xattr %s", n)
		}
	}
	return nil
}
