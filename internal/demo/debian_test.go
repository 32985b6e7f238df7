package demo

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/testenv"
)

func TestMmdebstrapArgs(t *testing.T) {
	args := mmdebstrapArgs("/data/demo/base", *demos["base"].debian, "/c")
	for _, want := range []string{
		"--mode=unshare", "--variant=minbase", "--format=directory",
		"--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
		"--include=" + strings.Join(basePackages, ","),
		"--setup-hook=sync-in /c/archives /var/cache/apt/archives/",
		"--customize-hook=sync-out /var/cache/apt/archives /c/archives",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("no %q in %q", want, args)
		}
	}
	// The user is made before the cache is written back, and the
	// positional arguments come last: suite, target, then the sources.
	user := slices.IndexFunc(args, func(a string) bool { return strings.Contains(a, "useradd") })
	out := slices.Index(args, "--customize-hook=sync-out /var/cache/apt/archives /c/archives")
	if user < 0 || user > out {
		t.Errorf("useradd hook at %d, sync-out at %d", user, out)
	}
	tail := args[len(args)-len(sources)-2:]
	if tail[0] != Suite || tail[1] != "/data/demo/base" || !slices.Equal(tail[2:], sources) {
		t.Errorf("positional arguments = %q", tail)
	}
	if web := mmdebstrapArgs("/w", *demos["web"].debian, "/c"); slices.ContainsFunc(web, func(a string) bool { return strings.Contains(a, "useradd") }) {
		t.Errorf("web makes a user: %q", web)
	}
}

// TestCleanupRefusesMounts: a failed build's cleanup removes nothing
// while something is mounted under the rootfs, since removing would
// delete through the mount.
func TestCleanupRefusesMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	mnt := filepath.Join(dir, "proc")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	canary := filepath.Join(mnt, "canary")
	if err := os.WriteFile(canary, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := cleanup(dir, true)
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), mnt) {
		t.Errorf("cleanup with %s mounted: %v", mnt, err)
	}
	if _, err := os.Stat(canary); err != nil {
		t.Errorf("cleanup deleted through the mount: %v", err)
	}
	if err := syscall.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if err := cleanup(dir, true); err != nil {
		t.Errorf("cleanup with nothing mounted: %v", err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cleanup left %s: %v", dir, err)
	}
}

func TestTail(t *testing.T) {
	var b tail
	b.Write([]byte(strings.Repeat("x", tailMax)))
	b.Write([]byte("\nE: the end\n"))
	if s := b.String(); len(s) > tailMax || !strings.HasSuffix(s, "\nE: the end") {
		t.Errorf("tail = %d bytes ending %q", len(s), s[max(0, len(s)-20):])
	}
}
