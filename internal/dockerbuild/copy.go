package dockerbuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/patternmatcher"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
)

// copyOp is a COPY or an ADD, its words expanded.
type copyOp struct {
	name     string // "COPY" or "ADD"
	srcs     []string
	dest     string
	chown    string
	chmod    string
	excludes []string
	unpack   *bool // ADD: nil extracts local archives, as Docker does
}

// entry is one thing a COPY writes into its layer.
type entry struct {
	Kind   string      `json:"k"` // "dest" (a directory copied into), "dir", "file", "link" or "archive" (extracted into Dst)
	Src    string      `json:"-"` // in the build context
	Dst    string      `json:"d"` // in the image, relative to /
	Mode   fs.FileMode `json:"m"`
	Link   string      `json:"l,omitempty"`
	Digest string      `json:"h,omitempty"` // sha256 of a file's or an archive's bytes
	mtime  time.Time
}

func (b *builder) copyCmd(ctx context.Context, st *stageState, c *instructions.CopyCommand) error {
	switch {
	case c.From != "":
		return errdefs.New(errdefs.ErrBadInput, "COPY --from is not supported yet: build that stage as its own template and build FROM it, or COPY from the build context")
	case c.Parents:
		return errdefs.New(errdefs.ErrBadInput, "COPY --parents is not supported: name each destination")
	case len(c.SourceContents) > 0:
		return errdefs.New(errdefs.ErrBadInput, "COPY of a here-document is not supported: put the file in the build context")
	}
	return b.copyStep(ctx, st, copyOp{name: "COPY", srcs: c.SourcePaths, dest: c.DestPath,
		chown: c.Chown, chmod: c.Chmod, excludes: c.ExcludePatterns})
}

func (b *builder) addCmd(ctx context.Context, st *stageState, c *instructions.AddCommand) error {
	switch {
	case c.Checksum != "":
		return errdefs.New(errdefs.ErrBadInput, "ADD --checksum is for remote URLs, which a build does not fetch: put the file in the build context")
	case c.KeepGitDir != nil:
		return errdefs.New(errdefs.ErrBadInput, "ADD --keep-git-dir is for git sources, which a build does not fetch: clone into the build context")
	case len(c.SourceContents) > 0:
		return errdefs.New(errdefs.ErrBadInput, "ADD of a here-document is not supported: put the file in the build context")
	}
	return b.copyStep(ctx, st, copyOp{name: "ADD", srcs: c.SourcePaths, dest: c.DestPath,
		chown: c.Chown, chmod: c.Chmod, excludes: c.ExcludePatterns, unpack: c.Unpack})
}

// copyStep plans op (what to copy where, each file hashed), keys it by the
// plan, and makes its layer unless the cache has it.
func (b *builder) copyStep(ctx context.Context, st *stageState, op copyOp) error {
	uid, gid, err := b.resolveChown(st.img, op.chown)
	if err != nil {
		return err
	}
	var mode *fs.FileMode
	if op.chmod != "" {
		n, err := strconv.ParseUint(op.chmod, 8, 32)
		if err != nil || n > 0o7777 {
			return errdefs.New(errdefs.ErrBadInput, "--chmod=%s: give an octal mode such as 0755", op.chmod)
		}
		m := octalMode(uint32(n))
		mode = &m
	}
	entries, err := b.plan(st, op, mode)
	if err != nil {
		return err
	}
	key := chainKey(st.key, op.name, entries, uid, gid, op.unpack)
	return b.layerStep(ctx, st, key, func(ctx context.Context) (string, error) {
		return b.writeCopy(ctx, st.img, entries, uid, gid)
	})
}

// octalMode is a Unix mode's permission and special bits as fs.FileMode.
func octalMode(n uint32) fs.FileMode {
	m := fs.FileMode(n & 0o777)
	if n&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// writeCopy makes the layer of a planned COPY or ADD.
func (b *builder) writeCopy(ctx context.Context, img Image, entries []*entry, uid, gid int) (string, error) {
	w, err := b.newLayerWriter(img, uid, gid)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return "", w.abort(err)
		}
		if err := w.ensureDir(path.Dir(e.Dst)); err != nil {
			return "", w.abort(fmt.Errorf("%s: %w", e.Src, err))
		}
		switch e.Kind {
		case "dest":
			err = w.ensureDir(e.Dst)
		case "dir":
			err = w.dirEntry(e)
		case "file":
			err = w.copyFile(e)
		case "link":
			err = w.symlink(e)
		case "archive":
			err = w.extract(e)
		}
		if err != nil {
			return "", w.abort(fmt.Errorf("%s: %w", e.Src, err))
		}
	}
	return w.finish()
}

// extract unpacks a local archive (tar, or tar.gz) into e.Dst with
// rootfs's safe extractor: into a directory of its own first (it wants an
// empty one), then moved into the layer.
func (w *layerWriter) extract(e *entry) error {
	if err := w.ensureDir(e.Dst); err != nil {
		return err
	}
	tmp, err := w.b.opts.Store.TempDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	f, err := openContext(w.b.ctxRoot, e.Src)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	r := io.TeeReader(f, h)
	if _, err := rootfs.Extract(r, tmp, rootfs.Limits{}); err != nil {
		return errdefs.Mark(errdefs.ErrBadInput, err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	if hex.EncodeToString(h.Sum(nil)) != e.Digest {
		return errdefs.New(errdefs.ErrConflict, "%s changed in the build context during the build; build again", e.Src)
	}
	return w.moveInto(tmp, e.Dst)
}

// excluder is what a COPY skips: .dockerignore's patterns and its own
// --exclude ones.
type excluder []*patternmatcher.PatternMatcher

func (x excluder) excluded(rel string) (bool, error) {
	for _, pm := range x {
		if pm == nil {
			continue
		}
		if ok, err := pm.MatchesOrParentMatches(rel); ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}

// walksExcluded reports whether an excluded directory must still be
// walked: a "!" pattern may take something under it back.
func (x excluder) walksExcluded() bool {
	return slices.ContainsFunc(x, func(pm *patternmatcher.PatternMatcher) bool { return pm != nil && pm.Exclusions() })
}

// isURL reports a source that would be fetched, not read from the
// context.
func isURL(src string) bool {
	return strings.Contains(src, "://") || strings.HasPrefix(src, "git@")
}
