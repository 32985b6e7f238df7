package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ent describes one tar entry for the test builder.
type ent struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	uid, gid int
	size     int64 // overrides len(body) in the header when > 0 (no data written)
}

var mtime = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

func mkTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{
			Name:     e.name,
			Typeflag: e.typ,
			Linkname: e.link,
			Mode:     e.mode,
			Uid:      e.uid,
			Gid:      e.gid,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if e.typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("WriteHeader %s: %v", e.name, err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// listTree returns every path under dir (relative), sorted by WalkDir.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	if got := listTree(t, dir); len(got) != 0 {
		t.Fatalf("destination not empty after failed extraction: %v", got)
	}
}

func TestRoundTrip(t *testing.T) {
	data := mkTar(t,
		ent{name: "./", typ: tar.TypeDir},
		ent{name: "usr/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "usr/bin/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "usr/bin/python3.11", typ: tar.TypeReg, body: "#!ELF", mode: 0o755, uid: 1000, gid: 1001},
		ent{name: "usr/bin/python3", typ: tar.TypeSymlink, link: "python3.11"},
		ent{name: "usr/bin/su", typ: tar.TypeReg, body: "su", mode: 0o4755},
		ent{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		ent{name: "etc/alternatives/py", typ: tar.TypeSymlink, link: "/usr/bin/python3.11"},
		ent{name: "usr/bin/python-hard", typ: tar.TypeLink, link: "usr/bin/python3.11"},
		ent{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		ent{name: "ro/inside", typ: tar.TypeReg, body: "x", mode: 0o600},
		ent{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
	)
	dir := t.TempDir()
	st, err := Extract(bytes.NewReader(data), dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// usr, usr/bin, python3.11, python3, su, bin, etc (implicit),
	// etc/alternatives (implicit), py, python-hard, ro, ro/inside, tmp.
	if st.Files != 13 || st.Bytes != int64(len("#!ELF")+len("su")+len("x")) {
		t.Errorf("stats = %+v", st)
	}

	checkMode := func(rel string, want fs.FileMode) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", rel, fi.Mode(), want)
		}
	}
	checkMode("usr/bin", fs.ModeDir|0o755)
	checkMode("usr/bin/python3.11", 0o755)
	checkMode("usr/bin/su", fs.ModeSetuid|0o755)
	checkMode("ro", fs.ModeDir|0o555)
	checkMode("ro/inside", 0o600)
	checkMode("tmp", fs.ModeDir|fs.ModeSticky|0o777)
	checkMode("etc/alternatives", fs.ModeDir|0o755)

	for link, want := range map[string]string{
		"usr/bin/python3":     "python3.11",
		"bin":                 "usr/bin",
		"etc/alternatives/py": "/usr/bin/python3.11",
	} {
		got, err := os.Readlink(filepath.Join(dir, link))
		if err != nil || got != want {
			t.Errorf("readlink %s = %q, %v; want %q", link, got, err, want)
		}
	}

	b, err := os.ReadFile(filepath.Join(dir, "usr/bin/python3.11"))
	if err != nil || string(b) != "#!ELF" {
		t.Errorf("python3.11 content = %q, %v", b, err)
	}
	a, _ := os.Stat(filepath.Join(dir, "usr/bin/python3.11"))
	h, _ := os.Stat(filepath.Join(dir, "usr/bin/python-hard"))
	if !os.SameFile(a, h) {
		t.Error("hard link does not share the inode of its target")
	}
	if sys := a.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && (sys.Uid != 1000 || sys.Gid != 1001) {
		t.Errorf("owner = %d:%d, want 1000:1001", sys.Uid, sys.Gid)
	}
	if !a.ModTime().Equal(mtime) {
		t.Errorf("mtime = %v, want %v", a.ModTime(), mtime)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "usr")); !fi.ModTime().Equal(mtime) {
		t.Errorf("dir mtime = %v, want %v", fi.ModTime(), mtime)
	}
}

func TestGzip(t *testing.T) {
	data := gz(t, mkTar(t, ent{name: "hello.txt", typ: tar.TypeReg, body: "hi\n"}))
	dir := t.TempDir()
	st, err := Extract(bytes.NewReader(data), dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 1 || st.Bytes != 3 {
		t.Errorf("stats = %+v", st)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "hello.txt")); string(b) != "hi\n" {
		t.Errorf("content = %q", b)
	}
}

func TestRejections(t *testing.T) {
	outside := t.TempDir() // a host directory a malicious tar must not reach
	good := ent{name: "ok/file", typ: tar.TypeReg, body: "ok"}
	cases := []struct {
		name  string
		ents  []ent
		want  error
		entry string // must appear in the error text
	}{
		{"dotdot", []ent{good, {name: "../x", typ: tar.TypeReg, body: "x"}}, ErrUnsafe, "../x"},
		{"absolute", []ent{good, {name: "/etc/x", typ: tar.TypeReg, body: "x"}}, ErrUnsafe, "/etc/x"},
		{"inner dotdot", []ent{good, {name: "a/../../x", typ: tar.TypeReg, body: "x"}}, ErrUnsafe, "a/../../x"},
		{"dotdot dir", []ent{good, {name: "a/../", typ: tar.TypeDir}}, ErrUnsafe, "a/../"},
		{"relative symlink escape", []ent{good, {name: "a/b", typ: tar.TypeSymlink, link: "../../etc"}}, ErrUnsafe, "a/b"},
		{"symlink write-through (absolute)", []ent{
			good,
			{name: "a", typ: tar.TypeSymlink, link: outside},
			{name: "a/passwd", typ: tar.TypeReg, body: "pwned"},
		}, ErrUnsafe, "a/passwd"},
		{"symlink write-through (/etc)", []ent{
			{name: "a", typ: tar.TypeSymlink, link: "/etc"},
			{name: "a/passwd", typ: tar.TypeReg, body: "pwned"},
		}, ErrUnsafe, "a/passwd"},
		{"symlink write-through (inside)", []ent{
			{name: "d/", typ: tar.TypeDir},
			{name: "a", typ: tar.TypeSymlink, link: "d"},
			{name: "a/x", typ: tar.TypeReg, body: "x"},
		}, ErrUnsafe, "a/x"},
		{"symlink mkdir-through", []ent{
			{name: "a", typ: tar.TypeSymlink, link: outside},
			{name: "a/sub/", typ: tar.TypeDir},
		}, ErrUnsafe, "a/sub/"},
		{"dir over symlink", []ent{
			{name: "a", typ: tar.TypeSymlink, link: outside},
			{name: "a/", typ: tar.TypeDir},
		}, ErrUnsafe, "a/"},
		{"hardlink through symlink dir", []ent{
			{name: "a", typ: tar.TypeSymlink, link: outside},
			{name: "f", typ: tar.TypeReg, body: "x"},
			{name: "a/f", typ: tar.TypeLink, link: "f"},
		}, ErrUnsafe, "a/f"},
		{"hardlink absolute", []ent{good, {name: "h", typ: tar.TypeLink, link: "/etc/passwd"}}, ErrUnsafe, `"h"`},
		{"hardlink dotdot", []ent{good, {name: "h", typ: tar.TypeLink, link: "../outside"}}, ErrUnsafe, `"h"`},
		{"hardlink not extracted", []ent{good, {name: "h", typ: tar.TypeLink, link: "ok/missing"}}, ErrUnsafe, `"h"`},
		{"hardlink to later entry", []ent{
			{name: "h", typ: tar.TypeLink, link: "later"},
			{name: "later", typ: tar.TypeReg, body: "x"},
		}, ErrUnsafe, `"h"`},
		{"char device", []ent{good, {name: "dev/null", typ: tar.TypeChar}}, ErrUnsafe, "dev/null"},
		{"block device", []ent{good, {name: "dev/sda", typ: tar.TypeBlock}}, ErrUnsafe, "dev/sda"},
		{"fifo", []ent{good, {name: "p", typ: tar.TypeFifo}}, ErrUnsafe, `"p"`},
		{"too many files", []ent{
			{name: "1", typ: tar.TypeReg, body: "x"},
			{name: "2", typ: tar.TypeReg, body: "x"},
			{name: "3", typ: tar.TypeReg, body: "x"},
			{name: "4", typ: tar.TypeReg, body: "x"},
		}, ErrTooLarge, `"4"`},
		{"too many implicit dirs", []ent{
			{name: "a/b/c/d/e", typ: tar.TypeReg, body: "x"},
		}, ErrTooLarge, "a/b/c/d/e"},
		{"too many bytes", []ent{
			{name: "small", typ: tar.TypeReg, body: "0123456789"},
			{name: "big", typ: tar.TypeReg, body: strings.Repeat("y", 91)},
		}, ErrTooLarge, "big"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := Extract(bytes.NewReader(mkTar(t, tc.ents...)), dir, Limits{MaxBytes: 100, MaxFiles: 3})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.entry) {
				t.Errorf("error %q does not name entry %s", err, tc.entry)
			}
			assertEmpty(t, dir)
			if got := listTree(t, outside); len(got) != 0 {
				t.Fatalf("wrote outside the destination: %v", got)
			}
		})
	}
}

