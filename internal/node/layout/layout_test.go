package layout

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sandstorm/api"
	"sandstorm/internal/mountinfo"
	"sandstorm/internal/store"
)

// TestPrepareBundle checks the exported layout internal/bench/raw runs raw
// runsc on: the node's overlay over the template (writes land in upper/,
// never in the template) and the node's spec, and that ReleaseBundle
// unmounts it.
func TestPrepareBundle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test must run as root: it mounts an overlay")
	}
	base := t.TempDir()
	lower := filepath.Join(base, "template")
	if err := os.MkdirAll(filepath.Join(lower, "srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "srv", "app.py"), []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "sb")
	tmpl := store.Template{Name: "web", Rootfs: lower, Process: api.Process{Args: []string{"/usr/bin/python3", "/srv/app.py"}, Env: []string{"A=1"}}}
	bundle, err := PrepareBundle(dir, tmpl, 256, "raw-1", "/var/run/netns/x", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ReleaseBundle(dir) })
	if bundle != filepath.Join(dir, "bundle") {
		t.Errorf("bundle = %s", bundle)
	}
	if _, err := os.Stat(filepath.Join(bundle, "rootfs", "srv", "app.py")); err != nil {
		t.Errorf("the template is not visible through the overlay: %v", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "written"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "upper", "written")); err != nil {
		t.Errorf("a write through the rootfs did not land in upper/: %v", err)
	}
	if _, err := os.Stat(filepath.Join(lower, "written")); err == nil {
		t.Error("a write through the rootfs reached the template")
	}

	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	if s.Hostname != "raw-1" || s.Root.Path != "rootfs" || !slices.Equal(s.Process.Args, tmpl.Process.Args) {
		t.Errorf("spec: hostname %q, root %q, args %v", s.Hostname, s.Root.Path, s.Process.Args)
	}
	if !slices.Contains(s.Process.Env, "A=1") || !slices.ContainsFunc(s.Process.Env, func(e string) bool { return len(e) > 5 && e[:5] == "PATH=" }) {
		t.Errorf("env %v: want the template's and a PATH", s.Process.Env)
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj != SandboxOOMScoreAdj {
		t.Errorf("oomScoreAdj = %v, want %d", s.Process.OOMScoreAdj, SandboxOOMScoreAdj)
	}
	if s.Linux.Resources == nil || s.Linux.Resources.Memory == nil || *s.Linux.Resources.Memory.Limit != 256<<20 {
		t.Errorf("memory limit: %+v", s.Linux.Resources)
	}
	if i := slices.IndexFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.NetworkNamespace }); i < 0 || s.Linux.Namespaces[i].Path != "/var/run/netns/x" {
		t.Errorf("network namespace: %+v", s.Linux.Namespaces)
	}

	if err := ReleaseBundle(dir); err != nil {
		t.Fatal(err)
	}
	if mountinfo.Is(filepath.Join(bundle, "rootfs")) {
		t.Error("rootfs still mounted after ReleaseBundle")
	}
	if err := ReleaseBundle(dir); err != nil {
		t.Errorf("ReleaseBundle of an unmounted bundle: %v", err)
	}
}
