package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSpecRuntime: every command for a container whose spec names a
// runsc build runs that build, not the backend's own (a sandbox started
// by an older build after an upgrade is driven by it for its whole life),
// and one whose spec names none runs the backend's.
func TestSpecRuntime(t *testing.T) {
	logDir := t.TempDir()
	script := func(name string) string {
		return `echo "$@" >> ` + filepath.Join(logDir, name) + `
for a; do v=$a; case $a in pause|resume|state|kill|exec|checkpoint|delete) break;; esac; done
case $v in state) echo '{"status":"paused"}';; esac
exit 0`
	}
	id := "fake9"
	own := fakeRunsc(t, script("own"))
	old := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(old, []byte("#!/bin/sh\n"+script("old")+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := fakeBackend(t, own, id, runscState{})
	ctx := context.Background()
	spec := fakeSpec(id)
	spec.Runtime = old
	if err := b.Pause(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(ctx, spec); err != nil || st != "paused" {
		t.Fatalf("state: %v %v", st, err)
	}
	if err := b.Signal(ctx, spec, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(ctx, spec, []string{"/bin/true"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Checkpoint(ctx, spec, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(ctx, spec); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		data, _ := os.ReadFile(filepath.Join(logDir, name))
		return string(data)
	}
	got := read("old")
	for _, verb := range []string{" pause ", " resume ", " state ", " kill ", " exec ", " checkpoint ", " delete "} {
		if !strings.Contains(got, verb) {
			t.Errorf("the old build did not run %q; it ran:\n%s", verb, got)
		}
	}
	if own := read("own"); own != "" {
		t.Errorf("the backend's own build ran commands for a container of another:\n%s", own)
	}
	if b.Runsc != own {
		t.Fatalf("the backend's own build changed to %s", b.Runsc)
	}
	spec.Runtime = ""
	if err := b.Pause(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(read("own"), " pause ") {
		t.Error("a spec naming no build did not run the backend's own")
	}
}
