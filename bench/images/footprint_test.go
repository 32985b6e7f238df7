package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestFootprint: only what was absent when the footprint was taken and
// exists afterwards is removed; what was there before stays, with what
// was added inside it.
func TestFootprint(t *testing.T) {
	dir := t.TempDir()
	before := filepath.Join(dir, "before")
	os.MkdirAll(before, 0o755)
	made, never := filepath.Join(dir, "made"), filepath.Join(dir, "never")
	f := takeFootprint([]string{before, made, never})
	if !slices.Equal(f.absent, []string{made, never}) {
		t.Fatalf("absent %v", f.absent)
	}
	os.MkdirAll(filepath.Join(made, "cache"), 0o755)
	os.WriteFile(filepath.Join(made, "cache", "db"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(before, "added"), []byte("x"), 0o644)
	removed, failed := f.clean()
	if !slices.Equal(removed, []string{made}) || len(failed) != 0 {
		t.Errorf("removed %v, failed %v; want [%s]", removed, failed, made)
	}
	if _, err := os.Stat(made); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", made, err)
	}
	if _, err := os.Stat(filepath.Join(before, "added")); err != nil {
		t.Errorf("what was there before was touched: %v", err)
	}
}

// TestRmdirTree: a tree of directories goes, deepest first; one that
// holds a file stays, and says so (a cgroup with a process in it).
func TestRmdirTree(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "cg")
	os.MkdirAll(filepath.Join(empty, "a", "b"), 0o755)
	os.MkdirAll(filepath.Join(empty, "c"), 0o755)
	if err := rmdirTree(empty); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Errorf("%s is still there", empty)
	}
	busy := filepath.Join(dir, "busy")
	os.MkdirAll(filepath.Join(busy, "a"), 0o755)
	os.WriteFile(filepath.Join(busy, "a", "tasks"), []byte("1"), 0o644)
	if err := rmdirTree(busy); err == nil {
		t.Error("a tree holding a file was removed without an error")
	}
	if _, err := os.Stat(filepath.Join(busy, "a", "tasks")); err != nil {
		t.Errorf("rmdirTree removed a file: %v", err)
	}
}

// TestToolPaths: the cgroup paths are under /sys/fs/cgroup and named
// libpod_parent; nothing else of the machine is on the list.
func TestToolPaths(t *testing.T) {
	for _, p := range toolPaths() {
		if filepath.Dir(p) == "/run" || filepath.Dir(p) == "/var/lib" {
			continue
		}
		if filepath.Base(p) != "libpod_parent" || !filepath.HasPrefix(p, "/sys/fs/cgroup/") {
			t.Errorf("unexpected path %s", p)
		}
	}
}
