package ociimage

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
)

// The magic numbers a layer blob may begin with.
var (
	magicGzip = []byte{0x1f, 0x8b}
	magicZstd = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// maxZstdWindow bounds the memory a zstd layer may make its decoder take;
// zstd's own command line stops at 128 MiB without --long.
const maxZstdWindow = 128 << 20

// progressEvery is how often, in compressed bytes, a fetch reports.
const progressEvery = 1 << 20

// budget is the uncompressed bytes one Pull may still read.
type budget struct{ left int64 }

// stream is one layer's bytes on their way to its tree: counted and
// hashed as they come (compressed) and as they are unpacked
// (uncompressed).
type stream struct {
	compressed   *counter
	uncompressed *guard
}

// size is the blob's size as its manifest says, -1 unknown.
func newStream(ctx context.Context, r io.Reader, size int64, lim Limits, b *budget, report func(int64)) *stream {
	c := &counter{ctx: ctx, r: r, h: sha256.New(), size: size, report: report, next: progressEvery}
	return &stream{compressed: c, uncompressed: &guard{h: sha256.New(), c: c, lim: lim, b: b}}
}

// counter hashes and counts the bytes it reads, and keeps the source's
// own error apart from what a reader above it makes of it.
type counter struct {
	ctx    context.Context
	r      io.Reader
	h      hash.Hash
	n      int64
	size   int64
	err    error
	report func(int64)
	next   int64
}

func (c *counter) Read(p []byte) (int, error) {
	// A local file does not watch ctx; a registry's body does as well.
	if err := c.ctx.Err(); err != nil {
		c.err = err
		return 0, err
	}
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	if c.size >= 0 && c.n > c.size {
		// Its digest would not match either; this stops it early.
		c.err = errdefs.New(errdefs.ErrBadInput, "it is longer than the %d bytes its manifest says: the source is corrupt or tampered with; nothing was kept", c.size)
		return n, c.err
	}
	if c.n >= c.next {
		c.next = c.n + progressEvery
		c.report(c.n)
	}
	return n, err
}

func (c *counter) sum() v1.Hash { return hashOf(c.h) }

func hashOf(h hash.Hash) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
}

// guard hashes and counts the uncompressed bytes, and stops them at the
// Pull's budget or at a ratio to the compressed bytes that only a bomb
// reaches.
type guard struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	c   *counter
	lim Limits
	b   *budget
	err error
}

func (g *guard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	g.h.Write(p[:n])
	g.n += int64(n)
	g.b.left -= int64(n)
	switch {
	case g.b.left < 0:
		g.err = errdefs.New(errdefs.ErrTooLarge, "the image is over %d bytes uncompressed: raise the limit or slim the image", g.lim.MaxBytes)
	case g.n > g.lim.RatioFloor && g.n > g.lim.MaxRatio*g.c.n:
		g.err = errdefs.New(errdefs.ErrTooLarge, "it expands more than %d:1 (%d bytes from %d): a decompression bomb, not a filesystem; refused", g.lim.MaxRatio, g.n, g.c.n)
	}
	if g.err != nil {
		return n, g.err
	}
	return n, err
}

func (g *guard) sum() v1.Hash { return hashOf(g.h) }

// unpack decompresses the layer into dir and reads it to its end, so that
// both hashes cover every byte.
func (s *stream) unpack(dir string, lim rootfs.Limits) error {
	br := bufio.NewReaderSize(s.compressed, 64<<10)
	magic, _ := br.Peek(len(magicZstd)) // a short or empty blob is plain
	switch {
	case bytes.HasPrefix(magic, magicGzip):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return s.explain(fmt.Errorf("its gzip header: %w", err))
		}
		defer gz.Close()
		s.uncompressed.r = gz
	case bytes.HasPrefix(magic, magicZstd):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderLowmem(true))
		if err != nil {
			return s.explain(fmt.Errorf("its zstd header: %w", err))
		}
		defer zr.Close()
		s.uncompressed.r = zr
	default:
		s.uncompressed.r = br
	}
	if _, err := rootfs.UnpackLayer(s.uncompressed, dir, lim); err != nil {
		return s.explain(err)
	}
	// After the tar's end: its padding, then whatever else the blob
	// holds, all of it hashed (the guard still bounds it).
	if _, err := io.Copy(io.Discard, s.uncompressed); err != nil {
		return s.explain(err)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return s.explain(err)
	}
	return nil
}

// explain is an unpack's error as what caused it: the guard's bound, the
// source's failure, or what rootfs or a decompressor said of the bytes.
func (s *stream) explain(err error) error {
	switch {
	case s.uncompressed.err != nil:
		return s.uncompressed.err
	case s.compressed.err != nil:
		return sourceErr(s.compressed.ctx, s.compressed.err)
	}
	if _, ok := errdefs.Lookup(err); ok {
		return err
	}
	return errdefs.New(errdefs.ErrBadInput, "it is not a well-formed layer: %w", err)
}

// sourceErr is a failure reading a layer's bytes from its source.
func sourceErr(ctx context.Context, err error) error {
	var ne net.Error
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) {
		return remoteErr(ctx, err)
	}
	if _, ok := errdefs.Lookup(err); ok {
		return err
	}
	// go-containerregistry checks a registry's blob against its digest
	// as it reads, and says so in an error of no type.
	if strings.Contains(err.Error(), "checksum") {
		return errdefs.New(errdefs.ErrBadInput, "its bytes do not match its digest — the registry served something else (%v); nothing was kept", err)
	}
	return errdefs.New(errdefs.ErrBadInput, "reading its bytes: %w (nothing was kept)", err)
}
