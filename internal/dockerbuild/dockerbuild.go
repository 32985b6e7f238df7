// Package dockerbuild builds a template's image from a Dockerfile (issue
// 32): the engine of `sandstormd template build`, independent of where a
// RUN executes. The Dockerfile is parsed by buildkit's own parser and
// instruction reader (ARG and ENV expansion by its shell.Lex), .dockerignore
// by moby/patternmatcher; what is built is a list of layers in overlayfs
// form and a config, step by step, each step cached by its parent and its
// own content so that a rebuild after a one-line change reruns that step
// and those after it only.
//
// What a build reads is bounded by design: COPY and ADD read the build
// context only, never through a symlink (a symlink is copied as one) and
// never a path with "..", ADD of a URL is refused; every RUN goes to the
// caller's Runner, which executes it in a sandbox, never on the host.
package dockerbuild

import (
	"context"
	"io"
)

// Image is a built (or base) image: its layers, bottom first, each an id
// the Store knows, and its config.
type Image struct {
	Layers []string    `json:"layers"`
	Config ImageConfig `json:"config"`
}

// ImageConfig is what an image says about how its sandbox starts.
type ImageConfig struct {
	Entrypoint   []string          `json:"entrypoint,omitempty"`
	Cmd          []string          `json:"cmd,omitempty"`
	Env          []string          `json:"env,omitempty"`
	WorkingDir   string            `json:"workingDir,omitempty"`
	User         string            `json:"user,omitempty"`
	ExposedPorts []int             `json:"exposedPorts,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	StopSignal   string            `json:"stopSignal,omitempty"`
}

// Base resolves a FROM that is neither "scratch" nor an earlier stage: an
// image reference or a template's name.
type Base interface {
	From(ctx context.Context, name string) (Image, error)
}

// RunStep is one RUN, ready to execute.
type RunStep struct {
	// Args is the command: a shell form is already wrapped in the stage's
	// shell (["/bin/sh", "-c", cmd] unless SHELL said otherwise).
	Args []string `json:"args"`
	// Env is the whole environment, KEY=value: the image's ENV and the
	// ARGs in scope (PATH set if neither did).
	Env []string `json:"env"`
	// User is USER as written ("" is root); the Runner resolves names in
	// the image.
	User string `json:"user,omitempty"`
	// Workdir is the absolute working directory ("/" if none was set).
	Workdir string `json:"workdir"`
}

// Runner executes a RUN over img in a sandbox.
type Runner interface {
	// Run executes step over img's layers, its output written to out, and
	// returns what it changed as a new directory in overlayfs form
	// (whiteouts as character devices 0:0, opaque directories with
	// trusted.overlay.opaque=y; its root directory's mode and owner are
	// those of the image's root), which Build hands to Store.Add. On
	// error it leaves no directory behind. A command that exits non-zero
	// is an error saying so ("exit status 1"); an error of no errdefs
	// kind is taken as the Dockerfile's fault (errdefs.ErrBadInput).
	Run(ctx context.Context, img Image, step RunStep, out io.Writer) (layerDir string, err error)
}

// Store keeps layers.
type Store interface {
	// TempDir makes a new, empty directory on the store's file system for
	// a layer being made (Build's for COPY, ADD and WORKDIR).
	TempDir() (string, error)
	// Add takes dir, a directory from TempDir or a Runner, as a new layer
	// and returns its id; dir is the store's from then on, and on error
	// the caller removes it.
	Add(ctx context.Context, dir string) (id string, err error)
	// Dir is the directory of layer id, to be read only (Build looks up
	// paths in an image: the owner of a directory it copies into, a
	// --chown name in /etc/passwd). A layer gone is an error of kind
	// errdefs.ErrNotFound; a cache entry naming it is a miss.
	Dir(id string) (string, error)
}

// BuildOptions is one build.
type BuildOptions struct {
	// Dockerfile is the Dockerfile's text.
	Dockerfile []byte
	// ContextDir is the build context: COPY and ADD read there and only
	// there, minus what its .dockerignore excludes.
	ContextDir string
	// BuildArgs are --build-arg values.
	BuildArgs map[string]string
	// Target is the stage to build (by its AS name); "" is the last one.
	Target string
	// CacheDir holds the step cache's index (one file per step, written
	// whole or not at all); "" builds without a cache.
	CacheDir string
	Base     Base
	Runner   Runner
	Store    Store
	// Out receives the progress ("Step N/M : ..."), CACHED marks and each
	// RUN's output; nil discards them.
	Out io.Writer
}

// Build builds the target stage of opts.Dockerfile and returns its image.
// On error it returns no image, and each layer directory a failing step
// was making is removed; the layers of the steps that succeeded stay in
// the Store and the cache, so that the next build starts from them. An
// error from a step names its line ("Dockerfile:7: RUN make: exit status
// 2"); a Dockerfile that is wrong or asks for what is refused is an error
// of kind errdefs.ErrBadInput.
func Build(ctx context.Context, opts BuildOptions) (Image, error) {
	b, err := newBuilder(opts)
	if err != nil {
		return Image{}, err
	}
	defer b.close()
	return b.build(ctx)
}
