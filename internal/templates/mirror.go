package templates

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"sandstorm/internal/errdefs"
)

// Mirror is image reference ref fully qualified (Docker Hub's short
// names expanded: "ubuntu:22.04" is index.docker.io/library/ubuntu:22.04)
// with its registry replaced by its mirror in s.Mirrors, if it has one
// ("docker.io" names Docker Hub). A registry reference only: a local
// image (oci:DIR, docker-archive:FILE) is refused, since who asks for a
// build through /e2b may not read the master's files.
func (s *Service) Mirror(ref string) (string, error) {
	if strings.HasPrefix(ref, "oci:") || strings.HasPrefix(ref, "docker-archive:") {
		return "", errdefs.New(errdefs.ErrBadInput, "image %q: a registry reference only (host/repo:tag or @sha256:…)", ref)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", errdefs.New(errdefs.ErrBadInput, "image %q: %v", ref, err)
	}
	reg := r.Context().RegistryStr()
	m, ok := s.Mirrors[reg]
	if !ok && reg == name.DefaultRegistry {
		m, ok = s.Mirrors["docker.io"]
	}
	if !ok {
		return r.Name(), nil
	}
	sep := ":"
	if _, digest := r.(name.Digest); digest {
		sep = "@"
	}
	return fmt.Sprintf("%s/%s%s%s", m, r.Context().RepositoryStr(), sep, r.Identifier()), nil
}
