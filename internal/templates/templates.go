// Package templates is the template service /v1 and /e2b share: a
// template registered from a directory, an upload, an image or a
// Dockerfile build (each readied on every node before it is listed), what
// every template must be (Validate), and whose it is (an operator's is
// everyone's; a team's is its own, and another team's is not found).
package templates

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet"
	"sandstorm/internal/imagetemplate"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
)

// Service registers templates.
type Service struct {
	Store     *store.Store
	Fleet     *fleet.Fleet
	Sandboxes *sandboxes.Service
	// DataDir holds templates' rootfs (templates/<name>), image layers
	// (layers/), builds' work (builds/) and their step cache.
	DataDir string
	// Images pulls images (nil: no templates from images or builds).
	Images *imagetemplate.Puller
	// BuildPrincipal is the principal of a build's RUN sandboxes
	// ("": DefaultBuildPrincipal).
	BuildPrincipal string
	// Mirrors maps a registry (as an image reference names it;
	// "docker.io" for Docker Hub) to the host[:port] that serves its
	// images instead, for the images E2B's template builds name (Mirror).
	Mirrors map[string]string
	// Guard judges the addresses a team's pulls dial (pulls.go; nil:
	// the kernel's routes, dialguard.Guard).
	Guard dialguard.Checker
	Log   *slog.Logger
}

func badRequest(format string, args ...any) error {
	return errdefs.New(errdefs.ErrBadInput, format, args...)
}

// Register records t, whose rootfs is in place, and readies it on every
// node; on error nothing of it is kept (an owned rootfs is removed).
func (s *Service) Register(ctx context.Context, t store.Template) (store.Template, error) {
	drop := func() {
		if t.Owned {
			os.RemoveAll(filepath.Dir(t.Rootfs))
		}
	}
	var err error
	// Its name across the fleet: nodes fetch and check the tree by it.
	if t.Digest, err = rootfs.Digest(t.Rootfs); err != nil {
		drop()
		return t, badRequest("rootfs %s: %v", t.Rootfs, err)
	}
	if err := s.Store.PutTemplate(ctx, t); err != nil {
		drop()
		return t, err
	}
	t, _ = s.Store.GetTemplate(ctx, t.Name)
	// Every node gets it (a paired node records it; a warm template's
	// image is made on each): a template no node can take — a warm one
	// whose probe never answers — is not registered at all.
	start := time.Now()
	if err := s.Fleet.PrepareTemplate(ctx, t); err != nil {
		s.Store.DeleteTemplate(context.Background(), t.Name)
		drop()
		what := "template"
		if t.Warm != nil {
			what = "warm template"
		}
		return t, fmt.Errorf("%s %q not registered: %w", what, t.Name, err)
	}
	if t.Warm != nil {
		s.Log.Info("warm image made", "template", t.Name, "ms", time.Since(start).Milliseconds())
	}
	s.Log.Info("template registered", "name", t.Name, "rootfs", t.Rootfs, "digest", t.Digest, "image", t.Image)
	return t, nil
}

