package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// lent is one entry of a test layer: ent's fields plus PAX records and a
// device number.
type lent struct {
	ent
	pax      map[string]string
	maj, min int64
}

func le(name string, typ byte, body string) lent {
	return lent{ent: ent{name: name, typ: typ, body: body}}
}

func lnk(name string, typ byte, link string) lent {
	return lent{ent: ent{name: name, typ: typ, link: link}}
}

func mkLayer(t testing.TB, ents ...lent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatPAX,
			PAXRecords: e.pax, Devmajor: e.maj, Devminor: e.min}
		if h.Mode == 0 {
			h.Mode = 0o644
			if e.typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("WriteHeader %s: %v", e.name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root (mknod, trusted.* xattrs, chown), as the node runs")
	}
}

// capNetRaw is a VFS capability (revision 2, effective) granting
// CAP_NET_RAW: what ping carries in Debian's image.
var capNetRaw = string([]byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})

func isWhiteout(t *testing.T, p string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func xattr(p, name string) (string, bool) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}

// TestUnpackLayer: a layer with every kind of entry the image spec allows
// comes out in overlayfs form.
func TestUnpackLayer(t *testing.T) {
	needRoot(t)
	suid := le("usr/bin/su", tar.TypeReg, "su")
	suid.mode, suid.uid, suid.gid = 0o4755, 1000, 1001
	ping := le("usr/bin/ping", tar.TypeReg, "ping")
	ping.mode = 0o755
	ping.pax = map[string]string{
		"SCHILY.xattr.security.capability": capNetRaw,
		"SCHILY.xattr.user.note":           "kept",
		"SCHILY.xattr.security.selinux":    "system_u:object_r:bin_t",
		"SCHILY.xattr.trusted.other":       "ignored",
	}
	etc := le("etc/", tar.TypeDir, "")
	etc.mode, etc.pax = 0o750, map[string]string{"SCHILY.xattr.user.dir": "d"}
	null := le("dev/null", tar.TypeChar, "")
	null.maj, null.min = 1, 3
	data := mkLayer(t,
		le("./", tar.TypeDir, ""),
		etc,
		le("etc/.wh..wh..opq", tar.TypeReg, ""),
		le("etc/hosts", tar.TypeReg, "127.0.0.1 localhost\n"),
		suid, ping,
		lnk("usr/bin/su2", tar.TypeLink, "usr/bin/su"),
		lnk("usr/lib/rel", tar.TypeSymlink, "../../../../bin/sh"), // verbatim, even past the root
		lnk("etc/mtab", tar.TypeSymlink, "/proc/self/mounts"),
		le(".wh.gone", tar.TypeReg, ""),
		le("var/.wh.cache", tar.TypeReg, ""),
		le(".wh..wh.plnk", tar.TypeDir, ""), // AUFS's bookkeeping: ignored
		null,
		le("run/fifo", tar.TypeFifo, ""),
		le("usr/bin/su", tar.TypeReg, "su-again"), // a later entry of a name wins
	)
	dir := t.TempDir()
	st, err := UnpackLayer(bytes.NewReader(data), dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// etc, hosts, usr, usr/bin, su (once: replaced), ping, su2, usr/lib,
	// rel, mtab, gone, var, var/cache.
	if st.Files != 13 || st.Skipped != 2 {
		t.Errorf("stats = %+v, want 13 files and 2 skipped", st)
	}
	want := []string{"etc", "etc/hosts", "etc/mtab", "gone", "usr", "usr/bin", "usr/bin/ping",
		"usr/bin/su", "usr/bin/su2", "usr/lib", "usr/lib/rel", "var", "var/cache"}
	if got := listTree(t, dir); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("tree = %v\nwant %v", got, want)
	}
	for _, w := range []string{"gone", "var/cache"} {
		if !isWhiteout(t, filepath.Join(dir, w)) {
			t.Errorf("%s is not a whiteout", w)
		}
	}
	if v, _ := xattr(filepath.Join(dir, "etc"), opaqueXattr); v != "y" {
		t.Errorf("etc opaque = %q", v)
	}
	if v, _ := xattr(filepath.Join(dir, "etc"), "user.dir"); v != "d" {
		t.Errorf("etc user.dir = %q", v)
	}
	if fi, _ := os.Lstat(filepath.Join(dir, "etc")); fi.Mode() != fs.ModeDir|0o750 || !fi.ModTime().Equal(mtime) {
		t.Errorf("etc: %v %v", fi.Mode(), fi.ModTime())
	}
	p := filepath.Join(dir, "usr/bin/ping")
	if v, _ := xattr(p, "security.capability"); v != capNetRaw {
		t.Errorf("ping capability = %x", v)
	}
	if v, _ := xattr(p, "user.note"); v != "kept" {
		t.Errorf("ping user.note = %q", v)
	}
	for _, x := range []string{"security.selinux", "trusted.other"} {
		if _, ok := xattr(p, x); ok {
			t.Errorf("ping carries %s", x)
		}
	}
	if l, _ := os.Readlink(filepath.Join(dir, "usr/lib/rel")); l != "../../../../bin/sh" {
		t.Errorf("rel -> %q", l)
	}
	su, _ := os.Lstat(filepath.Join(dir, "usr/bin/su"))
	su2, _ := os.Lstat(filepath.Join(dir, "usr/bin/su2"))
	if b, _ := os.ReadFile(filepath.Join(dir, "usr/bin/su")); string(b) != "su-again" {
		t.Errorf("su = %q, want the later entry's", b)
	}
	// The later su replaced the name; su2 still links the first one.
	if os.SameFile(su, su2) {
		t.Error("su2 is the later su's inode, not the one it linked")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "usr/bin/su2")); string(b) != "su" {
		t.Errorf("su2 = %q, want the inode it linked (the first su)", b)
	}
	if su2.Mode() != fs.ModeSetuid|0o755 {
		t.Errorf("su2 mode %v", su2.Mode())
	}
	if s := su2.Sys().(*syscall.Stat_t); s.Uid != 1000 || s.Gid != 1001 || s.Nlink != 1 {
		t.Errorf("su2 owner %d:%d nlink %d", s.Uid, s.Gid, s.Nlink)
	}
}

