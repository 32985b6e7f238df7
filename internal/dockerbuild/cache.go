package dockerbuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// keyVersion starts every key: a change to what a step means (how it is
// keyed, how its layer is made) changes it, and every older entry misses.
const keyVersion = "sandstorm-dockerbuild/1"

// chainKey is a step's cache key: its parent's key and its own parts
// (each as JSON, so their boundaries are unambiguous).
func chainKey(parent string, parts ...any) string {
	h := sha256.New()
	h.Write([]byte(keyVersion + "\x00" + parent + "\x00"))
	for _, p := range parts {
		j, err := json.Marshal(p)
		if err != nil {
			// Every part is plain data (strings, slices, structs of them).
			panic(fmt.Sprintf("dockerbuild: key part %T: %v", p, err))
		}
		h.Write(j)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// cache is the step cache's index: one file per key, holding the image
// after that step.
type cache struct{ dir string }

func openCache(dir string) (cache, error) {
	if dir == "" {
		return cache{}, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return cache{}, fmt.Errorf("dockerbuild: cache directory: %w", err)
	}
	return cache{dir: dir}, nil
}

// get is the image after the step keyed key. Anything wrong with an entry
// (unreadable, or its layers gone from the store) is a miss: the step
// runs again and its entry is written anew.
func (c cache) get(key string, store Store) (Image, bool) {
	if c.dir == "" {
		return Image{}, false
	}
	data, err := os.ReadFile(filepath.Join(c.dir, key+".json"))
	if err != nil {
		return Image{}, false
	}
	var img Image
	if json.Unmarshal(data, &img) != nil {
		return Image{}, false
	}
	for _, id := range img.Layers {
		if _, err := store.Dir(id); err != nil {
			return Image{}, false
		}
	}
	return img, true
}

// put records the image after the step keyed key, whole or not at all.
func (c cache) put(key string, img Image) error {
	if c.dir == "" {
		return nil
	}
	data, err := json.Marshal(img)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(c.dir, ".tmp-"+key+"-*")
	if err != nil {
		return fmt.Errorf("dockerbuild: cache entry: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(c.dir, key+".json"))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("dockerbuild: cache entry: %w", err)
	}
	return nil
}

// layerStep is a step that adds a layer: taken from the cache when key is
// there, else made by make (a directory that is removed, not kept, when
// anything after fails) and added to the store and the cache.
func (b *builder) layerStep(ctx context.Context, st *stageState, key string, make func(context.Context) (string, error)) error {
	if img, ok := b.cache.get(key, b.opts.Store); ok && b.extends(st.img, img) {
		fmt.Fprintln(b.out, " ---> CACHED")
		st.img.Layers = img.Layers
		st.key = key
		return nil
	}
	dir, err := make(ctx)
	if err != nil {
		return err
	}
	id, err := b.opts.Store.Add(ctx, dir)
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("adding the layer: %w", err)
	}
	fmt.Fprintf(b.out, " ---> %s\n", short(id))
	st.img.Layers = append(slices.Clone(st.img.Layers), id)
	st.key = key
	return b.cache.put(key, st.img)
}

// extends reports whether cached is img plus one layer: what a key
// promises, checked rather than trusted.
func (b *builder) extends(img, cached Image) bool {
	n := len(img.Layers)
	return len(cached.Layers) == n+1 && slices.Equal(cached.Layers[:n], img.Layers)
}

func short(id string) string {
	_, hexPart, ok := strings.Cut(id, ":")
	if ok && len(hexPart) > 12 {
		return hexPart[:12]
	}
	return id
}
