package runtimes

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Layout of a node's kept builds (Dir is <data-dir>/runsc-versions):
//
//	<key>/runsc        the build, 0755, owned by the node's user (root)
//	<key>/build.json   {"version", "sha256"}: what its key was made from
//	<key>/checked.json the binary's identity when it last hashed right
//	<key>.refused-<t>  a build whose content no longer matched its name,
//	                   moved aside (never run, never removed by the node)
//	.new-<random>/     a build being copied in (removed at the next start)
//	source.json        which file the current build was copied from, and
//	                   its identity then (so a restart need not hash it)
//	kept.json          the node's last Plan, for `sandstormd doctor`
//
// Every directory is 0700: only the node's user can reach the binaries,
// so what was checked when it was copied in is what runs.

// Build is one kept runsc build.
type Build struct {
	Key     Key    `json:"key"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	// Path is the binary the node runs for it.
	Path string `json:"path"`
}

// VersionFunc says what `runsc --version` of the binary at path says
// (gvisor.Version).
type VersionFunc func(ctx context.Context, path string) (string, error)

// Set is the builds kept in one directory.
type Set struct {
	dir string
	log *slog.Logger

	mu      sync.Mutex
	builds  map[Key]Build
	refused map[Key]string
	current Build
}

const (
	binaryName  = "runsc"
	buildFile   = "build.json"
	checkedFile = "checked.json"
	sourceFile  = "source.json"
	keptFile    = "kept.json"
	newPrefix   = ".new-"
	refusedTag  = ".refused-"
)

// Open opens the builds kept in dir (made 0700 if new), checks each (its
// owner, its mode, and its content against its name: one that does not
// match is moved aside and never run), and makes the build at src the
// current one, copying it in first if it is not kept yet. The current
// build is what the node runs from then on: its copy, not src, so a
// change to src while the node runs changes nothing.
func Open(ctx context.Context, dir, src string, version VersionFunc, log *slog.Logger) (*Set, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Set{dir: dir, log: log, builds: map[Key]Build{}, refused: map[Key]string{}}
	if err := ownDir(dir, true); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, newPrefix):
			// A copy cut short by a crash: never made a build.
			os.RemoveAll(filepath.Join(dir, name))
		case e.IsDir() && Key(name).Valid():
			b, err := s.check(Key(name), false, false)
			if err != nil {
				s.refuse(Key(name), err)
				continue
			}
			s.builds[b.Key] = b
		}
	}
	cur, err := s.install(ctx, src, version)
	if err != nil {
		return nil, err
	}
	s.current = cur
	return s, nil
}

// Dir is the directory the builds are kept in.
func (s *Set) Dir() string { return s.dir }

// Current is the build new sandboxes run on.
func (s *Set) Current() Build { return s.current }

// Builds is every build kept, sorted by key.
func (s *Set) Builds() []Build {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Build, 0, len(s.builds))
	for _, b := range s.builds {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Keys is the key of every build kept.
func (s *Set) Keys() []Key {
	bs := s.Builds()
	out := make([]Key, len(bs))
	for i, b := range bs {
		out[i] = b.Key
	}
	return out
}

// Refused says, per key, why a build found in the directory is not run.
func (s *Set) Refused() map[Key]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[Key]string, len(s.refused))
	for k, v := range s.refused {
		out[k] = v
	}
	return out
}

// ErrNotKept is a build the node does not have (any more).
var ErrNotKept = errors.New("runsc build not kept on this node")

// Get returns the kept build k, or an error saying why there is none.
func (s *Set) Get(k Key) (Build, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.builds[k]; ok {
		return b, nil
	}
	if why, ok := s.refused[k]; ok {
		return Build{}, fmt.Errorf("%w: runsc %s was refused when the node started: %s", ErrNotKept, k, why)
	}
	return Build{}, fmt.Errorf("%w: runsc %s (it is not in %s)", ErrNotKept, k, s.dir)
}

// PathOf is where build k's binary is, whether or not it is kept: a
// command run there for a build that is not kept fails (no such file),
// which is what must happen (fail closed: never another build in its
// place).
func (s *Set) PathOf(k Key) string {
	if b, err := s.Get(k); err == nil {
		return b.Path
	}
	if !k.Valid() {
		return filepath.Join(s.dir, "invalid-key", binaryName)
	}
	return filepath.Join(s.dir, string(k), binaryName)
}

// Remove deletes kept build k. The current build is never removed. A
// sandbox process of k that still runs keeps its binary (Linux keeps an
// executable's inode while it runs), but nothing can start k again.
func (s *Set) Remove(k Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k == s.current.Key {
		return fmt.Errorf("runtimes: %s is the current build", k)
	}
	if _, ok := s.builds[k]; !ok {
		return nil
	}
	if err := os.RemoveAll(filepath.Join(s.dir, string(k))); err != nil {
		return err
	}
	delete(s.builds, k)
	return nil
}

// check verifies kept build k: its directory and binary are the node's
// user's and writable by no one else, build.json names k, and the binary
// hashes to what build.json says. readOnly (doctor) reports a wrong owner
// or mode; otherwise it is repaired (the content is what matters, and it
// was checked). Unless full, a binary whose identity (device, inode, size,
// mtime, ctime: any write or chmod changes the ctime, which cannot be set
// back) is the one recorded when it last hashed right is not read again:
// a restart then costs no 100 MB read per build (0.27 s each here).
func (s *Set) check(k Key, readOnly, full bool) (Build, error) {
	d := filepath.Join(s.dir, string(k))
	p := filepath.Join(d, binaryName)
	var meta struct {
		Version string `json:"version"`
		SHA256  string `json:"sha256"`
	}
	data, err := os.ReadFile(filepath.Join(d, buildFile))
	if err != nil {
		return Build{}, fmt.Errorf("no %s: %w", buildFile, err)
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return Build{}, fmt.Errorf("%s: %w", buildFile, err)
	}
	if want, err := KeyOf(meta.Version, meta.SHA256); err != nil || want != k {
		return Build{}, fmt.Errorf("%s says version %q, sha256 %s: that is not %s", buildFile, meta.Version, meta.SHA256, k)
	}
	for _, f := range []struct {
		path string
		dir  bool
		mode os.FileMode
	}{{d, true, 0o700}, {p, false, 0o755}} {
		if err := ownFile(f.path, f.dir, f.mode, readOnly); err != nil {
			return Build{}, err
		}
	}
	b := Build{Key: k, Version: meta.Version, SHA256: meta.SHA256, Path: p}
	fi, err := os.Lstat(p)
	if err != nil {
		return Build{}, err
	}
	id := identity(p, fi)
	if !full {
		var last source
		if data, err := os.ReadFile(filepath.Join(d, checkedFile)); err == nil && json.Unmarshal(data, &last) == nil && sameFile(last, id) {
			return b, nil
		}
	}
	sum, err := FileSHA256(p)
	if err != nil {
		return Build{}, err
	}
	if sum != meta.SHA256 {
		return Build{}, fmt.Errorf("%s hashes to sha256 %s, not %s: it was changed after it was kept", p, sum, meta.SHA256)
	}
	if !readOnly {
		if data, err := json.Marshal(id); err == nil {
			writeSynced(filepath.Join(d, checkedFile), data, 0o600)
		}
	}
	return b, nil
}

// refuse moves build k aside (never run again, kept for a person to look
// at) and says so.
func (s *Set) refuse(k Key, why error) {
	from := filepath.Join(s.dir, string(k))
	to := from + refusedTag + time.Now().UTC().Format("20060102T150405Z")
	if err := os.Rename(from, to); err != nil {
		s.log.Error("runsc build refused, and could not be moved aside", "key", k, "why", why, "err", err)
	} else {
		s.log.Error("runsc build refused: moved aside, never run; sandboxes that need it start cold", "key", k, "why", why, "moved_to", to)
	}
	s.refused[k] = why.Error()
}

// source is what source.json records: the file the current build was
// copied from, and its identity then.
type source struct {
	Path  string `json:"path"`
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime_ns"`
	Ctime int64  `json:"ctime_ns"`
	Key   Key    `json:"key"`
}