// TestUnpackLayerHardLink: a hard link shares its target's inode.
func TestUnpackLayerHardLink(t *testing.T) {
	dir := t.TempDir()
	data := mkLayer(t, le("a/f", tar.TypeReg, "x"), lnk("b/g", tar.TypeLink, "a/f"))
	if _, err := UnpackLayer(bytes.NewReader(data), dir, Limits{}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Lstat(filepath.Join(dir, "a/f"))
	b, _ := os.Lstat(filepath.Join(dir, "b/g"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Fatal("b/g is not a/f's inode")
	}
}

// TestUnpackLayerWhiteoutOfItsOwn: a whiteout deletes from the layers
// below only, whichever comes first in the tar: the layer's own directory
// of that name becomes opaque, its own file stays.
func TestUnpackLayerWhiteoutOfItsOwn(t *testing.T) {
	needRoot(t)
	for _, order := range []string{"whiteout first", "whiteout last"} {
		t.Run(order, func(t *testing.T) {
			wh := []lent{le(".wh.d", tar.TypeReg, ""), le(".wh.f", tar.TypeReg, "")}
			own := []lent{le("d/x", tar.TypeReg, "x"), le("f", tar.TypeReg, "f")}
			ents := append(append([]lent{}, wh...), own...)
			if order == "whiteout last" {
				ents = append(append([]lent{}, own...), wh...)
			}
			dir := t.TempDir()
			if _, err := UnpackLayer(bytes.NewReader(mkLayer(t, ents...)), dir, Limits{}); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(listTree(t, dir), " "); got != "d d/x f" {
				t.Errorf("tree = %s", got)
			}
			if v, _ := xattr(filepath.Join(dir, "d"), opaqueXattr); v != "y" {
				t.Errorf("d opaque = %q", v)
			}
			if fi, err := os.Lstat(filepath.Join(dir, "f")); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("f: %v", err)
			}
		})
	}
}

// snapshot is what a test's stand-in for a host directory holds: names,
// contents and the directory's own xattrs; it must not change.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	for _, p := range listTree(t, dir) {
		c, _ := os.ReadFile(filepath.Join(dir, p))
		b.WriteString(p + "=" + string(c) + ";")
	}
	buf := make([]byte, 4096)
	n, _ := unix.Llistxattr(dir, buf)
	b.Write(buf[:max(n, 0)])
	return b.String()
}

func outsideDir(t *testing.T) (string, string) {
	t.Helper()
	outside := t.TempDir() // stands in for the host's /etc
	if err := os.WriteFile(filepath.Join(outside, "passwd"), []byte("root:x:0:0"), 0o644); err != nil {
		t.Fatal(err)
	}
	return outside, snapshot(t, outside)
}

