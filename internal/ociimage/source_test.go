package ociimage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/google/go-containerregistry/pkg/compression"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/ociimage/ocitest"
)

func TestParseSource(t *testing.T) {
	dir := t.TempDir()
	lay := filepath.Join(dir, "lay")
	ocitest.WriteLayout(t, testImage(t), lay, nil)
	arch := filepath.Join(dir, "img.tar")
	ocitest.WriteDockerArchive(t, testImage(t), "app:v1", arch)
	plain := filepath.Join(dir, "plain")
	os.Mkdir(plain, 0o755)
	t.Chdir(dir)

	for in, want := range map[string]string{
		"ubuntu":                     "index.docker.io/library/ubuntu:latest",
		"127.0.0.1:5000/app:v1":      "127.0.0.1:5000/app:v1",
		"docker://ghcr.io/o/app:1.2": "ghcr.io/o/app:1.2",
		"reg.example/app@sha256:" + strings.Repeat("a", 64): "reg.example/app@sha256:" + strings.Repeat("a", 64),
		"oci:" + lay:             "oci:" + lay,
		"oci:lay":                "oci:" + lay,
		"docker-archive:" + arch: "docker-archive:" + arch,
		lay:                      "oci:" + lay,
		"./lay":                  "oci:" + lay,
		"lay":                    "oci:" + lay, // exists: a path wins
		arch:                     "docker-archive:" + arch,
		"img.tar":                "docker-archive:" + arch,
		"plain":                  "index.docker.io/library/plain:latest", // no oci-layout: a name
	} {
		s, err := ParseSource(in)
		if err != nil || s.String() != want {
			t.Errorf("ParseSource(%q) = %q, %v; want %q", in, s, err, want)
		}
	}
	for in, says := range map[string]string{
		"":                         "no image source",
		"oci:" + arch:              "not a directory",
		"oci:" + plain:             "no oci-layout",
		"oci:/no/such":             "does not exist",
		"docker-archive:" + lay:    "not a regular file",
		"docker-archive:/no/such":  "does not exist",
		"./plain":                  "no oci-layout",
		"/no/such/dir":             "does not exist",
		"Bad Name:tag":             "neither an image reference",
		"reg.example/app@sha256:1": "neither an image reference",
	} {
		_, err := ParseSource(in)
		if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), says) {
			t.Errorf("ParseSource(%q): %v, want ErrBadInput saying %q", in, err, says)
		}
	}
}

func TestLayoutAndDockerArchive(t *testing.T) {
	img := testImage(t)
	dir := t.TempDir()
	mine := &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	ocitest.WriteLayout(t, img, filepath.Join(dir, "bare"), nil)
	ocitest.WriteLayout(t, img, filepath.Join(dir, "platformed"), mine)
	ocitest.WriteDockerArchive(t, img, "app:v1", filepath.Join(dir, "app.tar"))
	cf, _ := img.ConfigName()

	st := &Store{Dir: t.TempDir()}
	for src, want := range map[string]string{
		"oci:" + filepath.Join(dir, "bare"):               mustDigest(t, img),
		filepath.Join(dir, "platformed"):                  mustDigest(t, img),
		filepath.Join(dir, "app.tar"):                     cf.String(),
		"docker-archive:" + filepath.Join(dir, "app.tar"): cf.String(),
	} {
		got, digest := resolve(t, src, ResolveOptions{})
		if digest != want {
			t.Errorf("%s: digest %s, want %s", src, digest, want)
		}
		checkTree(t, pullFlat(t, &Store{Dir: t.TempDir()}, got))
		checkTree(t, pullFlat(t, st, got)) // one store shares them all
	}
	if n := len(storeNames(t, st.Dir)); n != 2 {
		t.Errorf("one store for four sources of one image holds %d layers, want 2", n)
	}

	// `docker save` stores layers uncompressed.
	plain := ocitest.ImageOf(t, v1.Config{},
		static.NewLayer(ocitest.Tar(t, baseEntries), types.DockerUncompressedLayer),
		static.NewLayer(ocitest.Tar(t, appEntries), types.DockerUncompressedLayer))
	ocitest.WriteDockerArchive(t, plain, "app:plain", filepath.Join(dir, "plain.tar"))
	got, _ := resolve(t, filepath.Join(dir, "plain.tar"), ResolveOptions{})
	checkTree(t, pullFlat(t, st, got))
	if n := len(storeNames(t, st.Dir)); n != 2 {
		t.Errorf("the same layers uncompressed: the store holds %d, want the same 2", n)
	}

	// A layout whose index.json names an index (crane's, docker's) that
	// names one image per platform.
	other := &v1.Platform{OS: "linux", Architecture: otherArch()}
	nested, err := layout.Write(filepath.Join(dir, "nested"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	multi := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: plain, Descriptor: v1.Descriptor{Platform: other}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: mine}})
	if err := nested.AppendIndex(multi); err != nil {
		t.Fatal(err)
	}
	if _, digest := resolve(t, filepath.Join(dir, "nested"), ResolveOptions{}); digest != mustDigest(t, img) {
		t.Errorf("nested layout: picked %s, want %s", digest, mustDigest(t, img))
	}

	ocitest.WriteLayout(t, img, filepath.Join(dir, "foreign"), other)
	s, _ := ParseSource(filepath.Join(dir, "foreign"))
	if _, _, err := Resolve(ctxT(t), s, ResolveOptions{}); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), other.String()) {
		t.Errorf("layout for %s only: %v", other, err)
	}
}

