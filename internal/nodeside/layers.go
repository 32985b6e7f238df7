package nodeside

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/store"
)

// A template made from an image reaches a node with its own templates
// layer by layer (issue 32): the node keeps the layers it was sent in
// Layers, by tree digest, and makes a template's tree by flattening
// them, so a second template of a base image it has costs the master
// only the layers that are new.

// Layers implements nodeapi.Node. The node in the master's process
// reads the master's trees where they are: it lacks nothing.
func (l *Side) Layers(ctx context.Context, digests []string) ([]string, error) {
	if !l.OwnTemplates {
		return []string{}, nil
	}
	if l.LayerCache.Dir == "" {
		return nil, errdefs.New(errdefs.ErrNotSupported, "node %s keeps no image layers: send the template's tree whole", l.N.Name())
	}
	return l.LayerCache.Missing(digests)
}

// PutLayer implements nodeapi.Node: the layer goes into the node's cache
// if its stream hashes to digest (layercache.Cache.Put, which also
// refuses what could escape the layer).
func (l *Side) PutLayer(ctx context.Context, digest string, tar io.Reader) error {
	if !l.OwnTemplates {
		return nil
	}
	if l.LayerCache.Dir == "" {
		return errdefs.New(errdefs.ErrNotSupported, "node %s keeps no image layers: send the template's tree whole", l.N.Name())
	}
	if _, ok := l.LayerCache.Path(digest); ok {
		return nil
	}
	start := time.Now()
	cr := &countReader{r: tar}
	if err := l.LayerCache.Put(digest, cr, rootfs.Limits{}); err != nil {
		if errors.Is(err, rootfs.ErrDigestMismatch) || errors.Is(err, rootfs.ErrUnsafe) || errors.Is(err, rootfs.ErrTooLarge) {
			return errdefs.Mark(errdefs.ErrBadInput, err)
		}
		return err
	}
	l.log().Info("image layer received", "digest", digest, "bytes", cr.n, "ms", time.Since(start).Milliseconds())
	return nil
}

// tree is where the rootfs of t is on the node: in the tree cache, or
// flattened there from t's layers if the node has them all. Without
// them, or if they do not make t.Digest, it answers
// errdefs.ErrPrecondition: the master sends what is missing, or the tree.
func (l *Side) tree(t api.Template) (string, error) {
	if dir, ok := l.Rootfs.Path(t.Digest); ok {
		return dir, nil
	}
	if len(t.Layers) == 0 || l.LayerCache.Dir == "" {
		return "", errdefs.Mark(errdefs.ErrPrecondition, fmt.Errorf("template %s: node %s has no rootfs %s yet", t.Name, l.N.Name(), t.Digest))
	}
	missing, err := l.LayerCache.Missing(t.Layers)
	if err != nil {
		return "", err
	}
	if len(missing) > 0 {
		return "", errdefs.Mark(errdefs.ErrPrecondition, fmt.Errorf("template %s: node %s has no rootfs %s yet, and %d of its %d layers", t.Name, l.N.Name(), t.Digest, len(missing), len(t.Layers)))
	}
	start := time.Now()
	dir, err := l.LayerCache.Flatten(t.Layers, t.Digest, l.Rootfs)
	if err != nil {
		// Not the template's layers (or they could not be flattened
		// here): the master can still send the tree itself. %v, not %w:
		// the kind is this one alone, whatever err's was (a digest
		// mismatch is bad input; here it means: send the tree).
		return "", errdefs.Mark(errdefs.ErrPrecondition, fmt.Errorf("template %s: node %s could not make its rootfs from its layers (send the tree whole): %v", t.Name, l.N.Name(), err))
	}
	l.log().Info("template rootfs made from its layers", "template", t.Name, "digest", t.Digest, "layers", len(t.Layers), "ms", time.Since(start).Milliseconds())
	return dir, nil
}

// dropLayers removes those of layers (a dropped template's) that no
// template left (ts) uses. A layer sent for a template not yet recorded
// may go too: that template's tree is then sent whole.
func (l *Side) dropLayers(layers []string, ts []store.Template) {
	if l.LayerCache.Dir == "" {
		return
	}
	for _, d := range layers {
		if !slices.ContainsFunc(ts, func(o store.Template) bool { return slices.Contains(o.Layers, d) }) {
			if err := l.LayerCache.Remove(d); err != nil {
				l.log().Warn("an image layer no template uses was not removed", "digest", d, "err", err)
			}
		}
	}
}

func (l *Side) log() *slog.Logger {
	if l.Log != nil {
		return l.Log
	}
	return slog.Default()
}

// countReader counts what is read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
