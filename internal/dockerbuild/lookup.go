package dockerbuild

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"sandstorm/internal/errdefs"
)

// fileInfo is a path of an image as overlayfs shows it: its mode, owner,
// and where it is on the host (in the top-most layer that has it).
type fileInfo struct {
	mode     fs.FileMode
	uid, gid int
	host     string
}

// layerDirs are img's layer directories, top first.
func (b *builder) layerDirs(img Image) ([]string, error) {
	dirs := make([]string, len(img.Layers))
	for i, id := range img.Layers {
		d, err := b.opts.Store.Dir(id)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", id, err)
		}
		dirs[len(img.Layers)-1-i] = d
	}
	return dirs, nil
}

// lookup is p (absolute) in img as overlayfs merges its layers: nil when
// it is not there (or deleted by a whiteout, hidden by an opaque
// directory); an error when reaching it crosses a symlink of the image,
// which is not followed on the host. Only directories already seen to be
// directories in a layer are descended into, so no host symlink is
// followed either.
func (b *builder) lookup(img Image, p string) (*fileInfo, error) {
	dirs, err := b.layerDirs(img)
	if err != nil {
		return nil, err
	}
	p = path.Clean("/" + p)
	if p == "/" {
		if len(dirs) == 0 {
			return &fileInfo{mode: fs.ModeDir | 0o755}, nil
		}
		return statHost(dirs[0])
	}
	comps := strings.Split(p[1:], "/")
	visible := dirs
	for i := range comps {
		rel := filepath.Join(comps[:i+1]...)
		found, next, err := lookupLevel(visible, rel)
		if err != nil || found == nil {
			return nil, err
		}
		if i == len(comps)-1 {
			return found, nil
		}
		switch {
		case found.mode&fs.ModeSymlink != 0:
			return nil, errdefs.New(errdefs.ErrBadInput, "/%s is a symbolic link in the image, not followed: name the directory it points to", rel)
		case !found.mode.IsDir():
			return nil, errdefs.New(errdefs.ErrBadInput, "/%s is not a directory in the image", rel)
		}
		visible = next
	}
	return nil, nil
}

// lookupLevel finds rel in the layers visible at its level (top first):
// the top-most entry, and the layers whose directory rel merges into it.
func lookupLevel(visible []string, rel string) (*fileInfo, []string, error) {
	var found *fileInfo
	var next []string
	for _, d := range visible {
		host := filepath.Join(d, rel)
		fi, err := statHost(host)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if isWhiteout(fi) {
			break // deleted here: nothing below shows
		}
		if found == nil {
			found = fi
		}
		if !fi.mode.IsDir() || !found.mode.IsDir() {
			break // a non-directory hides what is below it
		}
		next = append(next, d)
		if isOpaque(host) {
			break
		}
	}
	return found, next, nil
}

func statHost(p string) (*fileInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	info := &fileInfo{mode: fi.Mode(), host: p}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.uid, info.gid = int(st.Uid), int(st.Gid)
		if fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
			info.mode |= whiteoutBit
		}
	}
	return info, nil
}

// whiteoutBit marks a character device 0:0 (overlayfs's deletion) in a
// fileInfo; fs.ModeTemporary is otherwise unused on Linux.
const whiteoutBit = fs.ModeTemporary

func isWhiteout(fi *fileInfo) bool { return fi.mode&whiteoutBit != 0 }

func isOpaque(dir string) bool {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(dir, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// readImageFile is a small regular file of img (/etc/passwd), nil if the
// image has none.
func (b *builder) readImageFile(img Image, p string) ([]byte, error) {
	info, err := b.lookup(img, p)
	if err != nil || info == nil {
		return nil, err
	}
	if !info.mode.IsRegular() {
		return nil, errdefs.New(errdefs.ErrBadInput, "%s in the image is not a regular file", p)
	}
	f, err := os.OpenFile(info.host, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4<<20))
}

// resolveChown is --chown's user[:group] as numbers: names are looked up
// in the image's /etc/passwd and /etc/group; a user alone brings its
// primary group (a number alone, the same number).
func (b *builder) resolveChown(img Image, spec string) (int, int, error) {
	if spec == "" {
		return 0, 0, nil
	}
	user, group, hasGroup := strings.Cut(spec, ":")
	uid, primary, err := b.resolveID(img, "/etc/passwd", user, true)
	if err != nil {
		return 0, 0, err
	}
	if !hasGroup {
		return uid, primary, nil
	}
	gid, _, err := b.resolveID(img, "/etc/group", group, false)
	return uid, gid, err
}

// resolveID is name as a number from db (passwd: its uid and primary gid;
// group: its gid).
func (b *builder) resolveID(img Image, db, name string, passwd bool) (int, int, error) {
	if n, err := strconv.ParseUint(name, 10, 31); err == nil {
		return int(n), int(n), nil
	}
	if name == "root" {
		return 0, 0, nil
	}
	data, err := b.readImageFile(img, db)
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Split(l, ":")
		if len(f) < 3 || f[0] != name {
			continue
		}
		id, err1 := strconv.ParseUint(f[2], 10, 31)
		gid := id
		var err2 error
		if passwd && len(f) > 3 {
			gid, err2 = strconv.ParseUint(f[3], 10, 31)
		}
		if err1 == nil && err2 == nil {
			return int(id), int(gid), nil
		}
	}
	return 0, 0, errdefs.New(errdefs.ErrBadInput, "--chown: %q is not in the image's %s: use a number, or create it first (RUN useradd)", name, db)
}
