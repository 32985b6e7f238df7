// Package envdlink is a Sandstorm node's link to envd, the E2B API for
// commands and files that runs inside each sandbox (docs/ARCHITECTURE.md,
// "envd"): the envd builds the node mounts into its sandboxes (Builds),
// and the calls it forwards to one sandbox's envd (Link). What envd starts
// is confined exactly as the template's process is, its paths are the
// sandbox's, and the processes it runs are in every checkpoint with it.
// The node
//   - mounts the envd binary read-only at layout.EnvdMount in every
//     sandbox (a bind mount costs the sandbox nothing until it is used);
//   - starts envd with `runsc exec` on the first call that needs it — a
//     template that never uses it pays nothing — and envd detaches at
//     once, so no host process stays behind it;
//   - forwards calls to it on the sandbox's own address, never published
//     on the gateway: the only way to envd from outside is through the
//     API that checked the caller.
package envdlink

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"sandstorm/internal/node/layout"
)

// The envd binary a sandbox mounts is fixed for the sandbox's life: its
// checkpoint images hold envd's memory, mapped from that file, and gVisor
// restores such a file only if it is the one that was saved (a warm image
// made before an upgrade of envd, restored with the new binary at its
// path, came back without its process: "sandbox process is gone", seen on
// a node). So each envd build has its own directory,
// <data-dir>/envd/<first 16 hex digits of its SHA-256>, a bundle's spec
// names the one it started with, and a restore mounts the same one again.
// A build no bundle names any more is removed when the node starts.

// Builds is a node's envd builds. A nil Builds is a node without envd
// (--envd none): every sandbox mounts none.
type Builds struct {
	root    string // <data-dir>/envd
	current string // the directory sandboxes started now mount
	log     *slog.Logger
}

// Install puts the envd binary at binary in its build's directory under
// dataDir (by a rename of a complete copy, so a crash leaves no half
// binary there), makes it current, and removes the builds that no layout
// in used mounts. binary "" is a node without envd: nil, nil.
func Install(dataDir, binary string, used []layout.Dir, log *slog.Logger) (*Builds, error) {
	if binary == "" {
		return nil, nil
	}
	src, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("envd binary: %w (build it with make build, or run with --envd none to serve no commands and files)", err)
	}
	sum := sha256.Sum256(src)
	b := &Builds{root: filepath.Join(dataDir, "envd"), log: log}
	dir := filepath.Join(b.root, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, layout.EnvdBinary)); err != nil {
		tmp := dir + ".new"
		os.RemoveAll(tmp)
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(tmp, layout.EnvdBinary), src, 0o755); err != nil {
			return nil, err
		}
		// E2B's SDK runs mcp-gateway by that name (cmd/sandstorm-envd).
		if err := os.Symlink(layout.EnvdBinary, filepath.Join(tmp, "mcp-gateway")); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, dir); err != nil {
			return nil, err
		}
	}
	b.current = dir
	b.removeUnused(used)
	return b, nil
}

// Current is the directory a sandbox started now mounts ("" without envd).
func (b *Builds) Current() string {
	if b == nil {
		return ""
	}
	return b.current
}

// For is the envd directory for a restore of an image made in layout l
// (the sandbox's own, its warm template's or its clone parent's): the one
// l's spec mounted, if it is still there, else the current one.
func (b *Builds) For(l layout.Dir) string {
	if b == nil {
		return ""
	}
	if src := l.EnvdSource(); src != "" {
		if _, err := os.Stat(filepath.Join(src, layout.EnvdBinary)); err == nil {
			return src
		}
	}
	return b.current
}

// Named is the directory of build name (a move manifest's Envd: the
// directory's base name), or an error when the node has not got it.
func (b *Builds) Named(name string) (string, error) {
	if b == nil {
		return "", fmt.Errorf("this node has no envd")
	}
	dir := filepath.Join(b.root, filepath.Base(name))
	if _, err := os.Stat(filepath.Join(dir, layout.EnvdBinary)); err != nil {
		return "", err
	}
	return dir, nil
}

// removeUnused removes the builds that neither the current build is nor
// any layout in used mounts (a data dir from before builds had
// directories mounted root itself, with the binary in it: that one is
// kept while a bundle mounts it).
func (b *Builds) removeUnused(used []layout.Dir) {
	keep := map[string]bool{b.current: true}
	for _, l := range used {
		if src := l.EnvdSource(); src != "" {
			keep[src] = true
		}
	}
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(b.root, e.Name())
		switch {
		case e.Name() == layout.EnvdBinary && !keep[b.root]:
			os.Remove(p)
		case e.IsDir() && !keep[p]:
			if err := os.RemoveAll(p); err == nil {
				b.log.Info("envd build removed: no sandbox mounts it", "dir", p)
			}
		}
	}
}
