package rootfs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// tree makes a small rootfs: nested files with odd modes and times, a
// symlink, a hard link, an empty directory and a fifo (left out by Pack).
func tree(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(d, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(d, "empty"), 0o700))
	must(os.WriteFile(filepath.Join(d, "usr/bin/app"), []byte("#!/bin/sh\necho hi\n"), 0o4755))
	must(os.WriteFile(filepath.Join(d, "etc"), []byte("x"), 0o600))
	must(os.Chmod(filepath.Join(d, "usr/bin/app"), os.ModeSetuid|0o755))
	must(os.Symlink("/usr/bin/app", filepath.Join(d, "app-link")))
	must(os.Link(filepath.Join(d, "usr/bin/app"), filepath.Join(d, "usr/bin/app2")))
	must(syscall.Mkfifo(filepath.Join(d, "fifo"), 0o644))
	old := time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)
	must(os.Chtimes(filepath.Join(d, "etc"), old, old))
	return d
}

func TestDigestIsStableAndSurvivesTheTrip(t *testing.T) {
	src := tree(t)
	d1, err := Digest(src)
	if err != nil {
		t.Fatal(err)
	}
	if d2, _ := Digest(src); d1 != d2 || !ValidDigest(d1) {
		t.Fatalf("digest of one tree twice: %s, %s", d1, d2)
	}
	// What a node receives and extracts has the digest it was sent as:
	// Pack writes only what Extract restores.
	var buf bytes.Buffer
	if err := Pack(src, &buf); err != nil {
		t.Fatal(err)
	}
	c := Cache{Dir: t.TempDir()}
	p, err := c.Put(d1, &buf, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Digest(p); err != nil || got != d1 {
		t.Fatalf("extracted tree's digest %s (%v), sent %s", got, err, d1)
	}
	if _, err := os.Lstat(filepath.Join(p, "fifo")); !os.IsNotExist(err) {
		t.Fatalf("a fifo was packed: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(p, "usr/bin/app")); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("mode not kept: %v %v", fi, err)
	}
	// A change anywhere changes the digest.
	os.WriteFile(filepath.Join(src, "usr/bin/app"), []byte("#!/bin/sh\necho HI\n"), 0o4755)
	if d3, _ := Digest(src); d3 == d1 {
		t.Fatal("a changed file kept the digest")
	}
}

func TestCachePutRefusesWhatIsNotItsDigest(t *testing.T) {
	src := tree(t)
	d, _ := Digest(src)
	other := tree(t)
	os.WriteFile(filepath.Join(other, "etc"), []byte("tampered"), 0o600)
	var buf bytes.Buffer
	Pack(other, &buf)
	c := Cache{Dir: t.TempDir()}
	if _, err := c.Put(d, &buf, Limits{}); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("a tree sent under another's digest: %v", err)
	}
	if _, ok := c.Path(d); ok {
		t.Fatal("a mismatched tree was kept")
	}
	if es, _ := os.ReadDir(c.Dir); len(es) != 0 {
		t.Fatalf("left behind: %v", es)
	}
	// Bytes after the tar's end are part of what the digest covers.
	var ok bytes.Buffer
	Pack(src, &ok)
	ok.WriteString("trailing")
	if _, err := c.Put(d, &ok, Limits{}); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("trailing bytes were not hashed: %v", err)
	}
}

func TestCacheRefusesNamesThatAreNotDigests(t *testing.T) {
	c := Cache{Dir: t.TempDir()}
	for _, d := range []string{"", "sha256:", "sha256:../../etc", "md5:" + strings.Repeat("a", 64),
		"sha256:" + strings.Repeat("A", 64), "sha256:" + strings.Repeat("a", 63), "sha256:" + strings.Repeat("a", 63) + "/"} {
		if _, err := c.Put(d, strings.NewReader(""), Limits{}); err == nil {
			t.Errorf("Put(%q) accepted", d)
		}
		if _, ok := c.Path(d); ok {
			t.Errorf("Path(%q) found", d)
		}
	}
}

func TestCachePutTwiceAtOnce(t *testing.T) {
	src := tree(t)
	d, _ := Digest(src)
	c := Cache{Dir: t.TempDir()}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(Pack(src, pw)) }()
			_, errs[i] = c.Put(d, pr, Limits{})
			pr.Close()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("put %d: %v", i, err)
		}
	}
	es, _ := os.ReadDir(c.Dir)
	if len(es) != 1 {
		t.Fatalf("cache holds %d entries, want the one tree: %v", len(es), es)
	}
	// A second Put of a cached digest does not read its stream.
	if _, err := c.Put(d, iotestErrReader{}, Limits{}); err != nil {
		t.Fatalf("cached digest read again: %v", err)
	}
	if err := c.Remove(d); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Path(d); ok {
		t.Fatal("removed digest still there")
	}
}

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, errors.New("read") }
