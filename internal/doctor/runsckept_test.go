package doctor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/internal/runtimes"
)

// TestRunscKept: the check names each kept build and why, fails on one
// whose bytes changed (without touching it), and is optional before the
// node first ran.
func TestRunscKept(t *testing.T) {
	ctx := context.Background()
	dd := t.TempDir()
	if c := checkRunscKept(ctx, Config{DataDir: dd}); !c.OK || !c.Absent {
		t.Fatalf("before the first start: %+v", c)
	}
	src := filepath.Join(t.TempDir(), "runsc")
	os.WriteFile(src, []byte("#!/bin/sh\necho 'runsc version v-doctor'\n"), 0o755)
	version := func(ctx context.Context, p string) (string, error) {
		out, err := exec.CommandContext(ctx, p, "--version").Output()
		return strings.TrimPrefix(strings.TrimSpace(string(out)), "runsc version "), err
	}
	set, err := runtimes.Open(ctx, filepath.Join(dd, "runsc-versions"), src, version, nil)
	if err != nil {
		t.Fatal(err)
	}
	keep, _, missing := runtimes.Plan(set.Keys(), set.Current().Key, nil)
	set.WriteReport(keep, missing)
	c := checkRunscKept(ctx, Config{DataDir: dd})
	if !c.OK || !strings.Contains(c.Detail, string(set.Current().Key)) || !strings.Contains(c.Detail, "current") {
		t.Fatalf("one current build: %+v", c)
	}
	f, _ := os.OpenFile(set.Current().Path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString("# changed\n")
	f.Close()
	c = checkRunscKept(ctx, Config{DataDir: dd})
	if c.OK || !strings.Contains(c.Detail, "changed after it was kept") || c.Fix == "" {
		t.Fatalf("a changed build: %+v", c)
	}
	if _, err := os.Stat(set.Current().Path); err != nil {
		t.Fatalf("doctor moved the build: %v", err)
	}
}
