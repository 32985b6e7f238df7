package ociimage

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"sandstorm/internal/ociimage/ocitest"
)

// baseEntries and appEntries are the two layers of the test image: a
// tiny system, then an app on it that removes one of its files.
var (
	baseEntries = []ocitest.TarEntry{
		{Name: "etc/"},
		{Name: "etc/passwd", Body: []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")},
		{Name: "etc/group", Body: []byte("root:x:0:\napp:x:1000:\nstaff:x:50:\n")},
		{Name: "etc/motd", Body: []byte("hello\n")},
		{Name: "bin/"},
		{Name: "bin/sh", Mode: 0o755, Body: []byte("#!sh\n")},
	}
	appEntries = []ocitest.TarEntry{
		{Name: "app/"},
		{Name: "app/server", Mode: 0o755, Body: []byte("server\n")},
		{Name: "etc/.wh.motd"},
	}
)

func testImage(t *testing.T) v1.Image {
	return ocitest.ImageFromLayers(t, baseEntries, appEntries)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func resolve(t *testing.T, src string, opts ResolveOptions) (v1.Image, string) {
	t.Helper()
	s, err := ParseSource(src)
	if err != nil {
		t.Fatalf("ParseSource(%q): %v", src, err)
	}
	img, digest, err := Resolve(ctxT(t), s, opts)
	if err != nil {
		t.Fatalf("Resolve(%q): %v", src, err)
	}
	return img, digest
}

// pullFlat pulls img into st and flattens it into a new directory.
func pullFlat(t *testing.T, st *Store, img v1.Image) string {
	t.Helper()
	layers, err := st.Pull(ctxT(t), img, Limits{}, nil)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	dst := t.TempDir()
	if err := st.Flatten(layers, dst); err != nil {
		t.Fatalf("Flatten: %v", err)
	}
	return dst
}

// checkTree checks dst is the test image's tree.
func checkTree(t *testing.T, dst string) {
	t.Helper()
	for p, want := range map[string]string{"etc/passwd": string(baseEntries[1].Body), "bin/sh": "#!sh\n", "app/server": "server\n"} {
		got, err := os.ReadFile(filepath.Join(dst, p))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", p, got, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "etc/motd")); !os.IsNotExist(err) {
		t.Errorf("etc/motd, whited out by the top layer: %v", err)
	}
}

// storeNames is what the store directory holds.
func storeNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// diffIDs is img's layers' store names, bottom first.
func diffIDNames(t *testing.T, img v1.Image) []string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range cf.RootFS.DiffIDs {
		names = append(names, "sha256-"+d.Hex)
	}
	return names
}

func layerDigests(t *testing.T, img v1.Image) []v1.Hash {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var ds []v1.Hash
	for _, l := range m.Layers {
		ds = append(ds, l.Digest)
	}
	return ds
}

func mustDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func opener(b []byte) tarball.Opener {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}
