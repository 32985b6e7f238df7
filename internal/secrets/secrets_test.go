package secrets

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/internal/errdefs"
)

func TestBoxSealsAndBinds(t *testing.T) {
	path := filepath.Join(t.TempDir(), KeyFile)
	b, err := OpenBox(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	plain := []byte("tok-3f1e9c")
	sealed := b.Seal(plain, "team-a/api")
	if bytes.Contains(sealed, plain) {
		t.Fatal("the sealed value holds the plain one")
	}
	if got, err := b.Open(sealed, "team-a/api"); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open: %q, %v", got, err)
	}
	if _, err := b.Open(sealed, "team-b/api"); !errors.Is(err, ErrSealed) {
		t.Errorf("opened under another team's name: %v", err)
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := b.Open(sealed, "team-a/api"); !errors.Is(err, ErrSealed) {
		t.Errorf("opened an altered value: %v", err)
	}
	// The same file opens the same key again; another file does not.
	again, err := OpenBox(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Open(b.Seal(plain, "x"), "x"); err != nil || !bytes.Equal(got, plain) {
		t.Errorf("reopened key: %q, %v", got, err)
	}
	other, _ := OpenBox(filepath.Join(t.TempDir(), KeyFile))
	if _, err := other.Open(b.Seal(plain, "x"), "x"); !errors.Is(err, ErrSealed) {
		t.Errorf("another key opened it: %v", err)
	}
	if _, err := b.Open([]byte("short"), "x"); !errors.Is(err, ErrSealed) {
		t.Errorf("a short value: %v", err)
	}
}

func TestMarkers(t *testing.T) {
	a, b := NewMarker(), NewMarker()
	if a == b || !strings.HasPrefix(a, MarkerPrefix) || len(a) != len(MarkerPrefix)+32 {
		t.Errorf("markers %q, %q", a, b)
	}
}

func TestChecks(t *testing.T) {
	for _, n := range []string{"", "a b", "x/y", strings.Repeat("a", 65), "é"} {
		if err := CheckName(n); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("name %q: %v", n, err)
		}
	}
	if err := CheckName("OPENAI_key-1.prod"); err != nil {
		t.Error(err)
	}
	for _, v := range []string{"", "a\nb", "a\rb", "a\x00b", strings.Repeat("a", MaxValueBytes+1)} {
		if err := CheckValue([]byte(v)); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("value %q: %v", v, err)
		}
	}
	for _, h := range [][]string{nil, {"localhost"}, {"1.2.3.4"}, {"https://a.b"}, {"a.b:443"}, {"*.*.b.c"}, {"a..b"}, {"-a.b"}, {"::1"}} {
		if _, err := CheckHosts(h); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("hosts %q: %v", h, err)
		}
	}
	got, err := CheckHosts([]string{"API.Example.com.", "*.github.com"})
	if err != nil || got[0] != "api.example.com" || got[1] != "*.github.com" {
		t.Errorf("hosts: %q, %v", got, err)
	}
	hosts := []string{"api.example.com", "*.github.com"}
	for host, want := range map[string]bool{
		"api.example.com": true, "API.example.com.": true, "x.api.example.com": false, "example.com": false,
		"api.github.com": true, "a.b.github.com": true, "github.com": false, "evilgithub.com": false, "github.com.evil": false,
	} {
		if HostMatches(hosts, host) != want {
			t.Errorf("HostMatches(%q) = %v", host, !want)
		}
	}
}
