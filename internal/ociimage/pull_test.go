package ociimage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/ociimage/ocitest"
)

func TestPullByTagThenByDigest(t *testing.T) {
	reg := ocitest.NewRegistry(t, ocitest.Options{})
	img := testImage(t)
	ref := reg.Push(t, img, "app:v1")

	got, digest := resolve(t, ref, ResolveOptions{})
	if want := mustDigest(t, img); digest != want {
		t.Fatalf("digest %s, want %s", digest, want)
	}
	st := &Store{Dir: filepath.Join(t.TempDir(), "layers")}
	var events []Progress
	layers, err := st.Pull(ctxT(t), got, Limits{}, func(p Progress) { events = append(events, p) })
	if err != nil {
		t.Fatal(err)
	}
	if names := storeNames(t, st.Dir); !slices.Equal(names, sortedCopy(diffIDNames(t, img))) {
		t.Fatalf("store holds %v, want exactly the layers %v", names, diffIDNames(t, img))
	}
	for i, l := range layers {
		if filepath.Base(l) != diffIDNames(t, img)[i] {
			t.Errorf("layer %d is %s, want bottom first %s", i, l, diffIDNames(t, img)[i])
		}
	}
	if last := events[len(events)-1]; !last.Done || last.Layer != 1 || last.Layers != 2 || last.Cached || last.Read <= 0 {
		t.Errorf("last progress %+v: want layer 1 of 2 done, fetched", last)
	}
	dst := t.TempDir()
	if err := st.Flatten(layers, dst); err != nil {
		t.Fatal(err)
	}
	checkTree(t, dst)

	// By digest: the same image, and its layers, already stored, are not
	// fetched again.
	before := reg.AllBlobGets()
	got2, digest2 := resolve(t, reg.Ref("app@"+digest), ResolveOptions{})
	if digest2 != digest {
		t.Fatalf("by digest: %s, want %s", digest2, digest)
	}
	events = nil
	layers2, err := st.Pull(ctxT(t), got2, Limits{}, func(p Progress) { events = append(events, p) })
	if err != nil || !slices.Equal(layers2, layers) {
		t.Fatalf("second pull: %v, %v; want %v", layers2, err, layers)
	}
	for _, e := range events {
		if !e.Cached {
			t.Errorf("progress %+v: want cached", e)
		}
	}
	// The config blob is read again by Resolve; no layer blob is.
	for _, d := range layerDigests(t, img) {
		if n := reg.BlobGets(d); n != 1 {
			t.Errorf("layer %s fetched %d times, want once", d, n)
		}
	}
	if n := reg.AllBlobGets() - before; n != 1 {
		t.Errorf("%d blob GETs for a stored image, want 1 (its config)", n)
	}
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestSharedLayerFetchedOnce(t *testing.T) {
	reg := ocitest.NewRegistry(t, ocitest.Options{})
	base := ocitest.LayerFromTar(t, ocitest.Tar(t, baseEntries))
	a := ocitest.ImageOf(t, v1.Config{}, base, ocitest.LayerFromTar(t, ocitest.Tar(t, appEntries)))
	b := ocitest.ImageOf(t, v1.Config{}, base, ocitest.LayerFromTar(t, ocitest.Tar(t, []ocitest.TarEntry{{Name: "b", Body: []byte("b")}})))
	refA, refB := reg.Push(t, a, "a:1"), reg.Push(t, b, "b:1")
	st := &Store{Dir: t.TempDir()}
	for _, ref := range []string{refA, refB} {
		img, _ := resolve(t, ref, ResolveOptions{})
		pullFlat(t, st, img)
	}
	d, err := base.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if n := reg.BlobGets(d); n != 1 {
		t.Fatalf("the shared layer was fetched %d times, want once", n)
	}
	if n := len(storeNames(t, st.Dir)); n != 3 {
		t.Fatalf("store holds %d layers, want 3", n)
	}
}

func TestConcurrentPullsFetchOnce(t *testing.T) {
	reg := ocitest.NewRegistry(t, ocitest.Options{})
	img := testImage(t)
	ref := reg.Push(t, img, "app:v1")
	st := &Store{Dir: t.TempDir()}
	var wg sync.WaitGroup
	results := make([][]string, 4)
	errs := make([]error, 4)
	for i := range results {
		got, _ := resolve(t, ref, ResolveOptions{})
		wg.Go(func() { results[i], errs[i] = st.Pull(ctxT(t), got, Limits{}, nil) })
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil || !slices.Equal(results[i], results[0]) {
			t.Fatalf("pull %d: %v, %v; want %v", i, results[i], errs[i], results[0])
		}
	}
	for _, d := range layerDigests(t, img) {
		if n := reg.BlobGets(d); n != 1 {
			t.Errorf("layer %s fetched %d times by 4 concurrent pulls, want once", d, n)
		}
	}
	if names := storeNames(t, st.Dir); len(names) != 2 {
		t.Errorf("store holds %v, want its 2 layers only", names)
	}
}

func TestCorruptBlobKeepsNothing(t *testing.T) {
	img := testImage(t)
	top := layerDigests(t, img)[1]
	other, err := ocitest.LayerFromTar(t, ocitest.Tar(t, []ocitest.TarEntry{{Name: "evil", Body: []byte("x")}})).Compressed()
	if err != nil {
		t.Fatal(err)
	}
	var otherBlob bytes.Buffer
	otherBlob.ReadFrom(other)
	for name, body := range map[string][]byte{
		"flipped byte":        nil,
		"another valid layer": otherBlob.Bytes(),
		"longer than said":    bytes.Repeat([]byte{0}, 1<<20),
	} {
		t.Run(name, func(t *testing.T) {
			reg := ocitest.NewRegistry(t, ocitest.Options{})
			ref := reg.Push(t, img, "app:v1")
			reg.Corrupt(top, body)
			got, _ := resolve(t, ref, ResolveOptions{})
			st := &Store{Dir: t.TempDir()}
			_, err := st.Pull(ctxT(t), got, Limits{}, nil)
			if !errors.Is(err, errdefs.ErrBadInput) {
				t.Fatalf("Pull of a corrupt blob: %v, want ErrBadInput", err)
			}
			// The bottom layer was good and stays; nothing of the top one
			// (no temporary directory either).
			if names := storeNames(t, st.Dir); !slices.Equal(names, diffIDNames(t, img)[:1]) {
				t.Fatalf("store holds %v after a corrupt blob, want only the good layer %v", names, diffIDNames(t, img)[:1])
			}
		})
	}
}

func TestGzipBombRefused(t *testing.T) {
	bomb := ocitest.ImageFromLayers(t, []ocitest.TarEntry{{Name: "zeros", Body: make([]byte, 32<<20)}})
	st := &Store{Dir: t.TempDir()}
	_, err := st.Pull(ctxT(t), bomb, Limits{}, nil)
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "100:1") {
		t.Fatalf("Pull of 32 MiB of zeros gzipped: %v, want ErrTooLarge naming the ratio", err)
	}
	if names := storeNames(t, st.Dir); len(names) != 0 {
		t.Fatalf("store holds %v after a bomb, want nothing", names)
	}

	// The same bytes pass with a ratio allowed, and stop at a byte bound.
	if _, err := st.Pull(ctxT(t), bomb, Limits{MaxRatio: 10000}, nil); err != nil {
		t.Fatalf("with the ratio raised: %v", err)
	}
	st2 := &Store{Dir: t.TempDir()}
	if _, err := st2.Pull(ctxT(t), bomb, Limits{MaxRatio: 10000, MaxBytes: 1 << 20}, nil); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("over MaxBytes: %v, want ErrTooLarge", err)
	}
	if names := storeNames(t, st2.Dir); len(names) != 0 {
		t.Fatalf("store holds %v after a refusal, want nothing", names)
	}
}

