package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// unpack writes a layer of ents into a new directory (under parent, or a
// temporary one when parent is "") and returns it.
func unpack(t *testing.T, parent string, ents ...lent) string {
	t.Helper()
	dir := t.TempDir()
	if parent != "" {
		var err error
		if dir, err = os.MkdirTemp(parent, "layer"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := UnpackLayer(bytes.NewReader(mkLayer(t, ents...)), dir, Limits{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shape is a tree as the tests compare it: each path's type and content
// (a file's bytes, a symlink's target).
func shape(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range listTree(t, dir) {
		full := filepath.Join(dir, p)
		fi, err := os.Lstat(full)
		if err != nil {
			t.Fatal(err)
		}
		switch fi.Mode().Type() {
		case fs.ModeDir:
			out[p] = "dir"
		case fs.ModeSymlink:
			l, _ := os.Readlink(full)
			out[p] = "link:" + l
		case 0:
			b, _ := os.ReadFile(full)
			out[p] = "file:" + string(b)
		default:
			out[p] = fi.Mode().Type().String()
		}
	}
	return out
}

func sameShape(t *testing.T, got, want map[string]string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tree:\n got %v\nwant %v", got, want)
	}
}

// noOverlayState fails if anything in dir is a whiteout or carries an
// overlay xattr.
func noOverlayState(t *testing.T, dir string) {
	t.Helper()
	for _, p := range append(listTree(t, dir), ".") {
		full := filepath.Join(dir, p)
		if isWhiteout(t, full) {
			t.Errorf("%s is a whiteout", p)
		}
		buf := make([]byte, 4096)
		n, _ := unix.Llistxattr(full, buf)
		for _, x := range strings.Split(string(buf[:max(n, 0)]), "\x00") {
			if overlayXattr(x) {
				t.Errorf("%s carries %s", p, x)
			}
		}
	}
}

func sameInode(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err1 := os.Lstat(a)
	fb, err2 := os.Lstat(b)
	if err1 != nil || err2 != nil {
		t.Fatalf("lstat: %v %v", err1, err2)
	}
	return os.SameFile(fa, fb)
}

// TestFlatten: three layers merged: whiteouts of a file and of a
// directory, an opaque directory, type changes both ways, an upper
// directory's metadata over the lower's; files are the layers' inodes and
// the layers are left as they were.
func TestFlatten(t *testing.T) {
	needRoot(t)
	keep2 := le("keep/", tar.TypeDir, "")
	keep2.mode, keep2.uid, keep2.pax = 0o700, 7, map[string]string{"SCHILY.xattr.user.v": "2"}
	keep1 := le("keep/", tar.TypeDir, "")
	keep1.pax = map[string]string{"SCHILY.xattr.user.v": "1", "SCHILY.xattr.user.old": "x"}
	l1 := unpack(t, "",
		le("a", tar.TypeReg, "a1"),
		le("d/x", tar.TypeReg, "x"), le("d/y/z", tar.TypeReg, "z"),
		keep1, le("keep/k", tar.TypeReg, "k"),
		le("f", tar.TypeReg, "f"),
		lnk("s", tar.TypeSymlink, "a"),
		le("o/lower1", tar.TypeReg, "1"), le("o/sub/lower2", tar.TypeReg, "2"),
		le("dir2file/in", tar.TypeReg, "in"),
		le("file2dir", tar.TypeReg, "file"),
		lnk("link2dir", tar.TypeSymlink, "/usr"),
		le("h1", tar.TypeReg, "shared"), lnk("h2", tar.TypeLink, "h1"),
	)
	l2 := unpack(t, "",
		le("a", tar.TypeReg, "a2"),
		le(".wh.f", tar.TypeReg, ""), le(".wh.d", tar.TypeReg, ""),
		keep2, le("keep/k2", tar.TypeReg, "k2"),
		le("o/.wh..wh..opq", tar.TypeReg, ""), le("o/new", tar.TypeReg, "new"),
		le("dir2file", tar.TypeReg, "now a file"),
		le("file2dir/c", tar.TypeReg, "c"),
		le("link2dir/c", tar.TypeReg, "c"),
		le(".wh.never-there", tar.TypeReg, ""),
	)
	l3 := unpack(t, "", le("d/again", tar.TypeReg, "again"))
	before := []map[string]string{shape(t, l1), shape(t, l2), shape(t, l3)}
	dst := t.TempDir()
	if err := Flatten([]string{l1, l2, l3}, dst); err != nil {
		t.Fatal(err)
	}
	sameShape(t, shape(t, dst), map[string]string{
		"a": "file:a2", "d": "dir", "d/again": "file:again",
		"keep": "dir", "keep/k": "file:k", "keep/k2": "file:k2",
		"s": "link:a", "o": "dir", "o/new": "file:new",
		"dir2file": "file:now a file", "file2dir": "dir", "file2dir/c": "file:c",
		"link2dir": "dir", "link2dir/c": "file:c", "h1": "file:shared", "h2": "file:shared",
	})
	noOverlayState(t, dst)
	for i, l := range []string{l1, l2, l3} {
		sameShape(t, shape(t, l), before[i])
	}
	for file, layer := range map[string]string{"a": l2, "keep/k": l1, "o/new": l2, "h1": l1, "h2": l1, "d/again": l3} {
		if !sameInode(t, filepath.Join(dst, file), filepath.Join(layer, file)) {
			t.Errorf("%s is not its layer's inode", file)
		}
	}
	if !sameInode(t, filepath.Join(dst, "h1"), filepath.Join(dst, "h2")) {
		t.Error("h1 and h2 are two inodes")
	}
	// keep is l2's directory: its mode, owner and xattrs, not l1's.
	fi, _ := os.Lstat(filepath.Join(dst, "keep"))
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode() != fs.ModeDir|0o700 || st.Uid != 7 || !fi.ModTime().Equal(mtime) {
		t.Errorf("keep: %v uid %d %v", fi.Mode(), st.Uid, fi.ModTime())
	}
	if v, _ := xattr(filepath.Join(dst, "keep"), "user.v"); v != "2" {
		t.Errorf("keep user.v = %q", v)
	}
	if _, ok := xattr(filepath.Join(dst, "keep"), "user.old"); ok {
		t.Error("keep kept the lower directory's user.old")
	}
	if fi, _ := os.Lstat(filepath.Join(dst, "s")); !fi.ModTime().Equal(mtime) {
		t.Errorf("symlink mtime %v", fi.ModTime())
	}
}

// TestFlattenNeverFollowsSymlinks: a lower layer's symlinks to a directory
// outside (standing in for the host's /etc) under an upper layer's
// directories, whiteouts and opaque markers of the same names: dst gets
// directories, and the outside is untouched.
func TestFlattenNeverFollowsSymlinks(t *testing.T) {
	needRoot(t)
	outside, before := outsideDir(t)
	l1 := unpack(t, "",
		lnk("etc", tar.TypeSymlink, outside), lnk("lib", tar.TypeSymlink, outside),
		lnk("z", tar.TypeSymlink, outside), lnk("y", tar.TypeSymlink, outside),
		le("back/f", tar.TypeReg, "f"),
	)
	l2 := unpack(t, "",
		le("etc/", tar.TypeDir, ""), le("etc/passwd", tar.TypeReg, "container"),
		le("lib/.wh.passwd", tar.TypeReg, ""),
		le(".wh.z", tar.TypeReg, ""),
		le("y/.wh..wh..opq", tar.TypeReg, ""), le("y/n", tar.TypeReg, "n"),
		lnk("back", tar.TypeSymlink, outside), // a directory becomes a link...
	)
	l3 := unpack(t, "", le("back/passwd", tar.TypeReg, "pwned?")) // ...and a directory again
	dst := t.TempDir()
	if err := Flatten([]string{l1, l2, l3}, dst); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, outside); after != before {
		t.Fatalf("the outside changed: %q, was %q", after, before)
	}
	sameShape(t, shape(t, dst), map[string]string{
		"etc": "dir", "etc/passwd": "file:container", "lib": "dir",
		"y": "dir", "y/n": "file:n", "back": "dir", "back/passwd": "file:pwned?",
	})
	if b, _ := os.ReadFile(filepath.Join(l1, "back/f")); string(b) != "f" {
		t.Error("removing back from dst changed the lower layer")
	}
}

// TestFlattenCopiesAcrossFilesystems: layers on another filesystem (a
// tmpfs) are copied, metadata and all, and a layer's hard links stay one
// inode in dst.
func TestFlattenCopiesAcrossFilesystems(t *testing.T) {
	needRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	ping := le("bin/ping", tar.TypeReg, "ping")
	ping.mode, ping.uid, ping.gid = 0o4711, 3, 4
	ping.pax = map[string]string{"SCHILY.xattr.security.capability": capNetRaw, "SCHILY.xattr.user.n": "1"}
	l1 := unpack(t, mnt, ping, lnk("bin/ping2", tar.TypeLink, "bin/ping"), le("other", tar.TypeReg, "o"))
	dst := t.TempDir()
	if err := Flatten([]string{l1}, dst); err != nil {
		t.Fatal(err)
	}
	sameShape(t, shape(t, dst), map[string]string{
		"bin": "dir", "bin/ping": "file:ping", "bin/ping2": "file:ping", "other": "file:o"})
	p := filepath.Join(dst, "bin/ping")
	if sameInode(t, p, filepath.Join(l1, "bin/ping")) {
		t.Fatal("linked across filesystems?")
	}
	if !sameInode(t, p, filepath.Join(dst, "bin/ping2")) {
		t.Error("ping and ping2 are two copies")
	}
	fi, _ := os.Lstat(p)
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode() != fs.ModeSetuid|0o711 || st.Uid != 3 || st.Gid != 4 || !fi.ModTime().Equal(mtime) {
		t.Errorf("ping: %v %d:%d %v", fi.Mode(), st.Uid, st.Gid, fi.ModTime())
	}
	if v, _ := xattr(p, "security.capability"); v != capNetRaw {
		t.Errorf("capability %x", v)
	}
	if v, _ := xattr(p, "user.n"); v != "1" {
		t.Errorf("user.n %q", v)
	}
}

// TestFlattenRefusals: layers Flatten did not get from UnpackLayer (a
// device, a fifo, an overlay xattr on a file), a missing layer or a dst
// not empty are refused, and dst is left as it was.
func TestFlattenRefusals(t *testing.T) {
	needRoot(t)
	good := unpack(t, "", le("ok/f", tar.TypeReg, "ok"))
	for _, c := range []struct {
		name string
		make func(dir string) error
		want error
	}{
		{"device", func(d string) error {
			return unix.Mknod(filepath.Join(d, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
		}, ErrUnsafe},
		{"fifo", func(d string) error { return unix.Mkfifo(filepath.Join(d, "p"), 0o644) }, ErrUnsafe},
		{"overlay xattr", func(d string) error {
			p := filepath.Join(d, "f")
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
			return unix.Setxattr(p, "trusted.overlay.metacopy", nil, 0)
		}, ErrUnsafe},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := t.TempDir()
			if err := c.make(bad); err != nil {
				t.Fatal(err)
			}
			dst := t.TempDir()
			if err := Flatten([]string{good, bad}, dst); !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			assertEmpty(t, dst)
		})
	}
	dst := t.TempDir()
	if err := Flatten([]string{good, filepath.Join(dst, "missing")}, dst); err == nil {
		t.Error("flattened a missing layer")
	}
	assertEmpty(t, dst)
	os.WriteFile(filepath.Join(dst, "mine"), nil, 0o644)
	if err := Flatten([]string{good}, dst); err == nil {
		t.Error("flattened into a non-empty dst")
	}
	if got := listTree(t, dst); len(got) != 1 {
		t.Errorf("dst now %v", got)
	}
}

// gnode is a generated layer's entry: a directory (with its entries,
// maybe opaque), a file, a symlink or a whiteout.
type gnode struct {
	name   string
	kind   byte // 'd', 'f', 'l', 'w'
	opaque bool
	data   string
	kids   []*gnode
}

func genDir(r *rand.Rand, depth int, upper bool) []*gnode {
	var out []*gnode
	for _, name := range []string{"a", "b", "c"} {
		if r.IntN(3) == 0 {
			continue
		}
		kinds := "ffl"
		if depth < 3 {
			kinds += "dd"
		}
		if upper {
			kinds += "w"
		}
		n := &gnode{name: name, kind: kinds[r.IntN(len(kinds))], data: fmt.Sprint(r.IntN(100))}
		if n.kind == 'd' {
			n.opaque = upper && r.IntN(4) == 0
			n.kids = genDir(r, depth+1, upper)
		}
		out = append(out, n)
	}
	return out
}

// emit is the tar entries of a generated layer's nodes under prefix.
func emit(nodes []*gnode, prefix string) []lent {
	var out []lent
	for _, n := range nodes {
		p := path.Join(prefix, n.name)
		switch n.kind {
		case 'd':
			out = append(out, le(p+"/", tar.TypeDir, ""))
			if n.opaque {
				out = append(out, le(p+"/"+whOpaque, tar.TypeReg, ""))
			}
			out = append(out, emit(n.kids, p)...)
		case 'f':
			out = append(out, le(p, tar.TypeReg, n.data))
		case 'l':
			out = append(out, lnk(p, tar.TypeSymlink, "/t"+n.data))
		case 'w':
			out = append(out, le(path.Join(prefix, whPrefix+n.name), tar.TypeReg, ""))
		}
	}
	return out
}

// model applies a generated layer to a reference tree, by the image
// spec's words rather than by overlayfs's form.
func model(m map[string]string, nodes []*gnode, prefix string) {
	del := func(p string) {
		for k := range m {
			if k == p || strings.HasPrefix(k, p+"/") {
				delete(m, k)
			}
		}
	}
	for _, n := range nodes {
		p := path.Join(prefix, n.name)
		switch n.kind {
		case 'w':
			del(p)
		case 'f':
			del(p)
			m[p] = "file:" + n.data
		case 'l':
			del(p)
			m[p] = "link:/t" + n.data
		case 'd':
			if m[p] != "dir" || n.opaque {
				del(p)
			}
			m[p] = "dir"
			model(m, n.kids, p)
		}
	}
}

// TestFlattenMatchesModel: Flatten of generated layers is what applying
// them one after the other by the spec's rules gives.
func TestFlattenMatchesModel(t *testing.T) {
	needRoot(t)
	for seed := range uint64(60) {
		r := rand.New(rand.NewPCG(seed, 32))
		want := map[string]string{}
		var layers []string
		for i := range 3 {
			nodes := genDir(r, 0, i > 0)
			ents := emit(nodes, "")
			if i > 0 && r.IntN(8) == 0 {
				ents = append(ents, le(whOpaque, tar.TypeReg, ""))
				clear(want)
			}
			model(want, nodes, "")
			layers = append(layers, unpack(t, "", ents...))
		}
		dst := t.TempDir()
		if err := Flatten(layers, dst); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if got := shape(t, dst); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("seed %d:\n got %v\nwant %v", seed, got, want)
		}
		noOverlayState(t, dst)
	}
}
