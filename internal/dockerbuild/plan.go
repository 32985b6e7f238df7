package dockerbuild

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"sandstorm/internal/errdefs"
)

// readIgnore is the build context's .dockerignore (nil when it has none).
func readIgnore(root *os.Root) (*patternmatcher.PatternMatcher, error) {
	f, err := root.OpenFile(".dockerignore", os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, ".dockerignore: %w", err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(io.LimitReader(f, 1<<20))
	if err == nil && len(patterns) == 0 {
		return nil, nil
	}
	var pm *patternmatcher.PatternMatcher
	if err == nil {
		pm, err = patternmatcher.New(patterns)
	}
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, ".dockerignore: %w", err)
	}
	return pm, nil
}

// plan is what op copies where: the sources matched in the context (its
// exclusions skipped), each file hashed, in order. Nothing outside the
// context is named: ".." is refused, a symlink is an entry of its own,
// never followed.
func (b *builder) plan(st *stageState, op copyOp, chmod *fs.FileMode) ([]*entry, error) {
	ex := excluder{b.ignore}
	if len(op.excludes) > 0 {
		pm, err := patternmatcher.New(op.excludes)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrBadInput, "--exclude: %w", err)
		}
		ex = append(ex, pm)
	}
	matches, wildcard, err := b.matchSources(op, ex)
	if err != nil {
		return nil, err
	}
	dest := op.dest
	destAbs := dest
	if !path.IsAbs(dest) {
		destAbs = path.Join("/", st.img.Config.WorkingDir, dest)
	}
	destAbs = path.Clean(destAbs)
	dirDest := strings.HasSuffix(dest, "/") || path.Base(dest) == "."
	if (len(matches) > 1 || wildcard) && !dirDest {
		return nil, errdefs.New(errdefs.ErrBadInput, "%s of more than one source needs a directory destination ending in /: %s/", op.name, dest)
	}
	if !dirDest {
		info, err := b.lookup(st.img, destAbs)
		if err != nil {
			return nil, err
		}
		dirDest = info != nil && info.mode.IsDir()
	}
	p := planner{b: b, ex: ex, chmod: chmod, op: op}
	for _, m := range matches {
		if err := p.source(m, destAbs, dirDest); err != nil {
			return nil, err
		}
	}
	return p.entries, nil
}

