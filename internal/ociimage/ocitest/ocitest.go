// Package ocitest is what tests across the tree need of OCI images: a real
// registry (go-containerregistry's) on loopback, with basic auth, blob
// GETs counted and blobs corrupted on demand, and images built from a
// directory or from hand-written (hostile) tar entries, pushed or written
// as a layout or a docker archive.
package ocitest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Options shapes a Registry.
type Options struct {
	// User and Password, when User is set, are the only basic-auth
	// credentials it accepts; anything else is 401.
	User, Password string
	// Wrap, when set, is put in front of everything (a test's own
	// misbehaviour).
	Wrap func(http.Handler) http.Handler
}

// Registry is a registry on 127.0.0.1, closed when the test ends.
type Registry struct {
	// Host is its host:port.
	Host string

	opts    Options
	mu      sync.Mutex
	gets    map[string]int
	corrupt map[string][]byte
}

// NewRegistry starts a registry that keeps everything in memory.
func NewRegistry(t testing.TB, opts Options) *Registry {
	t.Helper()
	r := &Registry{opts: opts, gets: map[string]int{}, corrupt: map[string][]byte{}}
	var h http.Handler = r.blobs(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	if opts.User != "" {
		h = r.auth(h)
	}
	if opts.Wrap != nil {
		h = opts.Wrap(h)
	}
	srv := httptest.NewServer(h) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// Ref is repoTag ("repo:tag" or "repo@sha256:…") in this registry.
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// Corrupt makes every later GET of the blob dgst answer body instead (nil:
// its own bytes with the last one flipped).
func (r *Registry) Corrupt(dgst v1.Hash, body []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if body == nil {
		body = []byte{} // marks "flip" below
	}
	r.corrupt[dgst.String()] = body
}

// BlobGets is how many GETs of the blob dgst it has answered.
func (r *Registry) BlobGets(dgst v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets[dgst.String()]
}

// AllBlobGets is how many GETs of any blob it has answered.
func (r *Registry) AllBlobGets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.gets {
		n += c
	}
	return n
}

// blobDigest is the digest of a GET /v2/<repo>/blobs/<digest>, or "".
func blobDigest(req *http.Request) string {
	if req.Method != http.MethodGet || !strings.HasPrefix(req.URL.Path, "/v2/") {
		return ""
	}
	i := strings.LastIndex(req.URL.Path, "/blobs/")
	if i < 0 {
		return ""
	}
	return req.URL.Path[i+len("/blobs/"):]
}

func (r *Registry) blobs(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		d := blobDigest(req)
		if d == "" {
			next.ServeHTTP(w, req)
			return
		}
		r.mu.Lock()
		r.gets[d]++
		body, bad := r.corrupt[d]
		r.mu.Unlock()
		if !bad {
			next.ServeHTTP(w, req)
			return
		}
		if len(body) == 0 {
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, req)
			body = rec.Body.Bytes()
			if len(body) > 0 {
				body[len(body)-1] ^= 0xff
			}
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(body)
	})
}

func (r *Registry) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, p, ok := req.BasicAuth()
		if !ok || u != r.opts.User || p != r.opts.Password {
			w.Header().Set("WWW-Authenticate", `Basic realm="ocitest"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		next.ServeHTTP(w, req)
	})
}

func (r *Registry) remoteOpts() []remote.Option {
	if r.opts.User == "" {
		return nil
	}
	return []remote.Option{remote.WithAuth(&authn.Basic{Username: r.opts.User, Password: r.opts.Password})}
}

// Push writes img to repoTag in this registry and returns its full
// reference.
func (r *Registry) Push(t testing.TB, img v1.Image, repoTag string) string {
	t.Helper()
	ref := parseRef(t, r.Ref(repoTag))
	if err := remote.Write(ref, img, r.remoteOpts()...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref.Name()
}

// PushIndex writes idx (and the images in it) to repoTag.
func (r *Registry) PushIndex(t testing.TB, idx v1.ImageIndex, repoTag string) string {
	t.Helper()
	ref := parseRef(t, r.Ref(repoTag))
	if err := remote.WriteIndex(ref, idx, r.remoteOpts()...); err != nil {
		t.Fatalf("push index %s: %v", ref, err)
	}
	return ref.Name()
}

// rawManifest is a manifest as bytes, for PushRaw.
type rawManifest struct {
	body []byte
	mt   types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.body, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// PushRaw puts a hand-written manifest at repoTag; the blobs it names
// need not exist (the registry does not check).
func (r *Registry) PushRaw(t testing.TB, repoTag string, mt types.MediaType, manifest []byte) string {
	t.Helper()
	ref := parseRef(t, r.Ref(repoTag))
	if err := remote.Put(ref, rawManifest{manifest, mt}, r.remoteOpts()...); err != nil {
		t.Fatalf("put manifest %s: %v", ref, err)
	}
	return ref.Name()
}

func parseRef(t testing.TB, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s)
	if err != nil {
		t.Fatalf("reference %q: %v", s, err)
	}
	return ref
}

// TarEntry is one entry of a hand-written layer. Type defaults to a
// regular file (a directory when Name ends in "/"); Mode to 0644 (0755 for
// a directory).
type TarEntry struct {
	Name     string
	Type     byte
	Mode     int64
	Body     []byte
	Linkname string
	Uid, Gid int
	// Devmajor and Devminor: a device's numbers (a whiteout is a char
	// device 0:0).
	Devmajor, Devminor int64
	// PAXRecords: e.g. "SCHILY.xattr.trusted.overlay.opaque": "y".
	PAXRecords map[string]string
}

// Tar is entries as an uncompressed tar stream, in their order.
func Tar(t testing.TB, entries []TarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Size: int64(len(e.Body)),
			Linkname: e.Linkname, Uid: e.Uid, Gid: e.Gid,
			Devmajor: e.Devmajor, Devminor: e.Devminor, PAXRecords: e.PAXRecords,
			Format: tar.FormatPAX,
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
			if strings.HasSuffix(e.Name, "/") {
				hdr.Typeflag = tar.TypeDir
			}
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if hdr.Typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.Name, err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write(e.Body); err != nil {
				t.Fatalf("tar body %q: %v", e.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// LayerFromTar is an uncompressed tar stream as a gzip-compressed layer.
func LayerFromTar(t testing.TB, tarball []byte) v1.Layer {
	t.Helper()
	l, err := tarballLayer(tarball)
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	return l
}

func tarballLayer(b []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
}

// ImageFromLayers is an image of linux/<GOARCH> with one gzip layer per
// list of entries, bottom first.
func ImageFromLayers(t testing.TB, layers ...[]TarEntry) v1.Image {
	t.Helper()
	ls := make([]v1.Layer, len(layers))
	for i, entries := range layers {
		ls[i] = LayerFromTar(t, Tar(t, entries))
	}
	return ImageOf(t, v1.Config{}, ls...)
}

// ImageOf is an image of linux/<GOARCH> with cfg and layers, bottom first.
func ImageOf(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// WriteDockerArchive writes img as `docker save` would, tagged ref.
func WriteDockerArchive(t testing.TB, img v1.Image, ref, file string) {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatalf("tag %q: %v", ref, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatalf("docker archive %s: %v", file, err)
	}
}

// WriteLayout writes img as an OCI image layout in dir, its index
// naming platform (nil: none).
func WriteLayout(t testing.TB, img v1.Image, dir string, platform *v1.Platform) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatalf("layout %s: %v", dir, err)
	}
	var opts []layout.Option
	if platform != nil {
		opts = append(opts, layout.WithPlatform(*platform))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		t.Fatalf("layout %s: %v", dir, err)
	}
}