// A later regular file replacing an earlier symlink must replace the link,
// not write through it.
func TestReplaceSymlinkDoesNotWriteThrough(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := mkTar(t,
		ent{name: "a", typ: tar.TypeSymlink, link: victim},
		ent{name: "a", typ: tar.TypeReg, body: "new"},
	)
	if _, err := Extract(bytes.NewReader(data), dir, Limits{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "original" {
		t.Fatalf("victim overwritten: %q", b)
	}
	fi, err := os.Lstat(filepath.Join(dir, "a"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("a is %v, %v; want regular file", fi.Mode(), err)
	}
}

func TestDestinationChecks(t *testing.T) {
	data := mkTar(t, ent{name: "f", typ: tar.TypeReg, body: "x"})
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Extract(bytes.NewReader(data), dir, Limits{}); err == nil {
		t.Fatal("extracting into a non-empty dir succeeded")
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("pre-existing file removed: %v", err)
	}
	if _, err := Extract(bytes.NewReader(data), filepath.Join(dir, "missing"), Limits{}); err == nil {
		t.Fatal("extracting into a missing dir succeeded")
	}
}

func TestCorruptStreamCleansUp(t *testing.T) {
	data := mkTar(t,
		ent{name: "a/b/c", typ: tar.TypeReg, body: strings.Repeat("z", 2000)},
		ent{name: "d", typ: tar.TypeReg, body: strings.Repeat("z", 2000)},
	)
	dir := t.TempDir()
	// Truncate inside the second file's data.
	if _, err := Extract(bytes.NewReader(data[:3500]), dir, Limits{}); err == nil {
		t.Fatal("truncated tar extracted without error")
	}
	assertEmpty(t, dir)
	// Corrupt gzip.
	if _, err := Extract(bytes.NewReader([]byte{0x1f, 0x8b, 0, 1, 2}), dir, Limits{}); err == nil {
		t.Fatal("corrupt gzip extracted without error")
	}
	assertEmpty(t, dir)
}
