// Package ociimage is where a template's image comes from (issue 32): a
// registry, an OCI image layout directory or a `docker save` tarball; the
// credentials to reach a registry; the one image of a node's platform in
// an index; its layers fetched, checked against both their digests and
// unpacked once each into a store keyed by diffID; and what its config
// says to run, resolved inside the unpacked tree without ever following a
// link out of it.
//
// Everything an image says is untrusted: sizes, counts and compression
// ratios are bounded before or while they are read, and a layer that fails
// any check leaves nothing in the store.
package ociimage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"sandstorm/internal/errdefs"
)

// Kind is where a Source's image is.
type Kind int

// The kinds of source.
const (
	// Registry: an image or index in a registry, by tag or digest.
	Registry Kind = iota + 1
	// Layout: an OCI image layout directory (oci-layout, index.json, blobs/).
	Layout
	// DockerArchive: a tarball written by `docker save`.
	DockerArchive
)

func (k Kind) String() string {
	switch k {
	case Registry:
		return "registry"
	case Layout:
		return "oci"
	case DockerArchive:
		return "docker-archive"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Source is an image's origin, as ParseSource read it.
type Source struct {
	Kind Kind
	// Ref is the registry reference (Kind Registry).
	Ref name.Reference
	// Path is the absolute path of the layout directory or the archive
	// (Kind Layout, DockerArchive).
	Path string
}

// String is the source in the form ParseSource reads back.
func (s Source) String() string {
	switch s.Kind {
	case Registry:
		if s.Ref == nil {
			return ""
		}
		return s.Ref.Name()
	case Layout:
		return "oci:" + s.Path
	case DockerArchive:
		return "docker-archive:" + s.Path
	}
	return ""
}

// The prefixes that name a source's kind outright.
const (
	prefixLayout  = "oci:"
	prefixArchive = "docker-archive:"
	prefixDocker  = "docker://"
)

// ParseSource reads where an image is:
//
//   - "oci:DIR": an OCI image layout directory;
//   - "docker-archive:FILE": a `docker save` tarball;
//   - a path that starts with "/", "./" or "../": a directory holding an
//     oci-layout file is a layout, a regular file a docker archive;
//   - any other string that exists on disk as such a directory or file is
//     taken the same way (an existing path wins over a registry name);
//   - else a registry reference, host[:port]/repo:tag or @sha256:…
//     (Docker Hub's short names, "ubuntu:24.04", expand as docker does;
//     "docker://" in front is allowed).
//
// A path is checked now, so a typo is answered before anything is fetched.
// Every error is ErrBadInput and says which forms are understood.
func ParseSource(s string) (Source, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return Source{}, errdefs.New(errdefs.ErrBadInput, "no image source given: want a registry reference (host/repo:tag or @sha256:…), oci:DIR or docker-archive:FILE")
	case strings.HasPrefix(s, prefixLayout):
		return layoutSource(strings.TrimPrefix(s, prefixLayout))
	case strings.HasPrefix(s, prefixArchive):
		return archiveSource(strings.TrimPrefix(s, prefixArchive))
	case strings.HasPrefix(s, prefixDocker):
		return registrySource(strings.TrimPrefix(s, prefixDocker))
	case looksLikePath(s):
		return pathSource(s)
	}
	if fi, err := os.Stat(s); err == nil {
		if fi.Mode().IsRegular() || isLayout(s) {
			return pathSource(s)
		}
	}
	return registrySource(s)
}

func looksLikePath(s string) bool {
	return s == "." || s == ".." || strings.HasPrefix(s, "/") ||
		strings.HasPrefix(s, "./") || strings.HasPrefix(s, "../")
}

func isLayout(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, "oci-layout"))
	return err == nil && fi.Mode().IsRegular()
}

// pathSource is a bare path: a layout if it is a directory, an archive if
// a file.
func pathSource(p string) (Source, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return Source{}, pathErr(p, err)
	}
	if fi.IsDir() {
		return layoutSource(p)
	}
	return archiveSource(p)
}

func layoutSource(p string) (Source, error) {
	abs, err := absPath(p)
	if err != nil {
		return Source{}, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return Source{}, pathErr(abs, err)
	}
	if !fi.IsDir() {
		return Source{}, errdefs.New(errdefs.ErrBadInput, "%s is not a directory: an OCI layout is a directory (for a `docker save` tarball say docker-archive:%s)", abs, abs)
	}
	if !isLayout(abs) {
		return Source{}, errdefs.New(errdefs.ErrBadInput, "%s is not an OCI image layout: it has no oci-layout file (write one with `skopeo copy … oci:%s` or `crane pull --format=oci`)", abs, abs)
	}
	return Source{Kind: Layout, Path: abs}, nil
}

func archiveSource(p string) (Source, error) {
	abs, err := absPath(p)
	if err != nil {
		return Source{}, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return Source{}, pathErr(abs, err)
	}
	if !fi.Mode().IsRegular() {
		return Source{}, errdefs.New(errdefs.ErrBadInput, "%s is not a regular file: a docker archive is the tarball `docker save` writes (for a layout directory say oci:%s)", abs, abs)
	}
	return Source{Kind: DockerArchive, Path: abs}, nil
}

func absPath(p string) (string, error) {
	if p == "" {
		return "", errdefs.New(errdefs.ErrBadInput, "an image source's path is empty: give oci:DIR or docker-archive:FILE")
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", errdefs.New(errdefs.ErrBadInput, "image source path %q: %v", p, err)
	}
	return abs, nil
}

func pathErr(p string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.New(errdefs.ErrBadInput, "image source %s does not exist", p)
	}
	return errdefs.New(errdefs.ErrBadInput, "image source %s: %v", p, err)
}

func registrySource(s string) (Source, error) {
	ref, err := name.ParseReference(s)
	if err != nil {
		return Source{}, errdefs.New(errdefs.ErrBadInput, "%q is neither an image reference (host[:port]/repo:tag or repo@sha256:…) nor oci:DIR, docker-archive:FILE or an existing path: %v", s, err)
	}
	return Source{Kind: Registry, Ref: ref}, nil
}
