package ociimage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"sandstorm/internal/errdefs"
)

// DefaultMaxLayers is the most layers an image may have unless told
// otherwise: overlayfs stacks at most 128 lower layers and Docker builds
// at most 127.
const DefaultMaxLayers = 127

// maxConfigSize bounds an image's config blob, which is read whole into
// memory; real ones are a few KiB (long histories a few hundred).
const maxConfigSize = 8 << 20

// maxIndexDepth bounds indexes nested in indexes.
const maxIndexDepth = 4

// ResolveOptions says how Resolve reaches and bounds an image.
type ResolveOptions struct {
	// Keychain gives a registry's credentials (Keychain()); nil is
	// anonymous.
	Keychain authn.Keychain
	// Platform is the one wanted from an index; zero is
	// linux/runtime.GOARCH.
	Platform v1.Platform
	// MaxLayers refuses an image with more layers before any of them is
	// fetched; 0 is DefaultMaxLayers.
	MaxLayers int
	// Transport carries the registry's requests; nil is
	// remote.DefaultTransport.
	Transport http.RoundTripper
}

func (o ResolveOptions) platform() v1.Platform {
	if o.Platform.OS == "" && o.Platform.Architecture == "" {
		return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	return o.Platform
}

func (o ResolveOptions) maxLayers() int {
	if o.MaxLayers <= 0 {
		return DefaultMaxLayers
	}
	return o.MaxLayers
}

// image is an image Resolve found, and how Store.Pull fetches its layers:
// from a registry by digest under Pull's context (puller set), or from
// the image itself; an archive's layers are stored uncompressed, so only
// their diffIDs can be checked (archive).
type image struct {
	v1.Image
	puller  *remote.Puller
	repo    name.Repository
	archive bool
	secrets *secrets
}

// Resolve finds src's image for the platform (linux/<GOARCH> by default):
// a registry's or layout's index is narrowed to it (an index without it
// is ErrBadInput naming the platforms it has), and an image built for
// another platform is refused. Its manifest and config are read and
// bounded — more than MaxLayers layers is ErrTooLarge before any layer
// is fetched — and digest is the image manifest's ("sha256:…"; for a
// docker archive, which has no manifest of its own, the config's, docker's
// image ID).
//
// Every registry call is made under ctx; the layers are fetched later, by
// Store.Pull, under its own.
func Resolve(ctx context.Context, src Source, opts ResolveOptions) (img v1.Image, digest string, err error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	var im *image
	switch src.Kind {
	case Registry:
		im, err = resolveRemote(ctx, src.Ref, opts)
	case Layout:
		im, err = resolveLayout(src.Path, opts)
	case DockerArchive:
		im, err = resolveArchive(src.Path)
	default:
		return nil, "", errdefs.New(errdefs.ErrBadInput, "no image source given (ParseSource makes one)")
	}
	if err == nil {
		digest, err = im.check(ctx, opts)
	}
	if err != nil {
		if im != nil {
			err = im.secrets.scrub(err)
		}
		return nil, "", fmt.Errorf("image %s: %w", src, err)
	}
	return im, digest, nil
}

func resolveRemote(ctx context.Context, ref name.Reference, opts ResolveOptions) (*image, error) {
	kc := opts.Keychain
	if kc == nil {
		kc = authn.NewMultiKeychain() // resolves every registry to Anonymous
	}
	sec := &secrets{kc: kc}
	ropts := []remote.Option{remote.WithAuthFromKeychain(sec), remote.WithPlatform(opts.platform()), remote.WithUserAgent("sandstormd")}
	if opts.Transport != nil {
		ropts = append(ropts, remote.WithTransport(opts.Transport))
	}
	puller, err := remote.NewPuller(ropts...)
	if err != nil {
		return nil, err
	}
	im := &image{puller: puller, repo: ref.Context(), secrets: sec}
	desc, err := puller.Get(ctx, ref)
	if err != nil {
		return im, remoteErr(ctx, err)
	}
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return im, remoteErr(ctx, err)
		}
		im.Image, err = pickFromIndex(idx, opts.platform(), 0)
		return im, remoteErr(ctx, err)
	case desc.MediaType.IsImage():
		im.Image, err = desc.Image()
		return im, remoteErr(ctx, err)
	case desc.MediaType.IsSchema1():
		return im, errdefs.New(errdefs.ErrNotSupported, "%s is a Docker schema 1 manifest, retired in 2019: push the image again with a current Docker", ref)
	}
	return im, errdefs.New(errdefs.ErrBadInput, "%s is a %s, not a container image", ref, desc.MediaType)
}

