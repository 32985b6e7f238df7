package templates

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/client"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/imagetemplate"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
)

// DefaultBuildPrincipal is the principal of a build's RUN sandboxes
// unless the master is told another: the operator's policy grants it
// what a build may reach (a package mirror), and nothing else is.
const DefaultBuildPrincipal = "sandstorm-build"

// Build runs a Dockerfile build over the context in ctxDir, its
// progress and its steps' output to out, and registers the result as
// req.Template. Nothing of a failed build is registered.
func (s *Service) Build(ctx context.Context, req api.BuildRequest, ctxDir string, out io.Writer) (store.Template, error) {
	return s.BuildWith(ctx, req, ctxDir, out, BuildOptions{})
}

// BuildOptions are what a build asks beyond its request: whose template
// it makes, and whether its steps may come from the cache.
type BuildOptions struct {
	// Team owns the template made ("": the operator's). A team's build
	// pulls its FROM images anonymously, never with the master's own
	// registry credentials.
	Team string
	// NoCache runs every step again (E2B's skipCache and force).
	NoCache bool
}

// BuildWith is Build for opts.Team, with or without the step cache.
func (s *Service) BuildWith(ctx context.Context, req api.BuildRequest, ctxDir string, out io.Writer, opts BuildOptions) (store.Template, error) {
	b := s.builder()
	if opts.NoCache {
		b.CacheDir = ""
	}
	if opts.Team != "" {
		b.Auth = &api.RegistryAuth{}
		p := *s.Images
		p.Transport = newTeamTransport(p.Transport, s.Mirrors, s.Guard)
		b.Puller = &p
	}
	pulled, err := b.Build(ctx, []byte(req.Dockerfile), ctxDir, req.BuildArgs, req.Target, out)
	if err != nil {
		return store.Template{}, err
	}
	base := filepath.Join(s.DataDir, "templates", req.Template.Name)
	dir := filepath.Join(base, "rootfs")
	if err := s.Images.Unpack(pulled.Layers, dir); err != nil {
		return store.Template{}, err
	}
	t, err := imageTemplate(req.Template, pulled, dir)
	if err != nil {
		os.RemoveAll(base)
		return store.Template{}, err
	}
	t.Layers = s.layerDigests(t.Name, pulled.Layers)
	t.Team = opts.Team
	fmt.Fprintf(out, "registering template %s…\n", t.Name)
	return s.Register(ctx, t)
}

// BuildDir is where builds work (their contexts, their steps' rootfs).
func (s *Service) BuildDir() string {
	d := filepath.Join(s.DataDir, "builds")
	os.MkdirAll(d, 0o700)
	return d
}

// builder is the master's Builder: layers in its store, RUN steps in
// sandboxes of its fleet.
func (s *Service) builder() *imagetemplate.Builder {
	principal := s.BuildPrincipal
	if principal == "" {
		principal = DefaultBuildPrincipal
	}
	return &imagetemplate.Builder{
		Puller:    s.Images,
		Sandboxes: buildSandboxes{s},
		Templates: func(ctx context.Context, name string) (api.Template, error) {
			t, err := s.Store.GetTemplate(ctx, name)
			return api.Template{Name: t.Name, Rootfs: t.Rootfs, Digest: t.Digest, Process: t.Process, Ports: t.Ports}, err
		},
		WorkDir:   s.BuildDir(),
		Principal: principal,
		CacheDir:  filepath.Join(s.DataDir, "build-cache"),
	}
}

// buildSandboxes are a build's RUN sandboxes: each over a template of its
// own (named build-<random>, removed with the sandbox), envd its init,
// placed by the fleet like any other.
type buildSandboxes struct{ s *Service }

func (b buildSandboxes) StartBuild(ctx context.Context, dir, principal string) (string, error) {
	var rnd [6]byte
	rand.Read(rnd[:])
	name := "build-" + hex.EncodeToString(rnd[:])
	t, err := b.s.Register(ctx, store.Template{Name: name, Rootfs: dir, Principal: principal, Process: api.Process{Envd: &api.Envd{}}})
	if err != nil {
		return "", err
	}
	sb, _, err := b.s.Sandboxes.Create(asOperator(ctx), sandboxes.CreateRequest{Template: t.Name, Principal: principal})
	if err != nil {
		b.dropTemplate(name)
		return "", err
	}
	return sb.ID, nil
}

// Envd is the sandbox's envd, reached through its node in this process
// (client.InProcess), acting as user.
func (b buildSandboxes) Envd(id, user string) *client.Envd {
	prefix := "/v1/sandboxes/" + id + "/envd"
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, sb, _, err := b.s.Sandboxes.Find(asOperator(r.Context()), id)
		if err != nil {
			errdefs.WriteHTTP(w, err)
			return
		}
		r.Header.Del("Authorization")
		if u := r.Header.Get(client.EnvdUserHeader); u != "" {
			// envd's own way of naming a call's user (internal/envd).
			r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u+":")))
			r.Header.Del(client.EnvdUserHeader)
		}
		if err := n.ServeEnvd(w, r, sb.ID, strings.TrimPrefix(r.URL.Path, prefix)); err != nil {
			errdefs.WriteHTTP(w, err)
		}
	})
	return client.InProcess(h, "").Envd(id, user)
}

func (b buildSandboxes) Layer(ctx context.Context, id string, w io.Writer) error {
	n, sb, _, err := b.s.Sandboxes.Find(asOperator(ctx), id)
	if err != nil {
		return err
	}
	return n.Layer(ctx, sb.ID, w)
}

// Remove deletes the sandbox and its step's template.
func (b buildSandboxes) Remove(ctx context.Context, id string) error {
	n, sb, _, err := b.s.Sandboxes.Find(asOperator(ctx), id)
	if err != nil {
		return err
	}
	if err := b.s.Fleet.Delete(ctx, n, sb); err != nil {
		return err
	}
	b.dropTemplate(sb.Template)
	return nil
}

func (b buildSandboxes) dropTemplate(name string) {
	ctx := context.Background()
	if err := b.s.Store.DeleteTemplate(ctx, name); err == nil {
		b.s.Fleet.DropTemplate(ctx, name)
	}
}

// asOperator is ctx acting as the operator: a build's step sandboxes are
// the master's own, whoever asked for the build (a team through /e2b
// may not name a principal, and its sandbox list does not show them).
func asOperator(ctx context.Context) context.Context {
	return apikey.With(ctx, apikey.Caller{Operator: true})
}
