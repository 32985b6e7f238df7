package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/internal/testenv"
)

// installed writes the repository's unit, @BINDIR@ pointing at a directory
// with an executable sandstormd and runsc, into dir.
func installed(t *testing.T, dir string) string {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", "sandstormd.service"))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, f := range []string{"sandstormd", "runsc"} {
		if err := os.WriteFile(filepath.Join(bin, f), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	unit := strings.ReplaceAll(string(b), "@BINDIR@", bin)
	if err := os.WriteFile(filepath.Join(dir, UnitName), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	return bin
}

func dropIn(t *testing.T, dir, name, body string) {
	t.Helper()
	d := filepath.Join(dir, UnitName+".d")
	os.MkdirAll(d, 0o755)
	if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestServiceCheckOfTheShippedUnit: the repository's unit passes, and
// systemd-analyze verify has nothing to say about it.
func TestServiceCheckOfTheShippedUnit(t *testing.T) {
	dir := t.TempDir()
	installed(t, dir)
	c := checkService(context.Background(), Config{UnitDirs: []string{dir}})
	if !c.OK || c.Absent || !strings.Contains(c.Detail, "KillMode=process and Delegate=yes") || !strings.Contains(c.Detail, "systemctl reload") {
		t.Fatalf("the shipped unit: %+v", c)
	}
}

// TestServiceCheckRefuses: a drop-in that brings back a KillMode that kills
// the sandboxes, or a mount namespace, fails the check with its fix.
func TestServiceCheckRefuses(t *testing.T) {
	for _, c := range []struct{ name, dropIn, detail, fix string }{
		{"default kill mode", "[Service]\nKillMode=\n", "control-group (the default)", "KillMode=process"},
		{"mixed", "[Service]\nKillMode=mixed\n", "KillMode=mixed: a stop or restart kills every sandbox", "KillMode=process"},
		{"none", "[Service]\nKillMode=none\n", "none is deprecated", "KillMode=process"},
		{"no delegation", "[Service]\nDelegate=no\n", "no Delegate=yes", "Delegate=yes"},
		{"private tmp", "[Service]\nPrivateTmp=yes\n", "PrivateTmp=yes: a mount or network namespace", "PrivateTmp="},
		{"protect system", "[Service]\nProtectSystem=full\n", "ProtectSystem=full", "ProtectSystem="},
		{"private network", "[Service]\nPrivateNetwork=true\n", "PrivateNetwork=true", "PrivateNetwork="},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			installed(t, dir)
			dropIn(t, dir, "50-test.conf", c.dropIn)
			got := checkService(context.Background(), Config{UnitDirs: []string{dir}})
			if got.OK || !strings.Contains(got.Detail, c.detail) || !strings.Contains(got.Fix, c.fix) || !strings.Contains(got.Detail, "50-test.conf") {
				t.Fatalf("check = %+v; want ✗ saying %q with a fix naming %q", got, c.detail, c.fix)
			}
		})
	}
}

// TestServiceCheckDropInOrder: drop-ins apply in name order, a later one
// winning, and one in a higher-precedence directory hides the same name
// in a lower one.
func TestServiceCheckDropInOrder(t *testing.T) {
	etc, lib := t.TempDir(), t.TempDir()
	installed(t, lib)
	dropIn(t, lib, "10-bad.conf", "[Service]\nKillMode=mixed\n")
	dropIn(t, lib, "20-good.conf", "[Service]\nKillMode=process\n")
	if c := checkService(context.Background(), Config{UnitDirs: []string{etc, lib}}); !c.OK {
		t.Fatalf("20-good.conf after 10-bad.conf: %+v", c)
	}
	dropIn(t, etc, "20-good.conf", "[Service]\nKillMode=control-group\n") // hides lib's
	if c := checkService(context.Background(), Config{UnitDirs: []string{etc, lib}}); c.OK || !strings.Contains(c.Detail, "KillMode=control-group") {
		t.Fatalf("/etc's 20-good.conf should hide the lower one: %+v", c)
	}
}

// TestServiceCheckInstall: a missing runsc beside sandstormd, a missing
// binary, no unit at all, a masked unit.
func TestServiceCheckInstall(t *testing.T) {
	dir := t.TempDir()
	bin := installed(t, dir)
	os.Remove(filepath.Join(bin, "runsc"))
	if c := checkService(context.Background(), Config{UnitDirs: []string{dir}}); c.OK || !strings.Contains(c.Detail, "no runsc beside") {
		t.Fatalf("no runsc: %+v", c)
	}
	os.Remove(filepath.Join(bin, "sandstormd"))
	if c := checkService(context.Background(), Config{UnitDirs: []string{dir}}); c.OK || !strings.Contains(c.Detail, "ExecStart's") || !strings.Contains(c.Fix, "make install") {
		t.Fatalf("no sandstormd: %+v", c)
	}
	empty := t.TempDir()
	if c := checkService(context.Background(), Config{UnitDirs: []string{empty}}); !c.OK || !c.Absent {
		t.Fatalf("no unit: %+v", c)
	}
	masked := t.TempDir()
	os.Symlink("/dev/null", filepath.Join(masked, UnitName))
	if c := checkService(context.Background(), Config{UnitDirs: []string{masked, dir}}); !c.Absent {
		t.Fatalf("a masked unit is not one installed: %+v", c)
	}
}