// remoteErr is a registry call's error in the project's kinds.
func remoteErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errdefs.New(errdefs.ErrTimeout, "the registry did not answer in time: %w", err)
	}
	if _, ok := errdefs.Lookup(err); ok || errors.Is(err, context.Canceled) {
		return err
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized:
			return errdefs.New(errdefs.ErrUnauthorized, "the registry refused the credentials (log in with `docker login`, or check the auth file): %w", err)
		case http.StatusForbidden:
			return errdefs.New(errdefs.ErrForbidden, "the registry forbids this pull (check the credentials' rights on the repository): %w", err)
		case http.StatusNotFound:
			return errdefs.New(errdefs.ErrNotFound, "the registry has no such image (check the name and tag): %w", err)
		case http.StatusTooManyRequests:
			return errdefs.New(errdefs.ErrUnavailable, "the registry limits this client's pulls; try again later: %w", err)
		}
		if te.StatusCode >= 500 {
			return errdefs.New(errdefs.ErrUpstream, "the registry failed: %w", err)
		}
		return errdefs.New(errdefs.ErrUpstream, "the registry answered wrongly: %w", err)
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return errdefs.New(errdefs.ErrUnavailable, "the registry cannot be reached: %w", err)
	}
	// What is left is the image's own fault (a manifest or config that
	// does not parse, a digest that does not match): fetching it again
	// gives the same.
	return errdefs.Mark(errdefs.ErrBadInput, err)
}

func resolveLayout(dir string, opts ResolveOptions) (*image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "reading the OCI layout: %w", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "reading the OCI layout's index.json: %w", err)
	}
	img, err := pickFromIndex(idx, opts.platform(), 0)
	if err != nil {
		return nil, err
	}
	return &image{Image: img}, nil
}

func resolveArchive(file string) (*image, error) {
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "reading the docker archive (it must hold exactly one image, as `docker save IMAGE` writes): %w", err)
	}
	return &image{Image: img, archive: true}, nil
}

// pickFromIndex is idx's image for want: the entry whose platform
// satisfies it (an index in it is searched in turn), else an index's lone
// image with no platform (a layout of one image often says none; its
// config is checked later).
func pickFromIndex(idx v1.ImageIndex, want v1.Platform, depth int) (v1.Image, error) {
	img, have, err := searchIndex(idx, want, depth)
	if img != nil || err != nil {
		return img, err
	}
	slices.Sort(have)
	have = slices.Compact(have)
	if len(have) == 0 {
		return nil, errdefs.New(errdefs.ErrBadInput, "the index holds no image for any platform (is it an artifact, not a container image?)")
	}
	return nil, errdefs.New(errdefs.ErrBadInput, "the index has no image for %s, only for %s: pick an image built for %s", want, strings.Join(have, ", "), want)
}

