package secretbind

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
