package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sandstorm/internal/runtimes"
)

// Binary is the sandstormd a benchmark measures: built from the source
// tree it records (Built), or one it was given. A results file that names
// a commit must measure that commit's code: a bin/sandstormd left from an
// earlier build does not (a fleet run was once labelled with a commit
// whose binary it never ran).
type Binary struct {
	Path   string `json:"binary"`
	Built  bool   `json:"built_from_tree"`
	SHA256 string `json:"sha256"`
}

// SandstormdBinary is given, if set, else ./cmd/sandstormd of repo built into
// dir, with the runsc at runsc linked beside it (sandstormd's default
// runsc is the one next to it) and sandstorm-envd built beside it as make
// build builds it (static): a node finds envd there, and without it
// serves no commands and files.
func SandstormdBinary(ctx context.Context, repo, given, dir, runsc string) (Binary, error) {
	var b Binary
	if given != "" {
		p, err := exec.LookPath(given)
		if err != nil {
			return b, fmt.Errorf("--sandstormd: %w", err)
		}
		if b.Path, err = filepath.Abs(p); err != nil {
			return b, err
		}
	} else {
		b.Path, b.Built = filepath.Join(dir, "sandstormd"), true
		fmt.Fprintf(os.Stderr, "building sandstormd from %s\n", repo)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.Path, "./cmd/sandstormd")
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build ./cmd/sandstormd in %s: %v\n%s", repo, err, strings.TrimSpace(string(out)))
		}
		envd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, "sandstorm-envd"), "./cmd/sandstorm-envd")
		envd.Dir, envd.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := envd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build ./cmd/sandstorm-envd in %s: %v\n%s", repo, err, strings.TrimSpace(string(out)))
		}
		if runsc != "" {
			abs, err := filepath.Abs(runsc)
			if err != nil {
				return b, err
			}
			if err := os.Symlink(abs, filepath.Join(dir, "runsc")); err != nil {
				return b, err
			}
		}
	}
	var err error
	b.SHA256, err = FileSHA256(b.Path)
	return b, err
}

// FileSHA256 is the hex SHA-256 of the file at path (runtimes.FileSHA256).
func FileSHA256(path string) (string, error) { return runtimes.FileSHA256(path) }

// FindRunsc is the runsc a benchmark hands its daemon or runs itself:
// given, else repo's bin/runsc (the pinned one `make runsc` builds), as an
// absolute path. A daemon built into a temporary directory finds no runsc
// beside itself, and the results must name the runsc the run used, not
// the one on PATH.
func FindRunsc(repo, given string) (string, error) {
	path := given
	if path == "" {
		path = filepath.Join(repo, "bin", "runsc")
	}
	path, err := exec.LookPath(path)
	if err == nil {
		path, err = filepath.Abs(path)
	}
	if err != nil {
		return "", fmt.Errorf("runsc: %w (build the pinned one into bin/ with `make runsc`, or pass --runsc)", err)
	}
	return path, nil
}
