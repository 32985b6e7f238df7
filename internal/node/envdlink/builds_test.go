package envdlink

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/store"
)

// TestEnvdBuilds: each envd build gets a directory of its own; a spec
// written with one build still finds it after an upgrade (so a restore
// mounts the binary its image was made with), a build no bundle mounts is
// removed when the node starts, and so is a data dir's old flat binary
// once nothing mounts it.
func TestEnvdBuilds(t *testing.T) {
	data := t.TempDir()
	bin := filepath.Join(t.TempDir(), "sandstorm-envd")
	install := func(content string) *Builds {
		t.Helper()
		if err := os.WriteFile(bin, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		var used []layout.Dir
		for _, pattern := range []string{"sandboxes", "warm"} {
			dirs, _ := filepath.Glob(filepath.Join(data, pattern, "*"))
			for _, d := range dirs {
				used = append(used, layout.Dir(d))
			}
		}
		b, err := Install(data, bin, used, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A data dir from before builds had directories: the flat binary.
	root := filepath.Join(data, "envd")
	os.MkdirAll(root, 0o755)
	os.WriteFile(filepath.Join(root, layout.EnvdBinary), []byte("v0"), 0o755)
	legacy := layout.Dir(filepath.Join(data, "sandboxes", "old"))
	tmpl := store.Template{Name: "t", Process: api.Process{Args: []string{"/bin/true"}}}
	if err := legacy.WriteSpec(tmpl, 0, "old", "/proc/1/ns/net", root); err != nil {
		t.Fatal(err)
	}

	n1 := install("v1")
	v1 := n1.Current()
	if b, err := os.ReadFile(filepath.Join(v1, layout.EnvdBinary)); err != nil || string(b) != "v1" {
		t.Fatalf("build 1 at %s: %q, %v", v1, b, err)
	}
	if n1.For(legacy) != root {
		t.Errorf("a sandbox that mounts the old flat binary restores with %s, want %s", n1.For(legacy), root)
	}
	sb := layout.Dir(filepath.Join(data, "sandboxes", "a"))
	if err := sb.WriteSpec(tmpl, 0, "a", "/proc/1/ns/net", v1); err != nil {
		t.Fatal(err)
	}
	n2 := install("v2")
	v2 := n2.Current()
	if v2 == v1 {
		t.Fatal("two builds share a directory")
	}
	if got := n2.For(sb); got != v1 {
		t.Errorf("after the upgrade, the sandbox's restore mounts %s, want its own build %s", got, v1)
	}
	if _, err := os.Stat(filepath.Join(v1, layout.EnvdBinary)); err != nil {
		t.Errorf("build 1 removed while a bundle mounts it: %v", err)
	}
	if got := n2.For(layout.Dir(t.TempDir())); got != v2 {
		t.Errorf("a layout with no spec restores with %s, want the current %s", got, v2)
	}

	// Nothing mounts build 1 or the flat binary any more: the next start
	// removes both, and keeps the current build.
	os.RemoveAll(string(sb))
	os.RemoveAll(string(legacy))
	n3 := install("v2")
	if _, err := os.Stat(v1); !os.IsNotExist(err) {
		t.Errorf("build 1 kept with nothing mounting it: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, layout.EnvdBinary)); !os.IsNotExist(err) {
		t.Errorf("the old flat binary kept with nothing mounting it: %v", err)
	}
	if n3.Current() != v2 {
		t.Errorf("current build %s, want %s", n3.Current(), v2)
	}
	if _, err := os.Stat(filepath.Join(v2, layout.EnvdBinary)); err != nil {
		t.Errorf("the current build removed: %v", err)
	}
}
