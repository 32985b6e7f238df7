package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestDataTarSize: dataBytesFor gives the most file bytes whose tar
// stream fits a size, and dataTar writes exactly dataTarSize of them.
func TestDataTarSize(t *testing.T) {
	for _, size := range []int64{2048, 4096, fileSize, fileSize + 1536, 3*fileSize + 7000, 5 * fileSize} {
		n := dataBytesFor(size)
		if got := dataTarSize(n); got > size {
			t.Errorf("size %d: %d bytes of files make a %d-byte tar", size, n, got)
		}
		if dataTarSize(n+512) <= size {
			t.Errorf("size %d: %d bytes of files is not the most that fits", size, n)
		}
		var buf bytes.Buffer
		if err := dataTar(&buf, 1, n); err != nil {
			t.Fatal(err)
		}
		// Layer 1 has one directory header (data/<1>/) before its files.
		if got, want := int64(buf.Len()), dataTarSize(n)+dirHeaders(1); got != want {
			t.Errorf("size %d: dataTar wrote %d bytes, dataTarSize says %d", size, got, want)
		}
	}
	if dataBytesFor(1024) != 0 {
		t.Error("a size with room for no header gives file bytes")
	}
}

// TestDataTarContent: the same layer is the same bytes each time (a
// layer's opener is called more than once), another layer differs, the
// files are what the headers say, and gzip cannot shrink them.
func TestDataTarContent(t *testing.T) {
	n := int64(2*fileSize + 4096)
	write := func(layer int) []byte {
		var buf bytes.Buffer
		if err := dataTar(&buf, layer, n); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	a, b, other := write(0), write(0), write(1)
	if !bytes.Equal(a, b) {
		t.Error("two writes of one layer differ")
	}
	if bytes.Equal(a[2048:4096], other[1536:3584]) {
		t.Error("two layers have the same data")
	}
	tr := tar.NewReader(bytes.NewReader(a))
	var files, total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			files++
			total += h.Size
		}
	}
	if files != 3 || total != n {
		t.Errorf("%d files, %d bytes; want 3 files, %d bytes", files, total, n)
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(a)
	zw.Close()
	if float64(z.Len()) < 0.99*float64(len(a)) {
		t.Errorf("gzip shrank the data from %d to %d bytes: not incompressible", len(a), z.Len())
	}
}

// TestSizedImage: a base layer and data layers of at most layerMiB add
// up to the size asked (within a block per layer), with the config
// given; a size below the base is refused.
func TestSizedImage(t *testing.T) {
	var base bytes.Buffer
	if err := dataTar(&base, 9, 100_000); err != nil {
		t.Fatal(err)
	}
	b := base.Bytes()
	baseLayer, baseSize, err := func() (v1.Layer, int64, error) {
		l, err := layerOf(b)
		return l, int64(len(b)), err
	}()
	if err != nil {
		t.Fatal(err)
	}
	cfg := v1.Config{Cmd: []string{"/usr/bin/python3", "/srv/app.py"}}
	img, err := sizedImage(cfg, baseLayer, baseSize, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 4 { // the base, then 1 + 1 + the rest
		t.Errorf("%d layers, want 4", len(layers))
	}
	tarBytes, blobBytes, err := uncompressedSize(img)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(3 << 20); tarBytes > want || tarBytes < want-int64(len(layers))*512 {
		t.Errorf("tar streams add up to %d bytes, want %d less at most a block per layer", tarBytes, want)
	}
	if blobBytes < tarBytes*9/10 {
		t.Errorf("blobs of %d bytes for %d of tar: the data compressed", blobBytes, tarBytes)
	}
	cf, err := img.ConfigFile()
	if err != nil || cf.Config.Cmd[0] != "/usr/bin/python3" || cf.OS != "linux" {
		t.Errorf("config %+v, %v", cf, err)
	}
	if _, err := sizedImage(cfg, baseLayer, 5<<20, 3, 1); err == nil {
		t.Error("an image smaller than its base was made")
	}
}
