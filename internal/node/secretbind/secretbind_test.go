package secretbind

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/secrets"
)

// TestInstallAndLoad: the CA goes into the volume's trust store after the
// template's bundle, the bindings are sealed (no value in clear on disk)
// and open again only for the same sandbox with the same key; a bundle
// the template links out of its rootfs is not followed.
func TestInstallAndLoad(t *testing.T) {
	dir, lower := t.TempDir(), t.TempDir()
	upper := filepath.Join(dir, "upper")
	os.MkdirAll(filepath.Join(lower, "etc/ssl/certs"), 0o755)
	os.WriteFile(filepath.Join(lower, Bundle), []byte("TEMPLATE ROOTS"), 0o644)
	box, _ := secrets.OpenBox(filepath.Join(t.TempDir(), secrets.KeyFile))
	b := []inject.Binding{{Name: "api", Marker: secrets.NewMarker(), Value: "v-4242-secret", Hosts: []string{"api.test"}}}
	if err := Install(dir, lower, upper, "sb1", box, b); err != nil {
		t.Fatal(err)
	}
	bundle, err := os.ReadFile(filepath.Join(upper, Bundle))
	if err != nil || !bytes.HasPrefix(bundle, []byte("TEMPLATE ROOTS\n-----BEGIN CERTIFICATE-----")) {
		t.Errorf("the bundle: %.60q, %v", bundle, err)
	}
	if ca, err := os.ReadFile(filepath.Join(upper, CAFile)); err != nil || !bytes.Contains(bundle, ca) {
		t.Errorf("the CA file: %v", err)
	}
	sealedFile := filepath.Join(dir, File)
	raw, _ := os.ReadFile(sealedFile)
	if fi, _ := os.Stat(sealedFile); fi.Mode().Perm() != 0o600 || bytes.Contains(raw, []byte("v-4242-secret")) || bytes.Contains(raw, []byte("PRIVATE KEY")) {
		t.Errorf("the sealed file: mode %v, or it holds the value or the CA key in clear", fi.Mode())
	}
	set, err := Load(dir, "sb1", box, nil)
	if err != nil || len(set.For("api.test")) != 1 {
		t.Fatalf("load: %v", err)
	}
	if _, err := Load(dir, "sb2", box, nil); !errors.Is(err, secrets.ErrSealed) {
		t.Errorf("another sandbox's ID opened it: %v", err)
	}
	if set, err := Load(t.TempDir(), "sb1", box, nil); set != nil || err != nil {
		t.Errorf("no bindings: %v, %v", set, err)
	}

	// A template whose bundle is a link to the host's files.
	hostile, upper2 := t.TempDir(), filepath.Join(t.TempDir(), "upper")
	os.MkdirAll(filepath.Join(hostile, "etc/ssl"), 0o755)
	secretHost := filepath.Join(t.TempDir(), "ca-certificates.crt") // what the link would reach
	os.WriteFile(secretHost, []byte("HOST ONLY"), 0o600)
	os.Symlink(filepath.Dir(secretHost), filepath.Join(hostile, "etc/ssl/certs"))
	if err := Install(t.TempDir(), hostile, upper2, "sb3", box, b); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(upper2, Bundle))
	if strings.Contains(string(got), "HOST ONLY") || !strings.HasPrefix(string(got), "-----BEGIN CERTIFICATE-----") {
		t.Errorf("a linked bundle was followed: %.40q", got)
	}
}

// TestMove: a live move carries a sandbox's bindings opened (Export) and
// the node it goes to seals them under its own key (Import): they open
// there, with the same CA (the one its volume trusts), and not with the
// first node's key; a node with no secrets key refuses them.
func TestMove(t *testing.T) {
	from, _ := secrets.OpenBox(filepath.Join(t.TempDir(), secrets.KeyFile))
	to, _ := secrets.OpenBox(filepath.Join(t.TempDir(), secrets.KeyFile))
	src, dst := t.TempDir(), t.TempDir()
	b := []inject.Binding{{Name: "k", Marker: secrets.NewMarker(), Value: "v", Hosts: []string{"api.test"}}}
	if err := Install(src, t.TempDir(), filepath.Join(t.TempDir(), "upper"), "sb1", from, b); err != nil {
		t.Fatal(err)
	}
	plain, err := Export(src, "sb1", from)
	if err != nil || plain == nil {
		t.Fatalf("Export: %v", err)
	}
	if err := Import(dst, "sb1", to, plain); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(dst, "sb1", to, nil); err != nil || len(c.For("api.test")) != 1 {
		t.Fatalf("Load where it arrived: %v", err)
	}
	// The same CA (the one its volume trusts) and the same bindings.
	if again, err := Export(dst, "sb1", to); err != nil || !bytes.Equal(again, plain) {
		t.Errorf("what arrived differs from what left: %v", err)
	}
	if _, err := Load(dst, "sb1", from, nil); !errors.Is(err, secrets.ErrSealed) {
		t.Errorf("the first node's key opened the moved bindings: %v", err)
	}
	if err := Import(t.TempDir(), "sb1", nil, plain); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("a node with no secrets key: %v", err)
	}
	if err := Import(t.TempDir(), "sb1", to, []byte(`{"bindings":[]}`)); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("malformed: %v", err)
	}
	if plain, err := Export(t.TempDir(), "sb2", from); plain != nil || err != nil {
		t.Errorf("a sandbox with none: %q %v", plain, err)
	}
}
