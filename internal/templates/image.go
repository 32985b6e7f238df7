package templates

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/imagetemplate"
	"sandstorm/internal/layercache"
	"sandstorm/internal/ociimage"
	"sandstorm/internal/store"
)

// imagePullDeadline bounds a template's pull from a registry: every
// request to a registry has a deadline, and a registry that trickles a
// blob does not hold the master's request forever.
const imagePullDeadline = 30 * time.Minute

// FromImage pulls req.Image into the layer store, flattens it into the
// template's own directory and fills the process from the image's
// config; the caller registers the result. On error nothing of the
// template is kept (the layers that arrived whole stay in the store for
// the next pull).
func (s *Service) FromImage(ctx context.Context, req api.TemplateRequest, out io.Writer) (store.Template, error) {
	if out == nil {
		out = io.Discard
	}
	switch {
	case s.Images == nil:
		return store.Template{}, errdefs.New(errdefs.ErrNotSupported, "this master makes no templates from images (it has no layer store)")
	case req.RootfsDir != "":
		return store.Template{}, badRequest("template %q: rootfs_dir and image exclude each other", req.Name)
	case strings.TrimSpace(req.Image.Ref) == "":
		return store.Template{}, badRequest("template %q: image.ref is empty: give a registry reference (host/repo:tag), oci:DIR or docker-archive:FILE", req.Name)
	case !api.ValidName(req.Name):
		return store.Template{}, badRequest("template name %q: use 1-63 of a-z, 0-9 and '-'", req.Name)
	}
	if _, err := s.Store.GetTemplate(ctx, req.Name); err == nil {
		return store.Template{}, errdefs.New(errdefs.ErrExists, "template %q: already exists", req.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, imagePullDeadline)
	defer cancel()
	start := time.Now()
	fmt.Fprintf(out, "pulling %s…\n", req.Image.Ref)
	pulled, err := s.Images.Pull(ctx, *req.Image, func(p ociimage.Progress) {
		if p.Done {
			s.Log.Info("image layer ready", "template", req.Name, "layer", p.Layer+1, "of", p.Layers, "diff_id", p.DiffID, "cached", p.Cached)
			fmt.Fprintln(out, layerLine(p))
		}
	})
	if err != nil {
		return store.Template{}, err
	}
	fmt.Fprintf(out, "unpacking %d layer(s) into template %s…\n", len(pulled.Layers), req.Name)
	base := filepath.Join(s.DataDir, "templates", req.Name)
	dir := filepath.Join(base, "rootfs")
	if err := s.Images.Unpack(pulled.Layers, dir); err != nil {
		return store.Template{}, err
	}
	t, err := imageTemplate(req, pulled, dir)
	if err != nil {
		os.RemoveAll(base)
		return store.Template{}, err
	}
	t.Layers = s.layerDigests(t.Name, pulled.Layers)
	s.Log.Info("image unpacked", "template", req.Name, "image", pulled.Pinned, "layers", len(pulled.Layers), "ms", time.Since(start).Milliseconds())
	return t, nil
}

// imageTemplate is the template of req over the image unpacked at dir.
func imageTemplate(req api.TemplateRequest, pulled imagetemplate.Pulled, dir string) (store.Template, error) {
	if err := imagetemplate.Fill(&req, pulled.Config, dir); err != nil {
		return store.Template{}, err
	}
	if err := Validate(req); err != nil {
		return store.Template{}, err
	}
	if err := CheckRootfs(dir, req.Process.Args); err != nil {
		return store.Template{}, err
	}
	return store.Template{Name: req.Name, Rootfs: dir, Owned: true, Image: pulled.Pinned, Process: req.Process, Ports: req.Ports, MemoryMiB: req.MemoryMiB, Principal: req.Principal, Warm: req.Warm, Serves: req.Serves}, nil
}

// layerDigests names each of a template's layers (directories of the
// layer store, bottom first) by its tree digest, for nodes to fetch the
// ones they lack (layercache.Index: each layer is packed once). A layer
// outside the store (a build FROM a registered template uses its tree)
// or one that cannot be read leaves the template with none: its tree
// then goes to nodes whole, as a directory's does.
func (s *Service) layerDigests(name string, dirs []string) []string {
	idx := layercache.Index{Dir: s.Images.Layers.Dir}
	out := make([]string, 0, len(dirs))
	for _, d := range dirs {
		ld, err := idx.Digest(d)
		if err != nil {
			s.Log.Warn("template: a layer has no digest; nodes get its tree whole", "template", name, "layer", d, "err", err)
			return nil
		}
		out = append(out, ld)
	}
	return out
}

// validUser is a process.user a node can take: "UID:GID" in numbers.
func validUser(u string) bool {
	us, gs, ok := strings.Cut(u, ":")
	_, uerr := strconv.ParseUint(us, 10, 32)
	_, gerr := strconv.ParseUint(gs, 10, 32)
	return ok && uerr == nil && gerr == nil
}

// layerLine is a pulled layer as the user sees its progress.
func layerLine(p ociimage.Progress) string {
	id := p.DiffID
	if len(id) > len("sha256:")+12 {
		id = id[:len("sha256:")+12]
	}
	switch {
	case p.Cached:
		return fmt.Sprintf("layer %d/%d %s: already here", p.Layer+1, p.Layers, id)
	case p.Size >= 0:
		return fmt.Sprintf("layer %d/%d %s: pulled, %.1f MiB", p.Layer+1, p.Layers, id, float64(p.Size)/(1<<20))
	}
	return fmt.Sprintf("layer %d/%d %s: pulled", p.Layer+1, p.Layers, id)
}