// A layout's blobs are read as they are on disk, with no check of its
// own: the store's is the one that stops a tampered blob.
func TestLayoutTamperedBlobKeepsNothing(t *testing.T) {
	img := testImage(t)
	dir := filepath.Join(t.TempDir(), "lay")
	ocitest.WriteLayout(t, img, dir, nil)
	top := layerDigests(t, img)[1]
	evil, err := ocitest.LayerFromTar(t, ocitest.Tar(t, []ocitest.TarEntry{{Name: "evil", Body: []byte("x")}})).Compressed()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "blobs", "sha256", top.Hex))
	if err != nil {
		t.Fatal(err)
	}
	f.ReadFrom(evil)
	f.Close()

	got, _ := resolve(t, dir, ResolveOptions{})
	st := &Store{Dir: t.TempDir()}
	_, err = st.Pull(ctxT(t), got, Limits{}, nil)
	if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "not to its digest") {
		t.Fatalf("tampered blob: %v, want ErrBadInput naming the digest", err)
	}
	if names := storeNames(t, st.Dir); len(names) != 1 || names[0] != diffIDNames(t, img)[0] {
		t.Fatalf("store holds %v, want only the untouched bottom layer", names)
	}
}

func TestZstdAndUncompressedLayers(t *testing.T) {
	dir := t.TempDir()
	zl, err := tarball.LayerFromOpener(opener(ocitest.Tar(t, baseEntries)), tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	plain := static.NewLayer(ocitest.Tar(t, appEntries), types.OCIUncompressedLayer)
	img := ocitest.ImageOf(t, v1.Config{}, zl, plain)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Layers[0].MediaType != types.OCILayerZStd || m.Layers[1].MediaType != types.OCIUncompressedLayer {
		t.Fatalf("layers are %s and %s, want zstd and uncompressed", m.Layers[0].MediaType, m.Layers[1].MediaType)
	}
	ocitest.WriteLayout(t, img, filepath.Join(dir, "lay"), nil)
	got, _ := resolve(t, filepath.Join(dir, "lay"), ResolveOptions{})
	checkTree(t, pullFlat(t, &Store{Dir: t.TempDir()}, got))
}

func TestPullStopsWithItsContext(t *testing.T) {
	img := testImage(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st := &Store{Dir: t.TempDir()}
	if _, err := st.Pull(ctx, img, Limits{}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Pull with a cancelled context: %v", err)
	}
	if names := storeNames(t, st.Dir); len(names) != 0 {
		t.Fatalf("store holds %v, want nothing", names)
	}
}

func TestImageFromDir(t *testing.T) {
	src := t.TempDir()
	mkTree(t, src, "usr/bin/tool*=elf", "bin -> usr/bin", "etc/hostname=box\n")
	dst := pullFlat(t, &Store{Dir: t.TempDir()}, ocitest.ImageFromDir(t, src))
	if got, err := ResolveExecutable(dst, "tool", "/bin"); err != nil || got != "/bin/tool" {
		t.Fatalf("tool through the bin link: %q, %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "etc/hostname")); err != nil || string(b) != "box\n" {
		t.Fatalf("etc/hostname: %q, %v", b, err)
	}
}
