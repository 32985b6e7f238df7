package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A sandbox's volume is the upper dir of its overlayfs rootfs (what it
// wrote over its template). A live move (issue 18) sends it to another
// node, which must get the same tree back — including what overlayfs
// itself keeps there: a deleted template file is a whiteout (a character
// device 0:0) and a directory made anew over a template one is opaque
// (the xattr trusted.overlay.opaque). Tree extracts such a tree with
// Extract's safety rules (nothing written outside it, nothing through a
// link, bounded), plus exactly those two: any other device is refused.
// The node's overlay mounts run with overlayfs's defaults here
// (redirect_dir, metacopy and index off: /sys/module/overlay/parameters),
// so nothing else of overlayfs's is needed to read the tree back; a
// volume that has such xattrs anyway is refused by PackVolume rather
// than sent wrong.

const (
	opaqueXattr = "trusted.overlay.opaque"
	paxOpaque   = "SCHILY.xattr." + opaqueXattr
)

// unmovable are overlayfs xattrs whose meaning does not survive a copy to
// another machine (they name other files by path or by file handle).
var unmovable = []string{"trusted.overlay.redirect", "trusted.overlay.metacopy"}

// Tree extracts a volume's entries one at a time (a stream that carries
// more than the volume hands it the volume's entries only).
type Tree struct {
	x       *extractor
	dir     string
	payload int64
	done    bool
}

// NewTree starts an extraction into dir, which must exist, be a directory
// and be empty.
func NewTree(dir string, lim Limits) (*Tree, error) {
	x, err := newExtractor(dir, lim, true)
	if err != nil {
		return nil, err
	}
	return &Tree{dir: dir, x: x}, nil
}

// Add extracts one entry, hdr.Name relative to the tree, its content read
// from r.
func (t *Tree) Add(hdr *tar.Header, r io.Reader) error {
	x := t.x
	x.entries++
	if x.entries > x.lim.MaxFiles {
		return fmt.Errorf("rootfs: entry %q: %w: more than %d entries", hdr.Name, ErrTooLarge, x.lim.MaxFiles)
	}
	if hdr.Size > x.lim.MaxBytes-t.payload {
		return fmt.Errorf("rootfs: entry %q: %w: more than %d bytes", hdr.Name, ErrTooLarge, x.lim.MaxBytes)
	}
	t.payload += hdr.Size
	if hdr.Typeflag == tar.TypeReg {
		r = io.LimitReader(r, hdr.Size)
	}
	return x.entry(hdr, r)
}

// Finish applies the directories' modes, times and opaque marks and ends
// the extraction.
func (t *Tree) Finish() (Stats, error) {
	if t.done {
		return Stats{}, errors.New("rootfs: tree already finished")
	}
	t.done = true
	defer unix.Close(t.x.root)
	if err := t.x.finishDirs(); err != nil {
		return Stats{}, err
	}
	return t.x.st, nil
}

// Abort removes everything the extraction wrote (dir stays, empty).
func (t *Tree) Abort() error {
	if !t.done {
		t.done = true
		unix.Close(t.x.root)
	}
	return clean(t.dir)
}

// whiteout makes an overlayfs whiteout at name: a character device 0:0.
func (x *extractor) whiteout(name string, hdr *tar.Header) error {
	pfd, leaf, err := x.newEntry(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mknodat(pfd, leaf, unix.S_IFCHR|0o000, 0); err != nil {
		return fmt.Errorf("rootfs: entry %q: whiteout: %w", x.cur, err)
	}
	if x.chown {
		if err := unix.Fchownat(pfd, leaf, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("rootfs: entry %q: lchown: %w", x.cur, err)
		}
	}
	return x.setTimes(pfd, leaf, hdr)
}

// setOpaque marks the directory open at fd opaque if its header says so.
func setOpaque(fd int, hdr *tar.Header) error {
	v, ok := hdr.PAXRecords[paxOpaque]
	if !ok {
		return nil
	}
	if v != "y" {
		return unsafeErr(hdr.Name, "opaque mark %q (only \"y\")", v)
	}
	return unix.Fsetxattr(fd, opaqueXattr, []byte(v), 0)
}

// PackVolume writes the volume dir to tw, each entry's name prefixed with
// prefix: directories (with their opaque mark), regular files (a hard
// link as the file it is), symlinks and whiteouts; sockets and fifos are
// left out (nothing can use them on another machine). It returns the
// bytes of file content written. A volume holding overlayfs state that
// does not survive a copy (a redirect or metacopy xattr) is refused.
func PackVolume(dir string, tw *tar.Writer, prefix string) (int64, error) {
	var total int64
	err := walkEntries(dir, func(p, rel string, fi fs.FileInfo) error {
		link, ok, err := packable(p, fi, true)
		if !ok {
			return err
		}
		for _, x := range unmovable {
			if _, err := unix.Lgetxattr(p, x, nil); err == nil {
				return fmt.Errorf("rootfs: %s carries %s, which another machine's overlay cannot read", p, x)
			}
		}
		hdr, err := entryHeader(fi, link, prefix+filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		if fi.IsDir() {
			if v, err := getXattr(p, opaqueXattr); err == nil && v == "y" {
				hdr.PAXRecords = map[string]string{paxOpaque: v}
			}
		}
		n, err := writeEntry(tw, p, hdr)
		total += n
		return err
	})
	if err != nil {
		return total, fmt.Errorf("rootfs: pack volume %s: %w", dir, err)
	}
	return total, nil
}

func getXattr(p, name string) (string, error) {
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(buf[:n]), "\x00"), nil
}
