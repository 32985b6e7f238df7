// Package livemove is the format of a live move's stream (issue 18): what
// a node sends when a sandbox leaves it with its memory and volume, and
// what the node it goes to accepts. The stream is a tar: the manifest
// (what the sandbox is), the checkpoint image's files (flat, regular
// files only), the volume, and an end entry; a stream without its end
// was cut short and is never taken for whole. Everything a receiver
// writes is bounded by what the manifest declared and confined to the
// sandbox's directory: the stream comes from another machine, through the
// master. The node drives a move (internal/node/move.go); this package
// only writes and reads its stream and checks its manifest.
package livemove

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/rootfs"
)

// Manifest is the first entry of a move stream: what the sandbox is, for
// the node it goes to.
type Manifest struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Template  string          `json:"template"`
	Digest    string          `json:"digest"`
	Principal string          `json:"principal,omitempty"`
	MemoryMiB int             `json:"memory_mib"`
	Tier      api.Tier        `json:"tier"`
	Idle      *api.IdleTimers `json:"idle,omitempty"`
	Egress    *api.Egress     `json:"egress,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	// LastActive keeps its idle timers where they were.
	LastActive time.Time `json:"last_active"`
	// Runtime is the runsc version and platform that wrote the image
	// (gvisor.Backend.RuntimeVersion): it restores only on the same.
	Runtime string `json:"runtime,omitempty"`
	// Runsc is the key of the runsc build that wrote it (its stamp, else
	// the sandbox's row: runtimes.ForImage), when the node keeps builds:
	// the node it goes to must keep that very build, or its wake after
	// the master committed the move would find no runsc to restore it
	// with and start it cold (its memory lost).
	Runsc string `json:"runsc,omitempty"`
	// Envd is the envd build (its directory's name) the image maps.
	Envd string `json:"envd,omitempty"`
	// ImageBytes and VolumeBytes bound what follows.
	ImageBytes  int64 `json:"image_bytes"`
	VolumeBytes int64 `json:"volume_bytes"`
	// UsageMiB is what its memory held at the checkpoint.
	UsageMiB int64  `json:"usage_mib,omitempty"`
	From     string `json:"from"`
	// Secrets are its bound secrets opened (secretbind.Export), values
	// and its CA's key: the stream runs only over the nodes' and the
	// master's mutual TLS, and the node it goes to seals them under its
	// own key before anything of it runs there.
	Secrets json.RawMessage `json:"secrets,omitempty"`
}

// Entries of a move stream, in this order: the manifest, the image's
// files (flat, regular files only), the volume, the end.
const (
	entryManifest = "manifest.json"
	entryImage    = "image/"
	entryVolume   = "volume/"
	entryEnd      = "end"
)

// maxManifest bounds a stream's manifest.
const maxManifest = 1 << 20

// maxImageOver is what an image may hold beyond its sandbox's memory
// limit (the sentry's own state).
const maxImageOver = 256 << 20

// Check refuses a manifest that no node could take as it is, for the move
// of generation gen (errdefs.ErrBadInput): no generation, a bad name, ID
// or principal, negative sizes, an envd build that is not one, a tier
// that does not move, an image larger than its sandbox's memory allows.
// What only a node can say (its template, its runsc, its envd builds, a
// sandbox it already has) is the node's to check.
func Check(m Manifest, gen int64) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: move of %s: %s", errdefs.ErrBadInput, m.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case gen <= 0:
		return bad("no generation")
	case !api.ValidName(m.Name):
		return bad("name %q is not valid", m.Name)
	case !validID(m.ID):
		return bad("ID %q is not valid", m.ID)
	case m.Principal != "" && !api.ValidPrincipal(m.Principal):
		return bad("principal %q is not valid", m.Principal)
	case m.ImageBytes < 0 || m.VolumeBytes < 0 || m.MemoryMiB < 0:
		return bad("negative sizes")
	case m.Envd != "" && (len(m.Envd) != 16 || strings.Trim(m.Envd, "0123456789abcdef") != ""):
		return bad("envd build %q is not 16 hex digits", m.Envd)
	}
	switch m.Tier {
	case api.TierHot, api.TierFrozen, api.TierSnapshot:
		// An image holds the sandbox's memory and the runtime's own
		// state: no more than its limit and a margin.
		if lim := int64(m.MemoryMiB)<<20 + maxImageOver; m.ImageBytes > lim {
			return bad("an image of %d bytes for a sandbox of %d MiB", m.ImageBytes, m.MemoryMiB)
		}
	case api.TierDetached:
		if m.ImageBytes != 0 {
			return bad("a detached sandbox with an image")
		}
	default:
		return bad("tier %q", m.Tier)
	}
	return nil
}

// validID is a sandbox ID as a node makes them (12 hex digits), or a
// pooled one's.
func validID(id string) bool {
	return len(id) >= 1 && len(id) <= 32 && strings.Trim(id, "0123456789abcdef") == ""
}

// Writer writes a move stream.
type Writer struct {
	tw      *tar.Writer
	started bool
}

// NewWriter writes a move stream to w.
func NewWriter(w io.Writer) *Writer { return &Writer{tw: tar.NewWriter(w)} }

// Started reports whether anything may have reached the receiver: from
// then on the sandbox's copy here is the master's to settle.
func (w *Writer) Started() bool { return w.started }

// Manifest writes the stream's first entry.
func (w *Writer) Manifest(m Manifest) error {
	mb, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := w.tw.WriteHeader(&tar.Header{Name: entryManifest, Mode: 0o600, Size: int64(len(mb)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	w.started = true
	_, err = w.tw.Write(mb)
	return err
}

// Image writes the checkpoint image's files names (ImageFiles) from dir.
func (w *Writer) Image(dir string, names []string) error {
	for _, name := range names {
		if err := sendFile(w.tw, filepath.Join(dir, name), entryImage+name); err != nil {
			return err
		}
	}
	return nil
}

// Volume writes the sandbox's volume, the tree at upper.
func (w *Writer) Volume(upper string) error {
	_, err := rootfs.PackVolume(upper, w.tw, entryVolume)
	return err
}

// End writes the end entry and closes the stream: the receiver takes it
// for whole only now.
func (w *Writer) End() error {
	if err := w.tw.WriteHeader(&tar.Header{Name: entryEnd, Mode: 0o600, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	return w.tw.Close()
}

// Reader reads a move stream.
type Reader struct{ tr *tar.Reader }

// ReadManifest reads a move stream's manifest from r, and the Reader
// that reads the rest (Receive). A stream that does not start with a
// manifest, or whose manifest is oversized or malformed, is
// errdefs.ErrBadInput.
func ReadManifest(r io.Reader) (*Reader, Manifest, error) {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return nil, Manifest{}, fmt.Errorf("%w: move stream: %v", errdefs.ErrBadInput, err)
	}
	if hdr.Name != entryManifest || hdr.Typeflag != tar.TypeReg || hdr.Size > maxManifest {
		return nil, Manifest{}, fmt.Errorf("%w: move stream: it starts with %q, not its manifest", errdefs.ErrBadInput, hdr.Name)
	}
	var m Manifest
	if err := json.NewDecoder(io.LimitReader(tr, maxManifest)).Decode(&m); err != nil {
		return nil, Manifest{}, fmt.Errorf("%w: move manifest: %v", errdefs.ErrBadInput, err)
	}
	return &Reader{tr: tr}, m, nil
}

// Receive writes the image and volume that follow the manifest m into
// d (its snapshot and its volume), each bounded by what m declared, with
// names confined to d, and requires the stream's end entry: a stream cut
// short is never taken for whole.
func (r *Reader) Receive(d layout.Dir, m Manifest) error {
	tr := r.tr
	if err := os.MkdirAll(d.Snapshot(), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(d.Upper(), 0o755); err != nil {
		return err
	}
	vol, err := rootfs.NewTree(d.Upper(), rootfs.Limits{MaxBytes: max(m.VolumeBytes, 1)})
	if err != nil {
		return err
	}
	finished := false
	defer func() {
		if !finished {
			vol.Abort()
		}
	}()
	var imageBytes int64
	for {
		hdr, err := tr.Next()
		if err != nil {
			return fmt.Errorf("%w: move stream cut short: %v", errdefs.ErrBadInput, err)
		}
		switch name := hdr.Name; {
		case name == entryEnd:
			if _, err := vol.Finish(); err != nil {
				return err
			}
			finished = true
			if !d.HasSnapshotFiles() && m.Tier != api.TierDetached {
				return fmt.Errorf("%w: move stream of %s brought no image", errdefs.ErrBadInput, m.Name)
			}
			return nil
		case strings.HasPrefix(name, entryImage):
			leaf := strings.TrimPrefix(name, entryImage)
			if m.Tier == api.TierDetached || hdr.Typeflag != tar.TypeReg || leaf == "" || strings.ContainsAny(leaf, "/\x00") || leaf == "." || leaf == ".." {
				return fmt.Errorf("%w: move stream: image entry %q", rootfs.ErrUnsafe, name)
			}
			if imageBytes += hdr.Size; imageBytes > m.ImageBytes {
				return fmt.Errorf("%w: move stream: image of more than the %d bytes its manifest said", rootfs.ErrTooLarge, m.ImageBytes)
			}
			if err := writeNew(filepath.Join(d.Snapshot(), leaf), io.LimitReader(tr, hdr.Size), hdr.Size); err != nil {
				return err
			}
		case strings.HasPrefix(name, entryVolume):
			if hdr.Typeflag == tar.TypeLink {
				return fmt.Errorf("%w: move stream: hard link %q in a volume", rootfs.ErrUnsafe, name)
			}
			hdr.Name = strings.TrimPrefix(name, entryVolume)
			if hdr.Name == "" {
				continue
			}
			if err := vol.Add(hdr, tr); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: move stream: unexpected entry %q", rootfs.ErrUnsafe, name)
		}
	}
}

// writeNew writes exactly size bytes of r to a new file at path (never
// through a link, never over a file).
func writeNew(path string, r io.Reader, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	k, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && k != size {
		err = fmt.Errorf("%w: %s: %d of %d bytes", errdefs.ErrBadInput, path, k, size)
	}
	return err
}

// ImageFiles lists a checkpoint image's files (runsc writes them flat)
// and their total size.
func ImageFiles(dir string) ([]string, int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	var names []string
	var total int64
	for _, de := range ents {
		if !de.Type().IsRegular() {
			return nil, 0, fmt.Errorf("checkpoint image %s holds %s, which is not a regular file", dir, de.Name())
		}
		fi, err := de.Info()
		if err != nil {
			return nil, 0, err
		}
		names = append(names, de.Name())
		total += fi.Size()
	}
	return names, total, nil
}

// TreeBytes is the size of the regular files under dir (0 if it is not
// there).
func TreeBytes(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			total += fi.Size()
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return total, err
}

// sendFile writes the file at path to tw as entry name.
func sendFile(tw *tar.Writer, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: fi.Size(), Typeflag: tar.TypeReg, ModTime: fi.ModTime()}); err != nil {
		return err
	}
	k, err := io.Copy(tw, f)
	if err == nil && k != fi.Size() {
		err = fmt.Errorf("%s changed size while it was sent", path)
	}
	return err
}
