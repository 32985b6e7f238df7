// Package demotest shares the demo templates' root filesystems between
// the tests of one machine. A demo is Debian installed by mmdebstrap (a
// minute or two of dpkg each); internal/demo's tests and the end-to-end
// tests both need them, in packages go test runs side by side, and the
// builds share one apt cache that lets one run at a time. So each demo
// is built once per machine, recipe and day: under a lock, into
// /var/cache/sandstorm/test-demos/<name>-<recipe>-<day>/, where every
// later test takes it as it is. The recipe is a hash of internal/demo's
// own source, so a change to a demo builds it again; the day bounds how
// stale its Debian packages can be.
//
// The trees are shared read-only: a test that must change one copies it.
// It does not import internal/demo (whose own tests use it): the caller
// passes the build.
package demotest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Dir holds the shared trees.
const Dir = "/var/cache/sandstorm/test-demos"

// keep is how long an older day's tree stays before a build removes it.
const keep = 48 * time.Hour

// Build returns demo name's shared rootfs and its description (D is
// demo.Demo), building it with build (demo.Build into the directory it is
// given) if no test on this machine has today.
func Build[D any](name string, build func(dir string) (D, error)) (string, D, error) {
	var zero D
	recipe, err := recipeHash()
	if err != nil {
		return "", zero, err
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return "", zero, err
	}
	key := fmt.Sprintf("%s-%s-%s", name, recipe, time.Now().UTC().Format("20060102"))
	unlock, err := lock(filepath.Join(Dir, key+".lock"))
	if err != nil {
		return "", zero, err
	}
	defer unlock()
	dir := filepath.Join(Dir, key)
	rootfs := filepath.Join(dir, "rootfs")
	desc := filepath.Join(dir, "demo.json")
	if b, err := os.ReadFile(desc); err == nil {
		var d D
		if err := json.Unmarshal(b, &d); err == nil {
			return rootfs, d, nil
		}
	}
	// Not there, or cut short: build it again from nothing.
	if err := os.RemoveAll(dir); err != nil {
		return "", zero, err
	}
	prune(name, key)
	d, err := build(rootfs)
	if err != nil {
		return "", zero, err
	}
	b, _ := json.Marshal(d)
	// demo.json last: its presence says the tree is whole.
	if err := os.WriteFile(desc+".tmp", b, 0o644); err != nil {
		return "", zero, err
	}
	return rootfs, d, os.Rename(desc+".tmp", desc)
}

// recipeHash is a short hash of internal/demo's non-test Go source.
func recipeHash() (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("demotest: cannot find internal/demo's source")
	}
	src := filepath.Dir(filepath.Dir(self))
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("demotest: internal/demo's source at %s: %v", src, err)
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// lock takes an exclusive lock on path, waiting for it.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// prune removes name's trees other than key that are older than keep
// (best effort: a tree another test still uses is at most that old).
func prune(name, key string) {
	ents, _ := os.ReadDir(Dir)
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() || n == key || !strings.HasPrefix(n, name+"-") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > keep {
			os.RemoveAll(filepath.Join(Dir, n))
			os.Remove(filepath.Join(Dir, n+".lock"))
		}
	}
}