// matchSources are op's sources in the context: wildcards expanded,
// exclusions skipped.
func (b *builder) matchSources(op copyOp, ex excluder) ([]string, bool, error) {
	var matches []string
	wildcard := false
	for _, src := range op.srcs {
		if isURL(src) {
			return nil, false, errdefs.New(errdefs.ErrBadInput, "%s: a build reads the build context only, never a URL: download it into the context first, or RUN curl in the image", src)
		}
		rel, err := contextPath(src)
		if err != nil {
			return nil, false, err
		}
		if !strings.ContainsAny(rel, `*?[\`) {
			if _, err := b.ctxRoot.Lstat(rel); errors.Is(err, fs.ErrNotExist) {
				return nil, false, errdefs.New(errdefs.ErrBadInput, "%s: not found in the build context", src)
			} else if err != nil {
				// os.Root's refusal of a path that leaves the context
				// through a symlink ("path escapes from parent").
				return nil, false, errdefs.New(errdefs.ErrBadInput, "%s: %w (a symlink on the way leads out of the build context, and is not followed)", src, errors.Unwrap(err))
			}
			if out, err := ex.excluded(rel); out || err != nil {
				return nil, false, errdefs.New(errdefs.ErrBadInput, "%s: excluded from the build context by .dockerignore or --exclude", src)
			}
			matches = append(matches, rel)
			continue
		}
		wildcard = true
		found, err := fs.Glob(b.ctxRoot.FS(), rel)
		if err != nil {
			return nil, false, errdefs.New(errdefs.ErrBadInput, "%s: %w", src, err)
		}
		n := len(matches)
		for _, m := range found {
			if out, err := ex.excluded(m); err != nil {
				return nil, false, err
			} else if !out {
				matches = append(matches, m)
			}
		}
		if len(matches) == n {
			return nil, false, errdefs.New(errdefs.ErrBadInput, "%s: no file in the build context matches", src)
		}
	}
	return matches, wildcard, nil
}

// contextPath is a source as a path relative to the context's root ("/"
// is the root too); a ".." in it is refused outright, wherever it would
// lead.
func contextPath(src string) (string, error) {
	if strings.IndexByte(src, 0) >= 0 || src == "" {
		return "", errdefs.New(errdefs.ErrBadInput, "source %q: not a path", src)
	}
	if slices.Contains(strings.Split(src, "/"), "..") {
		return "", errdefs.New(errdefs.ErrBadInput, "source %s: \"..\" is refused, a build reads inside its context only", src)
	}
	rel := path.Clean("/" + src)[1:]
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

// planner collects one COPY's entries.
type planner struct {
	b       *builder
	ex      excluder
	chmod   *fs.FileMode
	op      copyOp
	entries []*entry
}

// source plans one matched source: a directory's contents go into dest,
// anything else to dest itself, or under it when dest is a directory.
func (p *planner) source(rel, destAbs string, dirDest bool) error {
	fi, err := p.b.ctxRoot.Lstat(rel)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		p.entries = append(p.entries, &entry{Kind: "dest", Src: rel, Dst: relDst(destAbs)})
		return p.walk(rel, destAbs)
	}
	dst := destAbs
	if dirDest {
		dst = path.Join(destAbs, path.Base(rel))
	}
	if dst == "/" {
		return errdefs.New(errdefs.ErrBadInput, "%s: a file cannot be written at /", rel)
	}
	if p.op.name == "ADD" && fi.Mode().IsRegular() && (p.op.unpack == nil || *p.op.unpack) {
		isArchive, err := p.archive(rel)
		if err != nil {
			return err
		}
		if isArchive {
			return p.add(&entry{Kind: "archive", Src: rel, Dst: relDst(destAbs)}, fi)
		}
	}
	return p.add(&entry{Src: rel, Dst: relDst(dst)}, fi)
}

// walk plans a directory's contents, skipping what is excluded (and not
// descending into an excluded directory unless a "!" pattern may take
// something under it back).
func (p *planner) walk(root, destAbs string) error {
	return fs.WalkDir(p.b.ctxRoot.FS(), root, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == root {
			return nil
		}
		out, err := p.ex.excluded(name)
		if err != nil {
			return err
		}
		if out {
			if d.IsDir() && !p.ex.walksExcluded() {
				return fs.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		sub := name
		if root != "." {
			sub = strings.TrimPrefix(name, root+"/")
		}
		return p.add(&entry{Src: name, Dst: relDst(path.Join(destAbs, sub))}, fi)
	})
}

// add plans one file, symlink or directory of the context (its Kind
// unset), or an archive.
func (p *planner) add(e *entry, fi fs.FileInfo) error {
	e.mtime = fi.ModTime()
	e.Mode = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if p.chmod != nil {
		e.Mode = *p.chmod
	}
	var err error
	switch {
	case e.Kind == "archive":
		e.Digest, err = p.hash(e.Src)
	case fi.IsDir():
		e.Kind = "dir"
	case fi.Mode().IsRegular():
		e.Kind = "file"
		e.Digest, err = p.hash(e.Src)
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Kind, e.Mode = "link", 0
		e.Link, err = p.b.ctxRoot.Readlink(e.Src)
	default:
		return errdefs.New(errdefs.ErrBadInput, "%s: a %v cannot be copied; exclude it in .dockerignore", e.Src, fi.Mode().Type())
	}
	if err != nil {
		return err
	}
	p.entries = append(p.entries, e)
	return nil
}

func (p *planner) hash(rel string) (string, error) {
	f, err := openContext(p.b.ctxRoot, rel)
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

// archive reports whether ADD extracts rel: a tar, or a gzipped tar (what
// rootfs.Extract reads). Other compressions are refused rather than
// copied as they are, which Docker would not do.
func (p *planner) archive(rel string) (bool, error) {
	f, err := openContext(p.b.ctxRoot, rel)
	if err != nil {
		return false, err
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(io.MultiReader(bytes.NewReader(head), f))
		if err != nil {
			return false, nil
		}
		inner := make([]byte, 512)
		m, _ := io.ReadFull(zr, inner)
		return isTar(inner[:m]), nil
	case bytes.HasPrefix(head, []byte("BZh")), bytes.HasPrefix(head, []byte("\xfd7zXZ\x00")),
		bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return false, errdefs.New(errdefs.ErrBadInput, "ADD %s: only .tar and .tar.gz archives are extracted; recompress it, or ADD --unpack=false to copy it as it is", rel)
	}
	return isTar(head), nil
}

func isTar(head []byte) bool {
	return len(head) >= 262 && string(head[257:262]) == "ustar"
}

func relDst(abs string) string {
	r := strings.TrimPrefix(path.Clean(abs), "/")
	if r == "" {
		return "."
	}
	return r
}
