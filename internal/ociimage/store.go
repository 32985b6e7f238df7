package ociimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
)

// Defaults of Limits.
const (
	// DefaultMaxRatio: gzip at its best on real files rarely passes 20:1;
	// a stream of zeros passes 1000:1.
	DefaultMaxRatio = 100
	// DefaultRatioFloor: below this many uncompressed bytes a layer's
	// ratio is not judged (a small file of zeros is no bomb).
	DefaultRatioFloor = 1 << 20
)

// Limits bounds one Pull; zero fields are the defaults.
type Limits struct {
	// MaxLayers refuses an image with more layers; DefaultMaxLayers.
	MaxLayers int
	// MaxBytes bounds the uncompressed bytes (tar streams) of all the
	// layers this Pull fetches together; rootfs.DefaultMaxBytes.
	MaxBytes int64
	// MaxRatio refuses a layer whose uncompressed bytes pass MaxRatio
	// times its compressed bytes read so far, once past RatioFloor.
	MaxRatio   int64
	RatioFloor int64
	// Layer bounds each layer's unpacking (files, bytes).
	Layer rootfs.Limits
}

func (l Limits) withDefaults() Limits {
	if l.MaxLayers <= 0 {
		l.MaxLayers = DefaultMaxLayers
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = rootfs.DefaultMaxBytes
	}
	if l.MaxRatio <= 0 {
		l.MaxRatio = DefaultMaxRatio
	}
	if l.RatioFloor <= 0 {
		l.RatioFloor = DefaultRatioFloor
	}
	return l
}

// Progress is where a Pull is, for whoever shows it.
type Progress struct {
	// Layer is the layer's index, 0 the bottom; Layers how many there are.
	Layer, Layers int
	// DiffID names the layer ("sha256:…").
	DiffID string
	// Cached: the store had it; nothing is fetched.
	Cached bool
	// Read is its compressed bytes read so far; Size its compressed size
	// as the manifest says (-1 unknown).
	Read, Size int64
	// Done: the layer is in the store.
	Done bool
}

// Store keeps unpacked layers, each once, by diffID: <Dir>/sha256-<hex>
// is a layer's tree in overlayfs form (rootfs.UnpackLayer). A directory
// there is complete: it is renamed in only after both its digests
// matched.
type Store struct {
	Dir string

	mu    sync.Mutex
	locks map[string]chan struct{}
}

// layerPrefix begins a layer's directory name; tmpPrefix a pull under way.
const (
	layerPrefix = "sha256-"
	tmpPrefix   = ".pull-"
)

// Pull puts img's layers in the store and returns their directories,
// bottom first. A layer already there is not fetched. Any other is
// streamed once: its compressed bytes hashed and compared with its
// digest, decompressed (gzip, zstd or none) under lim's ratio and size
// bounds, hashed again and compared with its diffID, and unpacked with
// rootfs.UnpackLayer into a temporary directory in the store that is
// renamed into place only when both matched; on any error nothing of that
// layer is kept. Two pulls of one layer, in this process or another, do
// not race: one fetches it, in this process the other waits.
//
// img is one Resolve returned (a registry's layers are then fetched under
// ctx) or any other v1.Image.
func (s *Store) Pull(ctx context.Context, img v1.Image, lim Limits, progress func(Progress)) ([]string, error) {
	lim = lim.withDefaults()
	if progress == nil {
		progress = func(Progress) {}
	}
	layers, err := listLayers(img, lim.MaxLayers)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("layer store: %w", err)
	}
	budget := &budget{left: lim.MaxBytes}
	dirs := make([]string, len(layers))
	for i, l := range layers {
		p := Progress{Layer: i, Layers: len(layers), DiffID: l.diffID.String(), Size: l.size}
		dirs[i] = s.layerDir(l.diffID)
		if err := s.pullOne(ctx, img, l, lim, budget, p, progress); err != nil {
			if im, ok := img.(*image); ok {
				err = im.secrets.scrub(err)
			}
			return nil, fmt.Errorf("layer %d of %d (%s): %w", i+1, len(layers), l.diffID, err)
		}
	}
	return dirs, nil
}

// Flatten makes dst, which must be empty, the tree of layers (bottom
// first, directories Pull returned) with rootfs.Flatten: regular files
// are hard links into the store.
func (s *Store) Flatten(layers []string, dst string) error {
	for _, l := range layers {
		if filepath.Dir(l) != filepath.Clean(s.Dir) || !strings.HasPrefix(filepath.Base(l), layerPrefix) {
			return errdefs.New(errdefs.ErrBadInput, "%s is not a layer of the store %s", l, s.Dir)
		}
	}
	return rootfs.Flatten(layers, dst)
}

func (s *Store) layerDir(diffID v1.Hash) string {
	return filepath.Join(s.Dir, layerPrefix+diffID.Hex)
}

func (s *Store) has(diffID v1.Hash) bool {
	fi, err := os.Lstat(s.layerDir(diffID))
	return err == nil && fi.IsDir()
}

// pullOne puts one layer in the store unless it is there.
func (s *Store) pullOne(ctx context.Context, img v1.Image, l layerRef, lim Limits, b *budget, p Progress, progress func(Progress)) error {
	if s.has(l.diffID) {
		p.Cached, p.Done = true, true
		progress(p)
		return nil
	}
	unlock, err := s.lock(ctx, l.diffID.Hex)
	if err != nil {
		return err
	}
	defer unlock()
	if s.has(l.diffID) { // another pull put it there while this one waited
		p.Cached, p.Done = true, true
		progress(p)
		return nil
	}
	progress(p)
	read, err := s.fetch(ctx, img, l, lim, b, func(n int64) { p.Read = n; progress(p) })
	if err != nil {
		return err
	}
	p.Done, p.Read = true, read
	progress(p)
	return nil
}

