package livemove

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/node/layout"
)

// TestRoundTrip: what a Writer sends — manifest, image files, volume,
// end — a Reader reads back whole into another sandbox's directory.
func TestRoundTrip(t *testing.T) {
	src := layout.Dir(t.TempDir())
	os.MkdirAll(src.Snapshot(), 0o700)
	os.WriteFile(filepath.Join(src.Snapshot(), "checkpoint.img"), []byte("memory"), 0o600)
	os.WriteFile(filepath.Join(src.Snapshot(), "pages.img"), []byte("pp"), 0o600)
	os.MkdirAll(filepath.Join(src.Upper(), "home", "user"), 0o755)
	os.WriteFile(filepath.Join(src.Upper(), "home", "user", "notes"), []byte("kept"), 0o644)

	image, imageBytes, err := ImageFiles(src.Snapshot())
	if err != nil || len(image) != 2 || imageBytes != 8 {
		t.Fatalf("ImageFiles: %v %d %v", image, imageBytes, err)
	}
	volumeBytes, err := TreeBytes(src.Upper())
	if err != nil || volumeBytes != 4 {
		t.Fatalf("TreeBytes: %d %v", volumeBytes, err)
	}
	m := Manifest{ID: "abc123", Name: "mv", Template: "t", Tier: api.TierSnapshot, MemoryMiB: 64,
		ImageBytes: imageBytes, VolumeBytes: volumeBytes, CreatedAt: time.Unix(1, 0).UTC(), From: "n1"}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if w.Started() {
		t.Fatal("started before anything was written")
	}
	if err := w.Manifest(m); err != nil || !w.Started() {
		t.Fatalf("manifest: %v (started %v)", err, w.Started())
	}
	if err := w.Image(src.Snapshot(), image); err != nil {
		t.Fatal(err)
	}
	if err := w.Volume(src.Upper()); err != nil {
		t.Fatal(err)
	}
	if err := w.End(); err != nil {
		t.Fatal(err)
	}

	r, got, err := ReadManifest(&buf)
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("manifest read back: %+v %v", got, err)
	}
	dst := layout.Dir(t.TempDir())
	if err := r.Receive(dst, got); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst.Snapshot(), "checkpoint.img")); err != nil || string(b) != "memory" {
		t.Errorf("image file: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst.Upper(), "home", "user", "notes")); err != nil || string(b) != "kept" {
		t.Errorf("volume file: %q %v", b, err)
	}
}

// TestCheck: a manifest no node could take is refused as bad input.
func TestCheck(t *testing.T) {
	good := Manifest{ID: "abc123", Name: "mv", Template: "t", Tier: api.TierSnapshot, MemoryMiB: 64, ImageBytes: 4}
	if err := Check(good, 1); err != nil {
		t.Fatalf("a good manifest: %v", err)
	}
	for name, c := range map[string]struct {
		m   func(Manifest) Manifest
		gen int64
	}{
		"no generation":       {func(m Manifest) Manifest { return m }, 0},
		"bad name":            {func(m Manifest) Manifest { m.Name = "Not/A/Name"; return m }, 1},
		"path in the ID":      {func(m Manifest) Manifest { m.ID = "../etc"; return m }, 1},
		"bad principal":       {func(m Manifest) Manifest { m.Principal = "a b"; return m }, 1},
		"negative sizes":      {func(m Manifest) Manifest { m.VolumeBytes = -1; return m }, 1},
		"envd path":           {func(m Manifest) Manifest { m.Envd = "../../../../bin"; return m }, 1},
		"image over memory":   {func(m Manifest) Manifest { m.ImageBytes = 64<<20 + maxImageOver + 1; return m }, 1},
		"detached with image": {func(m Manifest) Manifest { m.Tier = api.TierDetached; return m }, 1},
		"unknown tier":        {func(m Manifest) Manifest { m.Tier = "warm"; return m }, 1},
	} {
		if err := Check(c.m(good), c.gen); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%s: %v, want bad input", name, err)
		}
	}
}

// TestReadManifestRefuses: a stream that does not start with a manifest,
// or whose manifest is oversized or is not JSON, is bad input.
func TestReadManifestRefuses(t *testing.T) {
	for name, stream := range map[string]func(*bytes.Buffer){
		"empty": func(*bytes.Buffer) {},
		"volume first": func(b *bytes.Buffer) {
			w := NewWriter(b)
			w.Volume(t.TempDir())
			w.End()
		},
		"oversized manifest": func(b *bytes.Buffer) {
			w := NewWriter(b)
			w.Manifest(Manifest{Name: strings.Repeat("a", maxManifest)})
		},
	} {
		var b bytes.Buffer
		stream(&b)
		if _, _, err := ReadManifest(&b); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%s: %v, want bad input", name, err)
		}
	}
}

// TestReceiveNoImage: a running sandbox's stream that ends without its
// image is refused, never taken for a whole sandbox with no memory.
func TestReceiveNoImage(t *testing.T) {
	m := Manifest{ID: "abc123", Name: "mv", Tier: api.TierHot, MemoryMiB: 64, ImageBytes: 4}
	var b bytes.Buffer
	w := NewWriter(&b)
	w.Manifest(m)
	w.End()
	r, got, err := ReadManifest(&b)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Receive(layout.Dir(t.TempDir()), got); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a stream with no image: %v", err)
	}
}
