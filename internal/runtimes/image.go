package runtimes

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// StampFile is the file in a checkpoint image directory that names the
// build that wrote it. It is written into the image's temporary directory
// before that is renamed into place, so a complete image has it, unless
// its checkpoint finished while the node was down (then the sandbox's row
// says: ForImage). runsc restore reads only its own files there
// (checkpoint.img, pages_meta.img, pages.img) and ignores it.
const StampFile = "sandstorm-runsc"

// Stamp is what StampFile holds.
type Stamp struct {
	Key     Key    `json:"key"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// WriteStamp records in imageDir that build b wrote it.
func WriteStamp(imageDir string, b Build) error {
	data, err := json.Marshal(Stamp{Key: b.Key, Version: b.Version, SHA256: b.SHA256})
	if err != nil {
		return err
	}
	return writeSynced(filepath.Join(imageDir, StampFile), data, 0o600)
}

// ReadStamp returns the build imageDir's stamp names ("" and no error if
// it has none).
func ReadStamp(imageDir string) (Key, error) {
	data, err := os.ReadFile(filepath.Join(imageDir, StampFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var s Stamp
	if err := json.Unmarshal(data, &s); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(imageDir, StampFile), err)
	}
	if !s.Key.Valid() {
		return "", fmt.Errorf("%s: %q is not a build key", filepath.Join(imageDir, StampFile), s.Key)
	}
	return s.Key, nil
}

// statefileMagic opens every gVisor state file (pkg/state/statefile:
// magicHeader), followed by the length of its metadata (8 bytes, big
// endian) and the metadata as JSON.
var statefileMagic = []byte("\x67\x56\x69\x73\x6f\x72\x53\x46")

// maxMetadata bounds what ImageVersion reads (gVisor's own bound is
// 16 MiB; a runsc image's metadata is a few KiB: the container specs).
const maxMetadata = 16 << 20

// ImageVersion is the runsc version string an image's own metadata names
// (key "runsc_version", written by runsc/boot/restore.go and compared by
// runsc restore): what the image says of itself, independent of the
// node's records. Tests check it against the stamp; the node uses it in
// messages.
func ImageVersion(imageDir string) (string, error) {
	f, err := os.Open(filepath.Join(imageDir, "checkpoint.img"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	head := make([]byte, len(statefileMagic)+8)
	if _, err := io.ReadFull(r, head); err != nil {
		return "", fmt.Errorf("%s: %w", f.Name(), err)
	}
	if !bytes.Equal(head[:len(statefileMagic)], statefileMagic) {
		return "", fmt.Errorf("%s is not a gVisor state file", f.Name())
	}
	n := binary.BigEndian.Uint64(head[len(statefileMagic):])
	if n > maxMetadata {
		return "", fmt.Errorf("%s: metadata of %d bytes", f.Name(), n)
	}
	meta := make([]byte, n)
	if _, err := io.ReadFull(r, meta); err != nil {
		return "", fmt.Errorf("%s: %w", f.Name(), err)
	}
	var m map[string]string
	if err := json.Unmarshal(meta, &m); err != nil {
		return "", fmt.Errorf("%s: metadata: %w", f.Name(), err)
	}
	v, ok := m["runsc_version"]
	if !ok {
		return "", fmt.Errorf("%s: no runsc_version in its metadata", f.Name())
	}
	return v, nil
}

// Report is kept.json: the node's last decision, for `sandstormd doctor`
// (which runs apart from the node and must not open its store).
type Report struct {
	At      time.Time         `json:"at"`
	Current Key               `json:"current"`
	Kept    []Kept            `json:"kept"`
	Missing []Missing         `json:"missing,omitempty"`
	Refused map[Key]string    `json:"refused,omitempty"`
	Builds  map[Key]BuildInfo `json:"builds"`
}

// BuildInfo is a kept build's version and hash, in Report.
type BuildInfo struct {
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// WriteReport writes the node's last decision to kept.json.
func (s *Set) WriteReport(keep []Kept, missing []Missing) error {
	r := Report{At: time.Now().UTC(), Current: s.current.Key, Kept: keep, Missing: missing, Refused: s.Refused(), Builds: map[Key]BuildInfo{}}
	for _, b := range s.Builds() {
		r.Builds[b.Key] = BuildInfo{Version: b.Version, SHA256: b.SHA256}
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeSynced(filepath.Join(s.dir, keptFile), data, 0o600)
}

// Inspection is what Inspect found of one build directory.
type Inspection struct {
	Key     Key
	Version string
	// Err is why the build would not be run (nil: it checks out).
	Err error
}

// Inspect checks every build kept in dir as Open would, without changing
// anything (for `sandstormd doctor`), and returns the node's last report
// (nil if it has written none).
func Inspect(dir string) ([]Inspection, *Report, error) {
	if err := ownFile(dir, true, 0o700, true); err != nil {
		return nil, nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	s := &Set{dir: dir}
	var out []Inspection
	for _, e := range ents {
		if !e.IsDir() || !Key(e.Name()).Valid() {
			continue
		}
		b, err := s.check(Key(e.Name()), true, true)
		out = append(out, Inspection{Key: Key(e.Name()), Version: b.Version, Err: err})
	}
	var rep *Report
	if data, err := os.ReadFile(filepath.Join(dir, keptFile)); err == nil {
		rep = new(Report)
		if err := json.Unmarshal(data, rep); err != nil {
			rep = nil
		}
	}
	return out, rep, nil
}
