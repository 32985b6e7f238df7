package dockerbuild

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"sandstorm/internal/testenv"

	"golang.org/x/sys/unix"
)

// TestLookupMergesLikeOverlayfs: a whiteout deletes, an opaque directory
// hides what is below it, a directory over a file hides the file.
func TestLookupMergesLikeOverlayfs(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "whiteouts (mknod) and trusted.* xattrs need root")
	}
	e := newEnv(t)
	layer := func(build func(dir string)) string {
		dir, err := e.store.TempDir()
		must(t, err)
		build(dir)
		id, err := e.store.Add(context.Background(), dir)
		must(t, err)
		return id
	}
	lower := layer(func(d string) {
		must(t, os.MkdirAll(filepath.Join(d, "a"), 0o755))
		must(t, os.MkdirAll(filepath.Join(d, "b"), 0o755))
		must(t, os.WriteFile(filepath.Join(d, "a/x"), nil, 0o644))
		must(t, os.WriteFile(filepath.Join(d, "a/kept"), nil, 0o644))
		must(t, os.WriteFile(filepath.Join(d, "b/y"), nil, 0o644))
		must(t, os.WriteFile(filepath.Join(d, "c"), nil, 0o644))
	})
	upper := layer(func(d string) {
		must(t, os.MkdirAll(filepath.Join(d, "a"), 0o700))
		must(t, unix.Mknod(filepath.Join(d, "a/x"), unix.S_IFCHR, 0))
		must(t, os.MkdirAll(filepath.Join(d, "b"), 0o755))
		must(t, unix.Setxattr(filepath.Join(d, "b"), "trusted.overlay.opaque", []byte("y"), 0))
		must(t, os.MkdirAll(filepath.Join(d, "c/sub"), 0o755))
	})
	b := &builder{opts: BuildOptions{Store: e.store}}
	img := Image{Layers: []string{lower, upper}}
	for _, c := range []struct {
		p     string
		found bool
		mode  os.FileMode
	}{
		{"/a/x", false, 0},
		{"/a/kept", true, 0o644},
		{"/a", true, os.ModeDir | 0o700},
		{"/b/y", false, 0},
		{"/b", true, os.ModeDir | 0o755},
		{"/c/sub", true, os.ModeDir | 0o755},
		{"/nothing/here", false, 0},
	} {
		info, err := b.lookup(img, c.p)
		if err != nil {
			t.Fatalf("%s: %v", c.p, err)
		}
		if (info != nil) != c.found || (info != nil && info.mode != c.mode) {
			t.Errorf("%s: %+v, want found %v mode %v", c.p, info, c.found, c.mode)
		}
	}
	// Below a file there is nothing; below a link, a refusal.
	if info, err := b.lookup(Image{Layers: []string{lower}}, "/c/sub"); info != nil || err == nil {
		t.Errorf("/c/sub under a file: %+v, %v", info, err)
	}
}
