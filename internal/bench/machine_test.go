package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestParseRunscVersion(t *testing.T) {
	for out, want := range map[string]string{
		"runsc version gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237\nspec: 1.2.1\n": "gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237",
		"runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n":                                   "0.0~20221219.0",
		"": "",
	} {
		if got := parseRunscVersion(out); got != want {
			t.Errorf("parseRunscVersion(%q) = %q, want %q", out, got, want)
		}
	}
}

// TestDefaultRunsc: inside a repository with bin/runsc, that one is the
// default (and is what the machine records), whatever PATH has; without it,
// PATH's.
func TestDefaultRunsc(t *testing.T) {
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, "tools", "runsc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "tools", "runsc", "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(repo, "bench", "tiers")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	onPath, _ := exec.LookPath("runsc")
	if got := DefaultRunsc(); got != onPath {
		t.Errorf("no bin/runsc: DefaultRunsc = %q, want PATH's %q", got, onPath)
	}
	bin := filepath.Join(repo, "bin", "runsc")
	os.MkdirAll(filepath.Dir(bin), 0o755)
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'runsc version gvisor.dev/gvisor@vtest'\necho 'spec: 1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := DefaultRunsc(); got != bin {
		t.Errorf("DefaultRunsc = %q, want %q", got, bin)
	}
	m := CollectMachine(context.Background())
	if m.RunscPath != bin || m.Runsc != "gvisor.dev/gvisor@vtest" {
		t.Errorf("machine runsc %q (%s), want the repository's", m.Runsc, m.RunscPath)
	}
	m.UseRunsc(context.Background(), filepath.Join(repo, "missing"))
	if m.RunscPath != filepath.Join(repo, "missing") || len(m.Runsc) < 8 || m.Runsc[:8] != "unknown:" {
		t.Errorf("UseRunsc(missing): %q (%s)", m.Runsc, m.RunscPath)
	}
}
