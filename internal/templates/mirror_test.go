package templates

import (
	"errors"
	"testing"

	"sandstorm/internal/errdefs"
)

func TestMirror(t *testing.T) {
	s := &Service{Mirrors: map[string]string{"docker.io": "127.0.0.1:5000", "ghcr.io": "mirror.example"}}
	for ref, want := range map[string]string{
		"ubuntu:22.04":           "127.0.0.1:5000/library/ubuntu:22.04",
		"e2bdev/base":            "127.0.0.1:5000/e2bdev/base:latest",
		"docker.io/library/node": "127.0.0.1:5000/library/node:latest",
		"ghcr.io/a/b:1":          "mirror.example/a/b:1",
		"quay.io/a/b:1":          "quay.io/a/b:1",
		"ubuntu@sha256:" + hex64: "127.0.0.1:5000/library/ubuntu@sha256:" + hex64,
	} {
		if got, err := s.Mirror(ref); err != nil || got != want {
			t.Errorf("Mirror(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	if got, err := (&Service{}).Mirror("ubuntu"); err != nil || got != "index.docker.io/library/ubuntu:latest" {
		t.Errorf("no mirror: %q, %v", got, err)
	}
	for _, ref := range []string{"oci:/etc", "docker-archive:/etc/passwd", "UPPER/case", ""} {
		if _, err := s.Mirror(ref); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("Mirror(%q): %v, want ErrBadInput", ref, err)
		}
	}
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
