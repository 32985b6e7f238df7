package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestVolumeRoundTrip: a volume with a whiteout, an opaque directory, a
// symlink and files comes back the same through PackVolume and Tree (as
// root: whiteouts and trusted xattrs need it, as the node has it).
func TestVolumeRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (mknod, trusted.* xattrs), as the node runs")
	}
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "etc", "new"), 0o755)
	os.WriteFile(filepath.Join(src, "etc", "new", "f"), []byte("hello"), 0o640)
	os.Symlink("/etc/new/f", filepath.Join(src, "l"))
	if err := unix.Mknod(filepath.Join(src, "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(src, "etc", "new"), opaqueXattr, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	n, err := PackVolume(src, tw, "volume/")
	if err != nil || n != 5 {
		t.Fatalf("pack: %d bytes, %v", n, err)
	}
	tw.Close()
	dst := t.TempDir()
	tr, err := NewTree(dst, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	r := tar.NewReader(&buf)
	for {
		hdr, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		hdr.Name = hdr.Name[len("volume/"):]
		if err := tr.Add(hdr, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tr.Finish(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "etc", "new", "f")); string(b) != "hello" {
		t.Errorf("file: %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "l")); l != "/etc/new/f" {
		t.Errorf("symlink: %q", l)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dst, "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: %+v %v", st, err)
	}
	if v, err := getXattr(filepath.Join(dst, "etc", "new"), opaqueXattr); v != "y" {
		t.Errorf("opaque: %q %v", v, err)
	}
}

// TestVolumeRefusals: what a volume stream may not do — a device that is
// not a whiteout, a path out of the tree, an opaque mark of another value,
// more than its bound — is refused and leaves nothing.
func TestVolumeRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		hdr  tar.Header
		lim  Limits
		want error
	}{
		{"device", tar.Header{Name: "d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, Limits{}, ErrUnsafe},
		{"traversal", tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1}, Limits{}, ErrUnsafe},
		{"opaque", tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, PAXRecords: map[string]string{paxOpaque: "z"}}, Limits{}, ErrUnsafe},
		{"size", tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 10}, Limits{MaxBytes: 5}, ErrTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := t.TempDir()
			tr, err := NewTree(dst, c.lim)
			if err != nil {
				t.Fatal(err)
			}
			err = tr.Add(&c.hdr, bytes.NewReader(make([]byte, c.hdr.Size)))
			if err == nil {
				_, err = tr.Finish()
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			tr.Abort()
			if ents, _ := os.ReadDir(dst); len(ents) != 0 {
				t.Errorf("left %v", ents)
			}
		})
	}
}
