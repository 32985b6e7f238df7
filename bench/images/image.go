package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"sandstorm/internal/rootfs"
)

// fileSize is the size of each random file of a data layer: about what
// the larger files of a real image (shared libraries, wheels) weigh, so
// an unpack pays a file's cost every MiB, not once per layer.
const fileSize = 1 << 20

// tarEnd is the two zero blocks that end a tar stream.
const tarEnd = 1024

// dataTarSize is the size of the tar stream dataTar writes for n bytes of
// files: a 512-byte header per file, its data (whole 512-byte blocks,
// since fileSize and a short last file are padded) and the end.
func dataTarSize(n int64) int64 {
	var size int64
	for left := n; left > 0; left -= fileSize {
		f := min(left, fileSize)
		size += 512 + (f+511)/512*512
	}
	return size + tarEnd
}

// dataBytesFor is how many bytes of files make a data layer's tar stream
// at most size bytes long (0 when even one file's header does not fit).
func dataBytesFor(size int64) int64 {
	perFile := int64(512 + fileSize)
	full := (size - tarEnd) / perFile
	n := full * fileSize
	if rest := size - tarEnd - full*perFile - 512; rest > 0 {
		n += rest / 512 * 512
	}
	return max(n, 0)
}

// dataTar writes a tar stream of n bytes of random data in files of
// fileSize under data/<layer>/, drawn from a generator seeded by layer:
// the same bytes every time (a layer's opener is called more than once),
// and incompressible, as a real image's already-compressed content is.
func dataTar(w io.Writer, layer int, n int64) error {
	rng := rand.New(rand.NewChaCha8([32]byte{byte(layer), 'i', 'm', 'g'}))
	tw := tar.NewWriter(w)
	mtime := time.Unix(1_700_000_000, 0)
	dir := "data/" + strconv.Itoa(layer) + "/"
	hdrs := []*tar.Header{
		{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR},
		{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR},
	}
	if layer > 0 {
		hdrs = hdrs[1:] // data/ comes with the first data layer
	}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	buf := make([]byte, fileSize)
	for i, left := 0, n; left > 0; i++ {
		size := min(left, fileSize)
		h := &tar.Header{Name: fmt.Sprintf("%sf%05d", dir, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: mtime, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		b := buf[:size]
		for j := 0; j < len(b); j += 8 {
			v := rng.Uint64()
			for k := 0; k < 8 && j+k < len(b); k++ {
				b[j+k] = byte(v >> (8 * k))
			}
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
		left -= size
	}
	return tw.Close()
}

// dirHeaders is the size of dataTar's directory headers for layer.
func dirHeaders(layer int) int64 {
	if layer == 0 {
		return 1024
	}
	return 512
}

// dataLayers are random data layers of at most layerMiB MiB each whose
// tar streams add up to total bytes (to within a 512-byte block each).
func dataLayers(total int64, layerMiB int) ([]v1.Layer, error) {
	var out []v1.Layer
	per := int64(layerMiB) << 20
	for i := 0; total > 0; i++ {
		size := min(total, per)
		n := dataBytesFor(size - dirHeaders(i))
		if n == 0 {
			break
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(dataTar(pw, i, n)) }()
			return pr, nil
		}, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return nil, err
		}
		out = append(out, l)
		total -= size
	}
	return out, nil
}

// rootfsLayer is the tree at dir as one layer (rootfs.Pack: the same bytes
// every time), with the size of its tar stream.
func rootfsLayer(dir string) (v1.Layer, int64, error) {
	var buf bytes.Buffer
	if err := rootfs.Pack(dir, &buf); err != nil {
		return nil, 0, fmt.Errorf("pack %s: %w", dir, err)
	}
	l, err := layerOf(buf.Bytes())
	return l, int64(buf.Len()), err
}

// layerOf is the tar stream b as a gzip layer.
func layerOf(b []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
}

// imageOf is an image of linux/<GOARCH> with cfg and layers, bottom first.
func imageOf(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	return mutate.ConfigFile(img, cf)
}

// sizedImage is the web demo's rootfs (base, whose tar stream is
// baseSize bytes) with random data layers on top, so that its layers'
// tar streams add up to about mib MiB.
func sizedImage(cfg v1.Config, base v1.Layer, baseSize int64, mib, layerMiB int) (v1.Image, error) {
	rest := int64(mib)<<20 - baseSize
	if rest < 0 {
		return nil, fmt.Errorf("an image of %d MiB: the web rootfs alone is %.1f MiB", mib, float64(baseSize)/(1<<20))
	}
	data, err := dataLayers(rest, layerMiB)
	if err != nil {
		return nil, err
	}
	return imageOf(cfg, append([]v1.Layer{base}, data...)...)
}

// uncompressedSize is the sum of img's layers' tar streams, and its
// compressed size (what a pull fetches).
func uncompressedSize(img v1.Image) (tarBytes, blobBytes int64, err error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, 0, err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return 0, 0, err
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return 0, 0, err
		}
		s, err := l.Size()
		if err != nil {
			return 0, 0, err
		}
		tarBytes, blobBytes = tarBytes+n, blobBytes+s
	}
	return tarBytes, blobBytes, nil
}