func TestTenThousandLayersRefusedUnfetched(t *testing.T) {
	reg := ocitest.NewRegistry(t, ocitest.Options{})
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        v1.Descriptor{MediaType: types.OCIConfigJSON, Size: 100, Digest: fakeDigest(0)},
	}
	for i := range 10000 {
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.OCILayer, Size: 32, Digest: fakeDigest(i + 1)})
	}
	body, err := jsonMarshal(m)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.PushRaw(t, "many:1", types.OCIManifestSchema1, body)
	s, err := ParseSource(ref)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Resolve(ctxT(t), s, ResolveOptions{})
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "10000 layers") {
		t.Fatalf("Resolve of 10,000 layers: %v, want ErrTooLarge naming the count", err)
	}
	if n := reg.AllBlobGets(); n != 0 {
		t.Fatalf("%d blobs fetched before refusing, want none", n)
	}

	// A real image over a lower bound is refused the same way.
	img := testImage(t)
	ref = reg.Push(t, img, "app:v1")
	s, _ = ParseSource(ref)
	if _, _, err := Resolve(ctxT(t), s, ResolveOptions{MaxLayers: 1}); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("2 layers with MaxLayers 1: %v, want ErrTooLarge", err)
	}
	st := &Store{Dir: t.TempDir()}
	if _, err := st.Pull(ctxT(t), img, Limits{MaxLayers: 1}, nil); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("Pull of 2 layers with MaxLayers 1: %v, want ErrTooLarge", err)
	}
}

