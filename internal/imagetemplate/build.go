package imagetemplate

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/dockerbuild"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/execcli"
	"sandstorm/internal/ociimage"
	"sandstorm/internal/rootfs"
)

// Sandboxes is what a build's RUN steps need of the master: a sandbox
// over a rootfs on one of its nodes, with envd as its init and the build
// principal's boundary as its only way out; its envd; what it wrote; its
// end.
type Sandboxes interface {
	// StartBuild starts a sandbox over the rootfs at dir, whose principal
	// is principal, and returns its ID.
	StartBuild(ctx context.Context, dir, principal string) (string, error)
	Envd(id, user string) *client.Envd
	Layer(ctx context.Context, id string, w io.Writer) error
	Remove(ctx context.Context, id string) error
}

// Templates reads a registered template (FROM <template>).
type Templates func(ctx context.Context, name string) (api.Template, error)

// Builder builds templates from Dockerfiles: its FROM images come through
// the Puller's layer store, its RUN steps run in Sandboxes, and every
// layer it makes is kept in the same store.
type Builder struct {
	Puller    *Puller
	Sandboxes Sandboxes
	Templates Templates
	// WorkDir holds each step's flattened rootfs while it runs.
	WorkDir string
	// Principal is the RUN sandboxes' principal: the operator's build
	// policy (what `pip install` may reach) is what it is granted.
	Principal string
	// CacheDir holds the step cache's index ("": no cache).
	CacheDir string
	// Auth, when set, is the only credential FROM images are pulled
	// with (an empty one: anonymously), not the master's Docker config:
	// a team's build does not borrow the operator's registry access.
	Auth *api.RegistryAuth
}

// Build runs the Dockerfile over the context in ctxDir and returns the
// image: its layers' directories, bottom first, and its config.
func (b *Builder) Build(ctx context.Context, dockerfile []byte, ctxDir string, args map[string]string, target string, out io.Writer) (Pulled, error) {
	st := &layerStore{b: b}
	img, err := dockerbuild.Build(ctx, dockerbuild.BuildOptions{
		Dockerfile: dockerfile, ContextDir: ctxDir, BuildArgs: args, Target: target, CacheDir: b.CacheDir,
		Base: base{b}, Runner: runner{b}, Store: st, Out: out,
	})
	if err != nil {
		return Pulled{}, err
	}
	dirs := make([]string, len(img.Layers))
	for i, id := range img.Layers {
		if dirs[i], err = st.Dir(id); err != nil {
			return Pulled{}, err
		}
	}
	c := img.Config
	return Pulled{Layers: dirs, Config: ociimage.ImageConfig{
		Args: append(slices.Clone(c.Entrypoint), c.Cmd...), Entrypoint: c.Entrypoint, Cmd: c.Cmd,
		Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Ports: c.ExposedPorts,
	}}, nil
}

// templatePrefix names a registered template used as a layer (FROM
// <template>): "template:<name>@<digest>", so a template registered again
// under the name is another layer and misses the cache.
const templatePrefix = "template:"

// base resolves FROM: a registered template first, else an image.
type base struct{ b *Builder }

func (f base) From(ctx context.Context, name string) (dockerbuild.Image, error) {
	if api.ValidName(name) && f.b.Templates != nil {
		if t, err := f.b.Templates(ctx, name); err == nil {
			return dockerbuild.Image{Layers: []string{templatePrefix + t.Name + "@" + t.Digest}, Config: dockerbuild.ImageConfig{
				Cmd: t.Process.Args, Env: t.Process.Env, WorkingDir: t.Process.Cwd, User: t.Process.User, ExposedPorts: t.Ports,
			}}, nil
		}
	}
	p, err := f.b.Puller.Pull(ctx, api.ImageSource{Ref: name, Auth: f.b.Auth}, nil)
	if err != nil {
		return dockerbuild.Image{}, err
	}
	ids := make([]string, len(p.Layers))
	for i, d := range p.Layers {
		ids[i] = filepath.Base(d)
	}
	c := p.Config
	return dockerbuild.Image{Layers: ids, Config: dockerbuild.ImageConfig{
		Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, ExposedPorts: c.Ports,
	}}, nil
}

// layerStore is the Puller's layer store as a build sees it: a layer's
// id is its directory's name there (a pulled one's diffID, a built one's
// tree digest), or a template's rootfs.
type layerStore struct{ b *Builder }

// TempDir is a new directory in the store, made first if need be: a
// build from a registered template pulls nothing, and only a pull made
// the store before (a fresh data dir's first RUN failed on it).
func (s *layerStore) TempDir() (string, error) {
	if err := os.MkdirAll(s.b.Puller.Layers.Dir, 0o700); err != nil {
		return "", fmt.Errorf("layer store: %w", err)
	}
	return os.MkdirTemp(s.b.Puller.Layers.Dir, ".build-")
}