func identity(path string, fi os.FileInfo) source {
	st, _ := fi.Sys().(*syscall.Stat_t)
	if st == nil {
		return source{Path: path}
	}
	return source{Path: path, Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
}

// install makes the build at src kept (if it is not) and returns it. A
// file whose identity (device, inode, size, mtime and ctime: ctime
// changes with any write, and cannot be set back) is the one recorded at
// the last start is the build recorded then, without reading it again;
// any other is copied in while hashed, and if a kept build has that hash
// already, the copy is dropped.
func (s *Set) install(ctx context.Context, src string, version VersionFunc) (Build, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return Build{}, fmt.Errorf("runsc %s: %w", src, err)
	}
	if !fi.Mode().IsRegular() {
		return Build{}, fmt.Errorf("runsc %s is not a regular file", src)
	}
	id := identity(src, fi)
	var last source
	if data, err := os.ReadFile(filepath.Join(s.dir, sourceFile)); err == nil && json.Unmarshal(data, &last) == nil {
		if b, ok := s.builds[last.Key]; ok && last.Key != "" && sameFile(last, id) {
			return b, nil
		}
	}
	tmp := filepath.Join(s.dir, newPrefix+randHex())
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return Build{}, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	p := filepath.Join(tmp, binaryName)
	sum, err := copyHashed(src, p)
	if err != nil {
		return Build{}, fmt.Errorf("copy runsc %s into %s: %w", src, s.dir, err)
	}
	if fi2, err := os.Stat(src); err != nil || !sameFile(identity(src, fi2), id) {
		return Build{}, fmt.Errorf("runsc %s changed while it was copied in; start again once it is written", src)
	}
	var b Build
	for _, kb := range s.builds {
		if kb.SHA256 == sum {
			b = kb
		}
	}
	if b.Key == "" {
		v, err := version(ctx, p)
		if err != nil {
			return Build{}, err
		}
		k, err := KeyOf(v, sum)
		if err != nil {
			return Build{}, err
		}
		meta, _ := json.Marshal(struct {
			Version string `json:"version"`
			SHA256  string `json:"sha256"`
		}{v, sum})
		if err := writeSynced(filepath.Join(tmp, buildFile), meta, 0o644); err != nil {
			return Build{}, err
		}
		final := filepath.Join(s.dir, string(k))
		if _, err := os.Lstat(final); err == nil {
			// Refused above, or not a build at all: keep it for a
			// person to look at, and use the new copy.
			os.Rename(final, final+refusedTag+time.Now().UTC().Format("20060102T150405Z"))
		}
		if err := os.Rename(tmp, final); err != nil {
			return Build{}, err
		}
		syncDir(s.dir)
		b = Build{Key: k, Version: v, SHA256: sum, Path: filepath.Join(final, binaryName)}
		if fi, err := os.Lstat(b.Path); err == nil {
			if data, err := json.Marshal(identity(b.Path, fi)); err == nil {
				writeSynced(filepath.Join(final, checkedFile), data, 0o600)
			}
		}
		s.builds[k] = b
		delete(s.refused, k)
		s.log.Info("runsc build kept", "key", k, "version", v, "sha256", sum, "from", src, "path", b.Path)
	}
	id.Key = b.Key
	if data, err := json.Marshal(id); err == nil {
		writeSynced(filepath.Join(s.dir, sourceFile), data, 0o600)
	}
	return b, nil
}

