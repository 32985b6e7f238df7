package rootfs

import (
	"archive/tar"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// An OCI image is a stack of layers (issue 32). Each layer is a tar whose
// deletions are AUFS-style marker files (image-spec layer.md): ".wh.NAME"
// deletes NAME of the layers below, ".wh..wh..opq" hides everything the
// layers below had in its directory. UnpackLayer keeps a layer as
// overlayfs keeps an upper dir (a whiteout is a character device 0:0, an
// opaque directory carries trusted.overlay.opaque=y), so the unpacked
// layer can be stacked by overlayfs itself or merged by Flatten.

const (
	whPrefix = ".wh."
	// whMeta starts AUFS's own bookkeeping (".wh..wh.plnk", ".wh..wh.aufs"),
	// which carries nothing an image means.
	whMeta   = whPrefix + whPrefix
	whOpaque = whMeta + ".opq"
	paxXattr = "SCHILY.xattr."
)

// layerState is what an extraction in layer mode keeps until the end:
// deletions are applied after every entry is in, because a whiteout
// deletes from the layers below only (image-spec: "files that are present
// in the same layer as a whiteout file can only be hidden by whiteout
// files in subsequent layers"), whatever the order of the two in the tar.
type layerState struct {
	whiteouts []marker
	opaque    []marker
	// skipped: names of skipped entries, so that a hard link to one is
	// skipped too rather than refused as a link to nothing.
	skipped map[string]bool
}

// marker is a deletion to apply: path is what it names (the whited-out
// path, the opaque directory), entry the tar entry's name, for errors.
type marker struct{ path, entry string }

// UnpackLayer unpacks one OCI image layer (an uncompressed tar stream: the
// caller decompresses and checks digests) into dir, which must exist and be
// empty, in overlayfs form: a `.wh.NAME` entry becomes a whiteout of NAME
// (a char device 0:0), `.wh..wh..opq` makes its directory opaque (xattr
// trusted.overlay.opaque=y).
//
// Extract's safety rules hold (nothing written outside dir or through a
// symlink, hard links only to earlier entries of the layer, ".." and
// absolute names refused, lim bounds it), with the image spec's
// differences: symlink targets are kept verbatim (never followed on the
// host, resolved in the sandbox's root); device nodes and fifos (and hard
// links to them) are skipped and counted (Stats.Skipped); the PAX xattrs user.* and
// security.capability are set, any overlay xattr (trusted.overlay.*,
// user.overlay.*) is refused (a layer must not plant overlayfs's metadata)
// and others are ignored. A whiteout of ".", ".." or of a name with a
// slash, or an entry below a whiteout, is refused. A whiteout of a name the
// layer itself holds deletes from the layers below only: a directory of
// that name becomes opaque, a file or symlink stays as it is.
//
// On any error the error names the entry and dir is left empty.
func UnpackLayer(r io.Reader, dir string, lim Limits) (Stats, error) {
	x, err := newExtractor(dir, lim, false)
	if err != nil {
		return Stats{}, err
	}
	defer unix.Close(x.root)
	x.layer = &layerState{skipped: map[string]bool{}}
	err = x.readAll(r)
	if err == nil {
		err = x.finishLayer()
	}
	if err == nil {
		err = x.finishDirs()
	}
	if err != nil {
		// An opaque root is a mark on dir itself, which clean leaves.
		if xerr := unix.Fremovexattr(x.root, opaqueXattr); xerr != nil && xerr != unix.ENODATA {
			err = fmt.Errorf("%w (cleanup of %s's opaque mark also failed: %v)", err, dir, xerr)
		}
		if cerr := clean(dir); cerr != nil {
			err = fmt.Errorf("%w (cleanup of %s also failed: %v)", err, dir, cerr)
		}
		return Stats{}, err
	}
	return x.st, nil
}

// layerEntry does what is particular to a layer's entry name, hdr; done
// says it is fully handled (a marker recorded, an entry skipped).
func (x *extractor) layerEntry(name string, hdr *tar.Header) (done bool, err error) {
	if err := checkXattrs(hdr); err != nil {
		return true, x.unsafe("%v", err)
	}
	dir, base := path.Split(name)
	if slices.ContainsFunc(strings.Split(dir, "/"), isWhiteoutName) {
		return true, x.unsafe("entry below a whiteout")
	}
	if isWhiteoutName(base) {
		return true, x.marker(name, base)
	}
	skip := false
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		skip = true
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		skip = err == nil && x.layer.skipped[target]
	}
	if skip {
		// What the layer made earlier at the name stays (nothing is made in
		// its place), and is what a link to the name finds.
		x.st.Skipped++
		if _, made := x.kinds[name]; !made {
			x.layer.skipped[name] = true
		}
		return true, nil
	}
	delete(x.layer.skipped, name) // a later entry of the name is what a link finds
	return false, nil
}