// TestUnpackLayerRefusals: what a hostile layer may try is refused, names
// its entry, leaves dir empty and the outside as it was.
func TestUnpackLayerRefusals(t *testing.T) {
	needRoot(t)
	outside, before := outsideDir(t)
	good := le("ok/file", tar.TypeReg, "ok")
	pax := func(e lent, k, v string) lent { e.pax = map[string]string{k: v}; return e }
	cases := []struct {
		name  string
		ents  []lent
		want  error
		entry string
	}{
		{"dotdot", []lent{good, le("../x", tar.TypeReg, "x")}, ErrUnsafe, "../x"},
		{"absolute", []lent{good, le("/abs", tar.TypeReg, "x")}, ErrUnsafe, "/abs"},
		{"file through symlink", []lent{lnk("etc", tar.TypeSymlink, outside),
			le("etc/passwd", tar.TypeReg, "pwned")}, ErrUnsafe, "etc/passwd"},
		{"dir through symlink", []lent{lnk("etc", tar.TypeSymlink, outside),
			le("etc/sub/", tar.TypeDir, "")}, ErrUnsafe, "etc/sub/"},
		{"whiteout through symlink", []lent{lnk("etc", tar.TypeSymlink, outside),
			le("etc/.wh.passwd", tar.TypeReg, "")}, ErrUnsafe, "etc/.wh.passwd"},
		{"whiteout before its symlink parent", []lent{le("etc/.wh.passwd", tar.TypeReg, ""),
			lnk("etc", tar.TypeSymlink, outside)}, ErrUnsafe, `"etc"`},
		{"opaque through symlink", []lent{lnk("etc", tar.TypeSymlink, outside),
			le("etc/.wh..wh..opq", tar.TypeReg, "")}, ErrUnsafe, "etc/.wh..wh..opq"},
		{"hard link outside (absolute)", []lent{good, lnk("h", tar.TypeLink, filepath.Join(outside, "passwd"))}, ErrUnsafe, `"h"`},
		{"hard link outside (dotdot)", []lent{good, lnk("h", tar.TypeLink, "../passwd")}, ErrUnsafe, `"h"`},
		{"hard link through symlink", []lent{lnk("etc", tar.TypeSymlink, outside),
			lnk("h", tar.TypeLink, "etc/passwd")}, ErrUnsafe, `"h"`},
		{"hard link to a later entry", []lent{lnk("h", tar.TypeLink, "f"), le("f", tar.TypeReg, "")}, ErrUnsafe, `"h"`},
		{"whiteout of dotdot", []lent{good, le("ok/.wh...", tar.TypeReg, "")}, ErrUnsafe, "ok/.wh..."},
		{"whiteout of dot", []lent{good, le("ok/.wh..", tar.TypeReg, "")}, ErrUnsafe, "ok/.wh.."},
		{"whiteout of nothing", []lent{good, le(".wh.", tar.TypeReg, "")}, ErrUnsafe, ".wh."},
		{"entry below a whiteout", []lent{good, le(".wh.a/b", tar.TypeReg, "")}, ErrUnsafe, ".wh.a/b"},
		{"trusted.overlay xattr", []lent{good, pax(le("d/", tar.TypeDir, ""),
			"SCHILY.xattr.trusted.overlay.opaque", "y")}, ErrUnsafe, "d/"},
		{"trusted.overlay on a file", []lent{good, pax(le("f", tar.TypeReg, ""),
			"SCHILY.xattr.trusted.overlay.metacopy", "")}, ErrUnsafe, `"f"`},
		{"user.overlay xattr", []lent{good, pax(le("d/", tar.TypeDir, ""),
			"SCHILY.xattr.user.overlay.redirect", "/x")}, ErrUnsafe, "d/"},
		{"too many files", []lent{le("1", tar.TypeReg, ""), le("2", tar.TypeReg, ""),
			le("3", tar.TypeReg, ""), le("4", tar.TypeReg, "")}, ErrTooLarge, `"4"`},
		{"too many whiteouts", []lent{le("1", tar.TypeReg, ""), le("2", tar.TypeReg, ""),
			le("3", tar.TypeReg, ""), le(".wh.4", tar.TypeReg, "")}, ErrTooLarge, ".wh.4"},
		{"too many bytes", []lent{le("small", tar.TypeReg, "0123456789"),
			le("big", tar.TypeReg, strings.Repeat("y", 91))}, ErrTooLarge, "big"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := UnpackLayer(bytes.NewReader(mkLayer(t, tc.ents...)), dir, Limits{MaxBytes: 100, MaxFiles: 3})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.entry) {
				t.Errorf("error %q does not name entry %s", err, tc.entry)
			}
			assertEmpty(t, dir)
			if after := snapshot(t, outside); after != before {
				t.Fatalf("the outside changed: %q, was %q", after, before)
			}
		})
	}
}

// TestUnpackLayerDestination: dir must exist and be empty.
func TestUnpackLayerDestination(t *testing.T) {
	data := mkLayer(t, le("f", tar.TypeReg, "x"))
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "keep"), []byte("mine"), 0o644)
	if _, err := UnpackLayer(bytes.NewReader(data), dir, Limits{}); err == nil {
		t.Fatal("unpacked into a non-empty dir")
	}
	if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
		t.Fatal("the dir's own file is gone")
	}
	if _, err := UnpackLayer(bytes.NewReader(data), filepath.Join(dir, "missing"), Limits{}); err == nil {
		t.Fatal("unpacked into a missing dir")
	}
}

