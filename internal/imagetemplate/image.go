// Package imagetemplate makes templates from what people already have
// (issue 32): an OCI image, pulled into the master's layer store and
// flattened into the template's rootfs, with the image's config filling
// in what the template request leaves unsaid; and Dockerfile builds
// whose RUN steps run in sandboxes of a node (build.go).
package imagetemplate

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/ociimage"
	"sandstorm/internal/rootfs"
)

// Puller pulls images into a layer store and makes templates' rootfs of
// them.
type Puller struct {
	// Layers keeps every unpacked layer once, by diffID.
	Layers *ociimage.Store
	// Limits bound each pull (zero: ociimage's defaults).
	Limits ociimage.Limits
	// Transport carries registry requests (nil: the default).
	Transport http.RoundTripper
	Log       *slog.Logger
}

// Pulled is an image in the layer store: its layers bottom first, its
// config, and its reference pinned by digest.
type Pulled struct {
	Layers []string
	Config ociimage.ImageConfig
	// Pinned is "ref@sha256:…" (a registry's) or "oci:DIR@sha256:…".
	Pinned string
}

// Pull resolves src and puts its layers in the store. auth, when set, is
// the only credential used (the registry of src's reference gets it);
// without it the master's own Docker config is read.
func (p *Puller) Pull(ctx context.Context, src api.ImageSource, progress func(ociimage.Progress)) (Pulled, error) {
	s, err := ociimage.ParseSource(src.Ref)
	if err != nil {
		return Pulled{}, err
	}
	kc, err := keychain(s, src.Auth)
	if err != nil {
		return Pulled{}, err
	}
	img, digest, err := ociimage.Resolve(ctx, s, ociimage.ResolveOptions{Keychain: kc, MaxLayers: p.Limits.MaxLayers, Transport: p.Transport})
	if err != nil {
		return Pulled{}, err
	}
	layers, err := p.Layers.Pull(ctx, img, p.Limits, progress)
	if err != nil {
		return Pulled{}, err
	}
	cfg, err := ociimage.Config(img)
	if err != nil {
		return Pulled{}, err
	}
	return Pulled{Layers: layers, Config: cfg, Pinned: pinned(s, digest)}, nil
}

// pinned names what was pulled so that it can be pulled again exactly.
func pinned(s ociimage.Source, digest string) string {
	name := s.String()
	if i := strings.LastIndex(name, "@"); i > 0 {
		name = name[:i]
	}
	return name + "@" + digest
}

// keychain is auth for src's registry alone, or the master's Docker config.
func keychain(s ociimage.Source, auth *api.RegistryAuth) (authn.Keychain, error) {
	if auth == nil {
		return ociimage.Keychain("")
	}
	if s.Kind != ociimage.Registry {
		return nil, errdefs.New(errdefs.ErrBadInput, "image %s: registry credentials go with a registry reference, not a local image", s)
	}
	if *auth == (api.RegistryAuth{}) {
		return anonymous{}, nil
	}
	return oneRegistry{reg: s.Ref.Context().RegistryStr(), auth: authn.FromConfig(authn.AuthConfig{Username: auth.Username, Password: auth.Password})}, nil
}

// anonymous asks every registry without a credential.
type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

// oneRegistry gives its credential to its registry only: a redirect or a
// blob served from elsewhere is asked anonymously.
type oneRegistry struct {
	reg  string
	auth authn.Authenticator
}

func (k oneRegistry) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if r.RegistryStr() == k.reg {
		return k.auth, nil
	}
	return authn.Anonymous, nil
}

// Unpack flattens pulled's layers into dst, which must not exist: it is
// made beside it under a temporary name and renamed into place whole, so
// a failure leaves nothing.
func (p *Puller) Unpack(layers []string, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-")
	if err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := rootfs.Flatten(layers, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// Fill completes req from the image's config where req leaves it empty,
// as `docker run` does: the process (Entrypoint + Cmd, or req's args
// after the Entrypoint when given), the environment (req's entries add
// to or replace the image's by key), the working directory, the user
// (resolved against the image's own /etc/passwd, never the host's) and
// the ports (ExposedPorts, TCP only). The rootfs at dir is the image's.
func Fill(req *api.TemplateRequest, cfg ociimage.ImageConfig, dir string) error {
	if len(req.Process.Args) == 0 {
		req.Process.Args = slices.Clone(cfg.Args)
	}
	if len(req.Process.Args) == 0 {
		return errdefs.New(errdefs.ErrBadInput, "template %q: the image has no Entrypoint or Cmd; say what to run after -- (e.g. -- /bin/sh -c 'sleep infinity')", req.Name)
	}
	req.Process.Env = mergeEnv(cfg.Env, req.Process.Env)
	if !strings.HasPrefix(req.Process.Args[0], "/") {
		exe, err := ociimage.ResolveExecutable(dir, req.Process.Args[0], envValue(req.Process.Env, "PATH"))
		if err != nil {
			return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("template %q: %w", req.Name, err))
		}
		req.Process.Args[0] = exe
	}
	if req.Process.Cwd == "" {
		req.Process.Cwd = cfg.WorkingDir
	}
	user := req.Process.User
	if user == "" {
		user = cfg.User
	}
	if user != "" {
		uid, gid, _, err := ociimage.LookupUser(dir, user)
		if err != nil {
			return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("template %q: user %q: %w", req.Name, user, err))
		}
		req.Process.User = strconv.FormatUint(uint64(uid), 10) + ":" + strconv.FormatUint(uint64(gid), 10)
	}
	if len(req.Ports) == 0 {
		req.Ports = slices.Clone(cfg.Ports)
	}
	return nil
}

// mergeEnv is base with over's entries replacing base's of the same key,
// in base's order, then over's new keys.
func mergeEnv(base, over []string) []string {
	out := slices.Clone(base)
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		i := slices.IndexFunc(out, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		if i >= 0 {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}

// envValue is key's value in env ("" if absent).
func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}