// Add keeps dir under the digest of its tree (rootfs.PackVolume's tar): a
// layer made twice is kept once.
func (s *layerStore) Add(ctx context.Context, dir string) (string, error) {
	h := sha256.New()
	tw := tar.NewWriter(h)
	if _, err := rootfs.PackVolume(dir, tw, ""); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	id := "sha256-" + hex.EncodeToString(h.Sum(nil))
	dst := filepath.Join(s.b.Puller.Layers.Dir, id)
	if _, err := os.Lstat(dst); err == nil {
		return id, os.RemoveAll(dir)
	}
	return id, os.Rename(dir, dst)
}

func (s *layerStore) Dir(id string) (string, error) {
	if rest, ok := strings.CutPrefix(id, templatePrefix); ok {
		name, digest, _ := strings.Cut(rest, "@")
		t, err := s.b.Templates(context.Background(), name)
		if err != nil || t.Digest != digest {
			return "", errdefs.New(errdefs.ErrNotFound, "template %s is not the one built from (registered again?)", name)
		}
		return t.Rootfs, nil
	}
	if id == "" || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return "", errdefs.New(errdefs.ErrNotFound, "layer %q: not a layer name", id)
	}
	d := filepath.Join(s.b.Puller.Layers.Dir, id)
	if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
		return "", errdefs.New(errdefs.ErrNotFound, "layer %s is no longer in the store", id)
	}
	return d, nil
}

// runner runs a RUN step in a sandbox over the image so far.
type runner struct{ b *Builder }

func (r runner) Run(ctx context.Context, img dockerbuild.Image, step dockerbuild.RunStep, out io.Writer) (string, error) {
	st := &layerStore{b: r.b}
	work, err := os.MkdirTemp(r.b.WorkDir, "run-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "rootfs")
	if err := flattenImage(st, img.Layers, root); err != nil {
		return "", err
	}
	user, err := numericUser(root, step.User)
	if err != nil {
		return "", err
	}
	id, err := r.b.Sandboxes.StartBuild(ctx, root, r.b.Principal)
	if err != nil {
		return "", err
	}
	defer r.b.Sandboxes.Remove(context.WithoutCancel(ctx), id)
	env := map[string]string{}
	for _, kv := range step.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	code, err := execcli.Run(ctx, r.b.Sandboxes.Envd(id, user), execcli.Options{Cmd: step.Args[0], Args: step.Args[1:], Env: env, Cwd: step.Workdir}, out, out)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", errdefs.New(errdefs.ErrBadInput, "exit status %d", code)
	}
	return r.layer(ctx, st, id, root)
}

// layer is what sandbox id wrote, as a new directory of the store, less
// what its node put there (stepFiles); its root's mode and owner are the
// image's root's.
func (r runner) layer(ctx context.Context, st *layerStore, id, root string) (string, error) {
	dir, err := st.TempDir()
	if err != nil {
		return "", err
	}
	t, err := rootfs.NewTree(dir, rootfs.Limits{})
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(r.b.Sandboxes.Layer(ctx, id, pw)) }()
	err = addEntries(t, tar.NewReader(pr))
	pr.CloseWithError(io.ErrClosedPipe)
	if err == nil {
		_, err = t.Finish()
	} else {
		t.Abort()
	}
	if err == nil {
		err = sameRoot(root, dir)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// addEntries adds every entry of tr to t but the node's own.
func addEntries(t *rootfs.Tree, tr *tar.Reader) error {
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if nodeFile(hdr.Name) {
			continue
		}
		if err := t.Add(hdr, tr); err != nil {
			return err
		}
	}
}

// nodeFile reports whether name is the node's in a sandbox's upper layer,
// not the step's: the resolver file it writes and the mount points of the
// sandbox's spec (internal/node/layout, gvisor.Mounts), made by runsc.
// Docker keeps them out of a RUN's layer alike.
func nodeFile(name string) bool {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	top, _, _ := strings.Cut(name, "/")
	switch top {
	case "proc", "dev", "sys", "tmp", ".sandstorm":
		return true
	}
	return name == "etc/resolv.conf"
}

// sameRoot gives the layer's root directory the mode and owner of root.
func sameRoot(root, dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return err
	}
	if err := os.Chmod(dir, os.FileMode(st.Mode&0o7777)); err != nil {
		return err
	}
	return os.Lchown(dir, int(st.Uid), int(st.Gid))
}

// flattenImage makes dst the image of layers (ids of st).
func flattenImage(st *layerStore, layers []string, dst string) error {
	dirs := make([]string, len(layers))
	for i, id := range layers {
		d, err := st.Dir(id)
		if err != nil {
			return err
		}
		dirs[i] = d
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	return rootfs.Flatten(dirs, dst)
}

// numericUser is USER as "UID:GID" from the image's own files ("" stays
// root): envd inside the sandbox takes numbers even where the image has
// no /etc/passwd.
func numericUser(root, user string) (string, error) {
	if user == "" {
		return "", nil
	}
	uid, gid, _, err := ociimage.LookupUser(root, user)
	if err != nil {
		return "", errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("USER %s: %w", user, err))
	}
	return strconv.FormatUint(uint64(uid), 10) + ":" + strconv.FormatUint(uint64(gid), 10), nil
}