func isWhiteoutName(s string) bool { return strings.HasPrefix(s, whPrefix) }

// marker records the whiteout or opaque marker at name (base: its last
// component); its parent directories are made now, so that what follows
// in the layer meets them as it would on any runtime.
func (x *extractor) marker(name, base string) error {
	target := strings.TrimPrefix(base, whPrefix)
	switch {
	case base == whOpaque:
	case strings.HasPrefix(base, whMeta):
		return nil
	case target == "" || target == "." || target == ".." || strings.Contains(target, "/"):
		return x.unsafe("whiteout of %q", target)
	}
	pfd, _, err := x.openParent(name, true)
	if err != nil {
		return err
	}
	unix.Close(pfd)
	dir := path.Dir(name)
	if base == whOpaque {
		x.layer.opaque = append(x.layer.opaque, marker{dir, x.cur})
	} else {
		x.layer.whiteouts = append(x.layer.whiteouts, marker{path.Join(dir, target), x.cur})
	}
	return nil
}

// finishLayer applies the layer's markers: a whiteout becomes a char
// device 0:0 where the layer has nothing, makes the layer's own directory
// of that name opaque, and leaves its own file or symlink be; an opaque
// marker marks its directory.
func (x *extractor) finishLayer() error {
	for _, m := range x.layer.opaque {
		x.cur = m.entry
		pfd, _, err := x.openParent(path.Join(m.path, whOpaque), false)
		if err != nil {
			return err
		}
		err = unix.Fsetxattr(pfd, opaqueXattr, []byte("y"), 0)
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("rootfs: entry %q: mark opaque: %w", x.cur, err)
		}
	}
	for _, m := range x.layer.whiteouts {
		x.cur = m.entry
		if err := x.applyWhiteout(m.path); err != nil {
			return err
		}
	}
	return nil
}

func (x *extractor) applyWhiteout(name string) error {
	pfd, leaf, typ, err := x.openLeaf(name, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	switch typ {
	case 0:
		if err := x.count(); err != nil {
			return err
		}
		if err := unix.Mknodat(pfd, leaf, unix.S_IFCHR|0o000, 0); err != nil {
			return fmt.Errorf("rootfs: entry %q: whiteout: %w", x.cur, err)
		}
	case unix.S_IFDIR:
		fd, err := openDirNoFollow(pfd, leaf)
		if err == nil {
			err = unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0)
			unix.Close(fd)
		}
		if err != nil {
			return fmt.Errorf("rootfs: entry %q: mark opaque: %w", x.cur, err)
		}
	}
	return nil
}

// overlayXattr says whether name is overlayfs's own metadata, which only
// the kernel (or UnpackLayer's markers) may write.
func overlayXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

// keptXattr says whether a layer's xattr name is kept: a user's own, and
// file capabilities (ping, newuidmap...); the rest (SELinux labels, ACLs,
// other trusted.*) mean nothing in a sandbox or are the host's to set.
func keptXattr(name string) bool {
	return (strings.HasPrefix(name, "user.") || name == "security.capability") && !overlayXattr(name)
}

// checkXattrs refuses a header that would plant overlay metadata.
func checkXattrs(hdr *tar.Header) error {
	for k := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattr); ok && overlayXattr(name) {
			return fmt.Errorf("xattr %s is overlayfs's own; a layer may not carry it", name)
		}
	}
	return nil
}

// setXattrs sets a layer entry's kept xattrs on fd (after its owner: chown
// clears security.capability).
func (x *extractor) setXattrs(fd int, hdr *tar.Header) error {
	if x.layer == nil {
		return nil
	}
	var names []string
	for k := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattr); ok && keptXattr(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		if err := unix.Fsetxattr(fd, name, []byte(hdr.PAXRecords[paxXattr+name]), 0); err != nil {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
	}
	return nil
}
