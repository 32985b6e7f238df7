package ociimage

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"sandstorm/internal/errdefs"
)

// DefaultPath is the PATH of an image whose config sets none (Docker's).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxExpose bounds the ports one EXPOSE range may name.
const maxExpose = 1024

// ImageConfig is what an image's config says to run.
type ImageConfig struct {
	// Args is Entrypoint then Cmd; args[0] may be a bare name to find on
	// the PATH (Executable).
	Args []string
	// Entrypoint and Cmd are the two apart, as a build needs them (a
	// Dockerfile's CMD replaces Cmd and keeps Entrypoint).
	Entrypoint, Cmd []string
	// Env is KEY=value pairs, in the image's order.
	Env []string
	// WorkingDir is absolute, "/" when the image says none.
	WorkingDir string
	// User is as the image says it (name, uid, name:group, uid:gid), ""
	// for root; LookupUser reads it.
	User string
	// Ports are the TCP ports it exposes, ascending (UDP ones are left
	// out: only TCP reaches a sandbox's ports).
	Ports []int
}

// Config reads img's config.
func Config(img v1.Image) (ImageConfig, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return ImageConfig{}, errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("reading the image's config: %w", err))
	}
	c := cf.Config
	ic := ImageConfig{
		Args:       append(slices.Clone(c.Entrypoint), c.Cmd...),
		Entrypoint: slices.Clone(c.Entrypoint),
		Cmd:        slices.Clone(c.Cmd),
		Env:        slices.Clone(c.Env),
		WorkingDir: c.WorkingDir,
		User:       c.User,
	}
	if ic.WorkingDir == "" {
		ic.WorkingDir = "/"
	}
	if !strings.HasPrefix(ic.WorkingDir, "/") {
		return ImageConfig{}, errdefs.New(errdefs.ErrBadInput, "the image's working directory %q is not absolute", c.WorkingDir)
	}
	for _, e := range ic.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return ImageConfig{}, errdefs.New(errdefs.ErrBadInput, "the image's environment entry %q is not KEY=value", e)
		}
	}
	for p := range c.ExposedPorts {
		ports, err := parseExposed(p)
		if err != nil {
			return ImageConfig{}, err
		}
		ic.Ports = append(ic.Ports, ports...)
	}
	slices.Sort(ic.Ports)
	ic.Ports = slices.Compact(ic.Ports)
	return ic, nil
}

// Path is the PATH the image's environment sets, else DefaultPath.
func (c ImageConfig) Path() string {
	for _, e := range slices.Backward(c.Env) {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			return v
		}
	}
	return DefaultPath
}

// Executable is Args[0] as an absolute path inside rootfs: as it is when
// absolute, under WorkingDir when relative with a slash ("./server"),
// else found on Path() (ResolveExecutable).
func (c ImageConfig) Executable(rootfs string) (string, error) {
	if len(c.Args) == 0 || c.Args[0] == "" {
		return "", errdefs.New(errdefs.ErrBadInput, "the image names nothing to run (no Entrypoint or Cmd): give the command to run")
	}
	a := c.Args[0]
	if !strings.HasPrefix(a, "/") && strings.Contains(a, "/") {
		a = strings.TrimSuffix(c.WorkingDir, "/") + "/" + a
	}
	return ResolveExecutable(rootfs, a, c.Path())
}

// parseExposed reads one key of ExposedPorts: "80", "80/tcp",
// "8000-8010/tcp", "53/udp" (none: only TCP counts).
func parseExposed(key string) ([]int, error) {
	port, proto, _ := strings.Cut(key, "/")
	switch strings.ToLower(proto) {
	case "", "tcp":
	case "udp", "sctp":
		return nil, nil
	default:
		return nil, errdefs.New(errdefs.ErrBadInput, "the image exposes %q: %q is not a protocol", key, proto)
	}
	lo, hi, isRange := strings.Cut(port, "-")
	if !isRange {
		hi = lo
	}
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
		return nil, errdefs.New(errdefs.ErrBadInput, "the image exposes %q, not a port (1-65535) or range of them", key)
	}
	if b-a >= maxExpose {
		return nil, errdefs.New(errdefs.ErrBadInput, "the image exposes %q, over %d ports", key, maxExpose)
	}
	ports := make([]int, 0, b-a+1)
	for p := a; p <= b; p++ {
		ports = append(ports, p)
	}
	return ports, nil
}