// TestUnpackLayerSkipsDevices: devices and fifos, and hard links to them,
// are skipped and counted, not refused; a device of a name the layer made
// before leaves that entry, which a link then finds.
func TestUnpackLayerSkipsDevices(t *testing.T) {
	null := le("dev/null", tar.TypeChar, "")
	null.maj, null.min = 1, 3
	sda := le("dev/sda", tar.TypeBlock, "")
	sda.maj = 8
	over := le("f", tar.TypeChar, "")
	over.maj, over.min = 1, 5
	dir := t.TempDir()
	st, err := UnpackLayer(bytes.NewReader(mkLayer(t, null, sda, le("p", tar.TypeFifo, ""),
		lnk("dev/null2", tar.TypeLink, "dev/null"), le("f", tar.TypeReg, "f"), over,
		lnk("g", tar.TypeLink, "f"))), dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Skipped != 5 || st.Files != 2 {
		t.Errorf("stats = %+v, want 5 skipped and 2 files", st)
	}
	sameShape(t, shape(t, dir), map[string]string{"f": "file:f", "g": "file:f"})
}

// TestUnpackLayerOpaqueRootUndone: a layer that marks its root opaque and
// then fails leaves dir without the mark.
func TestUnpackLayerOpaqueRootUndone(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	ok := mkLayer(t, le(whOpaque, tar.TypeReg, ""), le("f", tar.TypeReg, "x"))
	if _, err := UnpackLayer(bytes.NewReader(ok), dir, Limits{}); err != nil {
		t.Fatal(err)
	}
	if v, _ := xattr(dir, opaqueXattr); v != "y" {
		t.Fatalf("root opaque = %q", v)
	}
	dir = t.TempDir()
	// Two entries, three objects (x, x/y, the whiteout): opaque marks are
	// applied before whiteouts, so the whiteout over MaxFiles fails after
	// the root is marked.
	bad := mkLayer(t, le(whOpaque, tar.TypeReg, ""), le("x/y/.wh.b", tar.TypeReg, ""))
	if _, err := UnpackLayer(bytes.NewReader(bad), dir, Limits{MaxFiles: 2}); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "x/y/.wh.b") {
		t.Fatalf("err = %v", err)
	}
	assertEmpty(t, dir)
	if _, ok := xattr(dir, opaqueXattr); ok {
		t.Error("the failed layer's root is still opaque")
	}
}

// FuzzUnpackLayer feeds arbitrary bytes to UnpackLayer and Flatten: nothing
// is made outside their directories, a failed unpack leaves its directory
// empty, a layer holds only directories, files, symlinks and whiteouts, and
// its flattening no whiteout and no overlay xattr.
func FuzzUnpackLayer(f *testing.F) {
	f.Add(mkLayer(f, le("d/f", tar.TypeReg, "x"), le("d/.wh.g", tar.TypeReg, ""),
		le("d/.wh..wh..opq", tar.TypeReg, ""), lnk("l", tar.TypeSymlink, "/etc"), lnk("h", tar.TypeLink, "d/f")))
	f.Add(mkLayer(f, lnk("a", tar.TypeSymlink, ".."), le("a/.wh.x", tar.TypeReg, "")))
	f.Add(mkLayer(f, le(".wh...", tar.TypeReg, ""), le("dev/null", tar.TypeChar, "")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		root := t.TempDir()
		layer, flat := filepath.Join(root, "layer"), filepath.Join(root, "flat")
		os.Mkdir(layer, 0o755)
		os.Mkdir(flat, 0o755)
		st, err := UnpackLayer(bytes.NewReader(data), layer, Limits{MaxBytes: 1 << 20, MaxFiles: 1000})
		got := listTree(t, layer)
		if err != nil && len(got) != 0 {
			t.Fatalf("failed unpack (%v) left %v", err, got)
		}
		if err == nil && len(got) != st.Files {
			t.Fatalf("stats report %d files, layer has %d", st.Files, len(got))
		}
		for _, p := range got {
			fi, _ := os.Lstat(filepath.Join(layer, p))
			if typ := fi.Mode().Type(); typ&^(fs.ModeDir|fs.ModeSymlink) != 0 && !isWhiteout(t, filepath.Join(layer, p)) {
				t.Fatalf("%s has forbidden type %v", p, typ)
			}
		}
		if err == nil {
			if err := Flatten([]string{layer}, flat); err != nil {
				t.Fatalf("flatten of an unpacked layer: %v", err)
			}
			noOverlayState(t, flat)
		}
		if ents, _ := os.ReadDir(root); len(ents) != 2 {
			t.Fatalf("root holds %v", ents)
		}
	})
}