// Validate checks the fields every template needs.
func Validate(req api.TemplateRequest) error {
	if !api.ValidName(req.Name) {
		return badRequest("template name %q: use 1-63 of a-z, 0-9 and '-'", req.Name)
	}
	if len(req.Process.Args) == 0 || req.Process.Args[0] == "" {
		return badRequest("template %q: process.args is empty: say what to run, e.g. [\"/usr/bin/python3\", \"/srv/app.py\"]", req.Name)
	}
	if !strings.HasPrefix(req.Process.Args[0], "/") {
		return badRequest("template %q: process.args[0] %q must be an absolute path inside the rootfs", req.Name, req.Process.Args[0])
	}
	if req.Process.User != "" && !validUser(req.Process.User) {
		return badRequest("template %q: process.user %q: give UID:GID in numbers (a name is resolved only for an image's template)", req.Name, req.Process.User)
	}
	for _, e := range req.Process.Env {
		if !strings.Contains(e, "=") {
			return badRequest("template %q: env entry %q is not KEY=VALUE", req.Name, e)
		}
	}
	seen := map[int]bool{}
	for _, p := range req.Ports {
		if p < 1 || p > 65535 {
			return badRequest("template %q: port %d outside 1-65535", req.Name, p)
		}
		if seen[p] {
			return badRequest("template %q: port %d listed twice", req.Name, p)
		}
		seen[p] = true
	}
	if req.Principal != "" && !api.ValidPrincipal(req.Principal) {
		return badRequest("template %q: principal %q: use 1-128 of a-z, A-Z, 0-9 and '._-'", req.Name, req.Principal)
	}
	if req.MemoryMiB < 0 {
		return badRequest("template %q: memory_mib %d is negative", req.Name, req.MemoryMiB)
	}
	if err := api.ValidServes(req.Serves, seen); err != nil {
		return badRequest("template %q: %v", req.Name, err)
	}
	if req.Warm != nil {
		return validateWarm(req)
	}
	return nil
}

// validateWarm checks a warm template's probe and reseed. A reseed is
// required: without one, every sandbox from the image would draw the same
// "random" numbers.
func validateWarm(req api.TemplateRequest) error {
	w := req.Warm
	if len(w.Probe.Command) > 0 {
		if !strings.HasPrefix(w.Probe.Command[0], "/") || w.Probe.Port != 0 || w.Probe.Path != "" {
			return badRequest("template %q: warm.probe.command must start with an absolute path, and excludes port and http_path", req.Name)
		}
	} else if w.Probe.Port == 0 && len(req.Ports) == 0 {
		return badRequest("template %q: warm.probe.port is not set and the template has no ports: say what to probe", req.Name)
	}
	if w.Probe.Port < 0 || w.Probe.Port > 65535 {
		return badRequest("template %q: warm.probe.port %d outside 1-65535", req.Name, w.Probe.Port)
	}
	if w.Pool < 0 || w.Pool > api.MaxWarmPool {
		return badRequest("template %q: warm.pool %d outside 0-%d", req.Name, w.Pool, api.MaxWarmPool)
	}
	if w.Probe.Path != "" && !strings.HasPrefix(w.Probe.Path, "/") {
		return badRequest("template %q: warm.probe.http_path %q must start with /", req.Name, w.Probe.Path)
	}
	switch {
	case w.Reseed.Signal == "" && len(w.Reseed.Command) == 0:
		return badRequest("template %q: a warm template must say how to reseed its sandboxes (warm.reseed.signal, e.g. \"SIGUSR1\", or warm.reseed.command): each starts from the same memory, random state included", req.Name)
	case w.Reseed.Signal != "" && len(w.Reseed.Command) > 0:
		return badRequest("template %q: warm.reseed: give signal or command, not both", req.Name)
	case w.Reseed.Signal != "":
		if _, ok := api.ReseedSignal(w.Reseed.Signal); !ok {
			return badRequest("template %q: warm.reseed.signal %q: use one of %s", req.Name, w.Reseed.Signal, strings.Join(api.ReseedSignals(), ", "))
		}
	case !strings.HasPrefix(w.Reseed.Command[0], "/"):
		return badRequest("template %q: warm.reseed.command[0] %q must be an absolute path inside the rootfs", req.Name, w.Reseed.Command[0])
	}
	return nil
}

// CheckRootfs checks that dir is a directory holding the process to run.
func CheckRootfs(dir string, args []string) error {
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return badRequest("rootfs_dir %q is not a directory on this node", dir)
	}
	// Lstat: args[0] may be a symlink that only resolves inside the
	// sandbox (e.g. /usr/bin/python3 -> python3.11).
	if _, err := os.Lstat(filepath.Join(dir, args[0])); err != nil {
		return badRequest("rootfs %q has no %s (process.args[0])", dir, args[0])
	}
	return nil
}