func fakeDigest(i int) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%064x", i)}
}

// otherArch is an architecture this machine is not.
func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "s390x"
	}
	return "arm64"
}

func TestIndexPlatform(t *testing.T) {
	reg := ocitest.NewRegistry(t, ocitest.Options{})
	img := testImage(t)
	foreign := v1.Platform{OS: "linux", Architecture: otherArch()}
	only := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &foreign}})
	ref := reg.PushIndex(t, only, "multi:foreign")
	s, _ := ParseSource(ref)
	_, _, err := Resolve(ctxT(t), s, ResolveOptions{})
	if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "linux/"+otherArch()) || !strings.Contains(err.Error(), "linux/"+runtime.GOARCH) {
		t.Fatalf("index with only %s: %v, want ErrBadInput naming it and ours", foreign, err)
	}

	// With ours beside it, ours is picked.
	mine := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	other := ocitest.ImageFromLayers(t, []ocitest.TarEntry{{Name: "other", Body: []byte("x")}})
	both := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &foreign}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &mine}})
	ref = reg.PushIndex(t, both, "multi:both")
	got, digest := resolve(t, ref, ResolveOptions{})
	if digest != mustDigest(t, img) {
		t.Fatalf("picked %s, want our platform's %s", digest, mustDigest(t, img))
	}
	checkTree(t, pullFlat(t, &Store{Dir: t.TempDir()}, got))

	// A single image built for another platform is refused too.
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = otherArch()
	foreignImg, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	s, _ = ParseSource(reg.Push(t, foreignImg, "foreign:1"))
	if _, _, err := Resolve(ctxT(t), s, ResolveOptions{}); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "built for linux/"+otherArch()) {
		t.Fatalf("image for %s: %v, want ErrBadInput", otherArch(), err)
	}
}

func TestNoSuchImage(t *testing.T) {
	reg := ocitest.NewRegistry(t, ocitest.Options{})
	s, _ := ParseSource(reg.Ref("nothing:here"))
	if _, _, err := Resolve(ctxT(t), s, ResolveOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing image: %v, want ErrNotFound", err)
	}
}

// hangOn makes GETs of the blobs named hang until the client gives up.
func hangOn(digests ...v1.Hash) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			for _, d := range digests {
				if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/blobs/"+d.String()) {
					<-req.Context().Done()
					return
				}
			}
			next.ServeHTTP(w, req)
		})
	}
}

func TestCallsEndWithTheirDeadline(t *testing.T) {
	img := testImage(t)
	cfgName, _ := img.ConfigName()
	top := layerDigests(t, img)[1]

	reg := ocitest.NewRegistry(t, ocitest.Options{Wrap: hangOn(cfgName)})
	s, _ := ParseSource(reg.Push(t, img, "app:v1"))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, _, err := Resolve(ctx, s, ResolveOptions{}); !errors.Is(err, errdefs.ErrTimeout) {
		t.Fatalf("Resolve against a registry that hangs: %v, want ErrTimeout", err)
	}

	reg = ocitest.NewRegistry(t, ocitest.Options{Wrap: hangOn(top)})
	s, _ = ParseSource(reg.Push(t, img, "app:v1"))
	got, _, err := Resolve(ctxT(t), s, ResolveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := &Store{Dir: t.TempDir()}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := st.Pull(ctx, got, Limits{}, nil); !errors.Is(err, errdefs.ErrTimeout) {
		t.Fatalf("Pull of a blob that hangs: %v, want ErrTimeout", err)
	}
	if names := storeNames(t, st.Dir); len(names) != 1 {
		t.Fatalf("store holds %v, want only the bottom layer", names)
	}
}
