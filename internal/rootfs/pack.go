package rootfs

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sandstorm/internal/errdefs"
)

// A template is identified across a fleet by the digest of its rootfs
// (issue 9: "Templates are identified by digest; a node fetches a
// template's rootfs from the master once and caches it"). The digest is
// the SHA-256 of Pack's tarball of the directory, written as OCI image
// digests are ("sha256:<64 hex>", OCI image-spec descriptor.md), so the
// same tree gives the same digest on every machine and a node can check
// what it was sent before it uses it.

// DigestPrefix starts every digest.
const DigestPrefix = "sha256:"

// ValidDigest reports whether d is "sha256:" and 64 lowercase hex digits:
// the only form a digest takes, checked before one names a directory.
func ValidDigest(d string) bool {
	h, ok := strings.CutPrefix(d, DigestPrefix)
	if !ok || len(h) != sha256.Size*2 {
		return false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Pack writes dir as a tarball to w, the same bytes for the same tree:
// entries in lexical order (filepath.WalkDir), numeric owners only (no
// user names, which differ between machines), modification times in
// whole seconds and no access or change times (Extract restores the
// first and cannot restore the others). Regular files, directories and
// symlinks are written; hard links are written as the files they are;
// devices, fifos and sockets are left out (a sandbox gets its /dev from
// gVisor, and Extract refuses them).
func Pack(dir string, w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	tw := tar.NewWriter(bw)
	err := walkEntries(dir, func(p, rel string, fi fs.FileInfo) error {
		link, ok, err := packable(p, fi, false)
		if !ok {
			return err
		}
		hdr, err := entryHeader(fi, link, filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		hdr.ModTime = hdr.ModTime.Truncate(time.Second)
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.PAXRecords = nil
		_, err = writeEntry(tw, p, hdr)
		return err
	})
	if err != nil {
		return fmt.Errorf("rootfs: pack %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// walkEntries calls entry for every entry below dir (not dir itself), in
// lexical order (filepath.WalkDir), with its path, its name relative to
// dir and what lstat says of it.
func walkEntries(dir string, entry func(p, rel string, fi fs.FileInfo) error) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return entry(p, rel, fi)
	})
}

// packable says whether the entry at p, fi, goes into a tarball — a
// regular file, a directory, a symlink (link: its target) and, with
// whiteouts, an overlayfs whiteout (a 0/0 character device) — and fails
// for any other device when whiteouts are packed.
func packable(p string, fi fs.FileInfo, whiteouts bool) (link string, ok bool, err error) {
	switch t := fi.Mode().Type(); {
	case t == fs.ModeSymlink:
		link, err = os.Readlink(p)
		return link, err == nil, err
	case t == 0, t == fs.ModeDir:
		return "", true, nil
	case whiteouts && t == fs.ModeDevice|fs.ModeCharDevice:
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Rdev != 0 {
			return "", false, fmt.Errorf("rootfs: %s is a device, not a whiteout", p)
		}
		return "", true, nil
	}
	return "", false, nil
}

// entryHeader is the PAX header of fi named name (a directory's with a
// trailing slash), with numeric owners only: user and group names differ
// between machines.
func entryHeader(fi fs.FileInfo, link, name string) (*tar.Header, error) {
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return nil, err
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	return hdr, nil
}

// writeEntry writes hdr and, for a regular file, the content of p, and
// returns the bytes of content written. A file that grew or shrank while
// being read would make a tar that does not match its header: that is an
// error rather than a tarball sent.
func writeEntry(tw *tar.Writer, p string, hdr *tar.Header) (int64, error) {
	if err := tw.WriteHeader(hdr); err != nil {
		return 0, err
	}
	if hdr.Typeflag != tar.TypeReg {
		return 0, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := io.Copy(tw, io.LimitReader(f, hdr.Size+1))
	if err != nil {
		return n, err
	}
	if n != hdr.Size {
		return n, fmt.Errorf("rootfs: %s changed size while it was packed", p)
	}
	return n, nil
}

// Digest is the digest of dir: the SHA-256 of Pack's tarball of it.
func Digest(dir string) (string, error) {
	h := sha256.New()
	if err := Pack(dir, h); err != nil {
		return "", err
	}
	return DigestPrefix + hex.EncodeToString(h.Sum(nil)), nil
}

// ErrDigestMismatch is wrapped when what was received is not what its
// digest says.
var ErrDigestMismatch = errdefs.Refine(errdefs.ErrBadInput, "rootfs digest mismatch")

// Cache holds rootfs directories by digest under Dir: Dir/<hex>/ is the
// tree whose digest is sha256:<hex>. An entry appears whole or not at
// all (it is extracted beside it and renamed into place), so a node
// killed during a fetch leaves only a temporary directory, which the next
// Put of that digest replaces.
type Cache struct{ Dir string }

// Path is where the tree of digest d is, and whether it is there.
func (c Cache) Path(d string) (string, bool) {
	if !ValidDigest(d) {
		return "", false
	}
	p := filepath.Join(c.Dir, strings.TrimPrefix(d, DigestPrefix))
	fi, err := os.Stat(p)
	return p, err == nil && fi.IsDir()
}

// Put extracts the tarball r (untrusted: Extract's rules and lim apply)
// as digest d, and keeps it only if the SHA-256 of the whole stream is
// d. Putting a digest the cache has is a no-op that does not read r.
func (c Cache) Put(d string, r io.Reader, lim Limits) (string, error) {
	if !ValidDigest(d) {
		return "", fmt.Errorf("rootfs: %q is not a digest (sha256:<64 hex digits>)", d)
	}
	if p, ok := c.Path(d); ok {
		return p, nil
	}
	hexd := strings.TrimPrefix(d, DigestPrefix)
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(c.Dir, ".put-"+hexd[:12]+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	// 0o755 as Extract's trees are: the sandbox's gofer reads it.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	h := sha256.New()
	tee := io.TeeReader(r, h)
	if _, err := Extract(tee, tmp, lim); err != nil {
		return "", err
	}
	// What follows the tar's end is hashed too: the digest is of every
	// byte sent, so nothing can ride along unchecked.
	if _, err := io.Copy(io.Discard, io.LimitReader(tee, 1<<20)); err != nil {
		return "", err
	}
	if got := DigestPrefix + hex.EncodeToString(h.Sum(nil)); got != d {
		return "", fmt.Errorf("%w: sent as %s, received %s", ErrDigestMismatch, d, got)
	}
	dst := filepath.Join(c.Dir, hexd)
	if err := os.Rename(tmp, dst); err != nil {
		if _, ok := c.Path(d); ok {
			return dst, nil // another Put of the same digest won
		}
		return "", err
	}
	return dst, nil
}

// Remove deletes digest d's tree, if the cache has it.
func (c Cache) Remove(d string) error {
	p, ok := c.Path(d)
	if !ok {
		return nil
	}
	return os.RemoveAll(p)
}