func sameFile(a, b source) bool {
	return a.Path == b.Path && a.Dev == b.Dev && a.Ino == b.Ino && a.Size == b.Size && a.Mtime == b.Mtime && a.Ctime == b.Ctime && a.Dev != 0
}

// copyHashed copies src to a new file dst (0755 once complete, synced)
// and returns the SHA-256 of what it wrote. It tries a reflink first
// (FICLONE: no data copied on btrfs or XFS) and hashes dst then.
func copyHashed(src, dst string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o700)
	if err != nil {
		return "", err
	}
	defer out.Close()
	h := sha256.New()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		f, err := os.Open(dst)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	} else if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		return "", err
	}
	if err := out.Sync(); err != nil {
		return "", err
	}
	if err := out.Chmod(0o755); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), out.Close()
}

// FileSHA256 is the hex SHA-256 of the file at path: how a runsc build
// is known by its content (and any other binary, for a results file).
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ownDir makes sure dir is a directory of this process's user that no one
// else can enter (create: making it if missing).
func ownDir(dir string, create bool) error {
	if create {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	return ownFile(dir, true, 0o700, false)
}

// ownFile checks that path is a directory (dir) or a regular file, not a
// symlink, owned by this process's user and writable by no one else, and
// repairs owner and mode to mode unless readOnly.
func ownFile(path string, dir bool, mode os.FileMode, readOnly bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if dir && !fi.IsDir() || !dir && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s, not a %s", path, fi.Mode().Type(), map[bool]string{true: "directory", false: "regular file"}[dir])
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	uid := os.Geteuid()
	wrongOwner := st != nil && int(st.Uid) != uid
	wrongMode := fi.Mode().Perm() != mode
	if !wrongOwner && !wrongMode {
		return nil
	}
	if readOnly {
		return fmt.Errorf("%s is owned by uid %d with mode %v; want uid %d, mode %v", path, st.Uid, fi.Mode().Perm(), uid, mode)
	}
	if wrongOwner {
		if err := os.Lchown(path, uid, os.Getegid()); err != nil {
			return err
		}
	}
	return os.Chmod(path, mode)
}

func writeSynced(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	syncDir(filepath.Dir(path))
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

func randHex() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