// lock holds the layer's key in this process until the returned func is
// called; it gives up when ctx ends.
func (s *Store) lock(ctx context.Context, key string) (func(), error) {
	s.mu.Lock()
	if s.locks == nil {
		s.locks = map[string]chan struct{}{}
	}
	ch, ok := s.locks[key]
	if !ok {
		ch = make(chan struct{}, 1)
		s.locks[key] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// The channel stays in the map: one per layer ever pulled by this
	// process, a few bytes each.
	return func() { <-ch }, nil
}

// fetch streams, checks and unpacks one layer into a temporary directory
// and renames it into place; on any error the directory is removed.
// It returns how many compressed bytes it read.
func (s *Store) fetch(ctx context.Context, img v1.Image, l layerRef, lim Limits, b *budget, report func(int64)) (read int64, err error) {
	tmp, err := os.MkdirTemp(s.Dir, tmpPrefix)
	if err != nil {
		return 0, fmt.Errorf("layer store: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	rc, checkDigest, err := openLayer(ctx, img, l)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	size := l.size
	if !checkDigest {
		size = -1 // an archive's layer, read uncompressed
	}
	st := newStream(ctx, rc, size, lim, b, report)
	if err := st.unpack(tmp, lim.Layer); err != nil {
		return 0, err
	}
	if checkDigest {
		if got := st.compressed.sum(); got != l.digest {
			return 0, errdefs.New(errdefs.ErrBadInput, "its bytes hash to %s, not to its digest %s: the source is corrupt or tampered with; nothing was kept", got, l.digest)
		}
	}
	if got := st.uncompressed.sum(); got != l.diffID {
		return 0, errdefs.New(errdefs.ErrBadInput, "its uncompressed bytes hash to %s, not to its diffID: the source is corrupt or tampered with; nothing was kept", got)
	}
	return st.compressed.n, s.place(tmp, l.diffID)
}

// place renames tmp to the layer's directory unless one is there already
// (another process put it there first: the same bytes, so tmp is
// dropped).
func (s *Store) place(tmp string, diffID v1.Hash) error {
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, s.layerDir(diffID), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return os.RemoveAll(tmp)
	}
	if err != nil {
		return fmt.Errorf("layer store: placing the layer: %w", err)
	}
	return nil
}

// layerRef is one layer as the manifest and config name it.
type layerRef struct {
	digest, diffID v1.Hash
	size           int64 // compressed, -1 unknown
}

// listLayers is img's layers, bottom first, without fetching any: diffIDs
// from its config, digests from its manifest (an archive has none of its
// own).
func listLayers(img v1.Image, max int) ([]layerRef, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("reading the image's config: %w", err))
	}
	ids := cfg.RootFS.DiffIDs
	if len(ids) > max {
		return nil, errdefs.New(errdefs.ErrTooLarge, "the image has %d layers; at most %d are allowed", len(ids), max)
	}
	refs := make([]layerRef, len(ids))
	for i, id := range ids {
		if !validSHA256(id) {
			return nil, errdefs.New(errdefs.ErrBadInput, "layer %d's diffID %q is not a sha256 digest", i+1, id)
		}
		refs[i] = layerRef{diffID: id, size: -1}
	}
	if im, ok := img.(*image); ok && im.archive {
		return refs, nil
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("reading the image's manifest: %w", err))
	}
	if len(m.Layers) != len(ids) {
		return nil, errdefs.New(errdefs.ErrBadInput, "the manifest lists %d layers and the config %d: the image is malformed", len(m.Layers), len(ids))
	}
	for i, d := range m.Layers {
		if err := layerType(d.MediaType); err != nil {
			return nil, err
		}
		refs[i].digest = d.Digest
		if d.Size > 0 { // else unknown; the digest still decides
			refs[i].size = d.Size
		}
	}
	return refs, nil
}

func validSHA256(h v1.Hash) bool {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return false
	}
	for _, c := range h.Hex {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// openLayer is the layer's bytes as its source keeps them, and whether
// they are its compressed blob (to be checked against its digest). A
// registry's layer is fetched by digest under ctx; an archive's is read
// uncompressed, as `docker save` stores it, and only its diffID means
// anything.
func openLayer(ctx context.Context, img v1.Image, l layerRef) (io.ReadCloser, bool, error) {
	im, _ := img.(*image)
	switch {
	case im != nil && im.archive:
		layer, err := img.LayerByDiffID(l.diffID)
		if err != nil {
			return nil, false, errdefs.Mark(errdefs.ErrBadInput, err)
		}
		rc, err := layer.Uncompressed()
		if err != nil {
			return nil, false, errdefs.Mark(errdefs.ErrBadInput, err)
		}
		return rc, false, nil
	case im != nil && im.puller != nil:
		layer, err := im.puller.Layer(ctx, im.repo.Digest(l.digest.String()))
		if err != nil {
			return nil, false, remoteErr(ctx, err)
		}
		rc, err := layer.Compressed()
		if err != nil {
			return nil, false, remoteErr(ctx, err)
		}
		return rc, true, nil
	}
	layer, err := img.LayerByDigest(l.digest)
	if err != nil {
		return nil, false, errdefs.Mark(errdefs.ErrBadInput, err)
	}
	rc, err := layer.Compressed()
	if err != nil {
		return nil, false, errdefs.Mark(errdefs.ErrBadInput, err)
	}
	return rc, true, nil
}