// searchIndex is pickFromIndex's search: the image, or else the platforms
// the index (and the indexes in it) has.
func searchIndex(idx v1.ImageIndex, want v1.Platform, depth int) (v1.Image, []string, error) {
	if depth > maxIndexDepth {
		return nil, nil, errdefs.New(errdefs.ErrBadInput, "indexes nest deeper than %d", maxIndexDepth)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, err
	}
	var have []string
	var bare []v1.Descriptor
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == "unknown" {
			continue // attestations and signatures, not images
		}
		if d.Platform != nil && !d.Platform.Satisfies(want) {
			have = append(have, d.Platform.String())
			continue
		}
		switch {
		case d.MediaType.IsImage() && d.Platform != nil:
			img, err := idx.Image(d.Digest)
			return img, nil, err
		case d.MediaType.IsImage():
			bare = append(bare, d)
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, nil, err
			}
			img, theirs, err := searchIndex(child, want, depth+1)
			if img != nil || err != nil {
				return img, nil, err
			}
			have = append(have, theirs...)
		}
	}
	switch {
	case len(bare) == 1 && len(have) == 0:
		img, err := idx.Image(bare[0].Digest)
		return img, nil, err
	case len(bare) > 1 && len(have) == 0:
		return nil, nil, errdefs.New(errdefs.ErrBadInput, "the index holds %d images and says of none which platform it is for: copy the one for %s alone", len(bare), want)
	}
	return nil, have, nil
}

// check bounds im before any layer is fetched, and says its digest.
func (im *image) check(ctx context.Context, opts ResolveOptions) (string, error) {
	max := opts.maxLayers()
	if !im.archive {
		// The manifest first: a 10,000-layer image is refused before its
		// config, let alone a layer, is fetched.
		m, err := im.Manifest()
		if err != nil {
			return "", im.readErr(ctx, "its manifest", err)
		}
		if n := len(m.Layers); n > max {
			return "", errdefs.New(errdefs.ErrTooLarge, "the image has %d layers; at most %d are allowed (squash it, e.g. with a multi-stage build)", n, max)
		}
		if m.Config.Size > maxConfigSize {
			return "", errdefs.New(errdefs.ErrTooLarge, "the image's config is %d bytes; at most %d are allowed", m.Config.Size, maxConfigSize)
		}
		for _, l := range m.Layers {
			if err := layerType(l.MediaType); err != nil {
				return "", err
			}
		}
	}
	cfg, err := im.ConfigFile()
	if err != nil {
		return "", im.readErr(ctx, "its config", err)
	}
	if n := len(cfg.RootFS.DiffIDs); n > max {
		return "", errdefs.New(errdefs.ErrTooLarge, "the image has %d layers; at most %d are allowed (squash it, e.g. with a multi-stage build)", n, max)
	}
	if err := platformMatches(cfg, opts.platform()); err != nil {
		return "", err
	}
	var h v1.Hash
	if im.archive {
		h, err = im.ConfigName()
	} else {
		h, err = im.Digest()
	}
	if err != nil {
		return "", im.readErr(ctx, "its digest", err)
	}
	return h.String(), nil
}

// readErr is a failure reading what of im: a registry's in the kinds
// remoteErr gives, a local file's as bad input.
func (im *image) readErr(ctx context.Context, what string, err error) error {
	if im.puller != nil {
		return fmt.Errorf("reading %s: %w", what, remoteErr(ctx, err))
	}
	return errdefs.New(errdefs.ErrBadInput, "reading %s: %w", what, err)
}

func platformMatches(cfg *v1.ConfigFile, want v1.Platform) error {
	if cfg.OS == "" && cfg.Architecture == "" {
		return nil // says nothing; the index that led here chose it
	}
	have := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	if !have.Satisfies(v1.Platform{OS: want.OS, Architecture: want.Architecture}) {
		return errdefs.New(errdefs.ErrBadInput, "the image is built for %s, not %s: pick an image built for %s", have, want, want)
	}
	return nil
}

// layerType refuses a layer that is not a filesystem layer this package
// can unpack.
func layerType(mt types.MediaType) error {
	switch mt {
	case types.DockerLayer, types.OCILayer, types.OCILayerZStd,
		types.DockerUncompressedLayer, types.OCIUncompressedLayer:
		return nil
	case types.DockerForeignLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
		return errdefs.New(errdefs.ErrNotSupported, "a layer is foreign (%s, a Windows base layer): only Linux images can be templates", mt)
	}
	return errdefs.New(errdefs.ErrBadInput, "a layer is a %q, not a filesystem layer: is this an artifact rather than a container image?", mt)
}
