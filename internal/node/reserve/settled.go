package reserve

import (
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"sync"

	"sandstorm/internal/memguard"
	"sandstorm/internal/store"
)

// Settled keeps what each template's sandboxes settled at, for the next
// run of the node (admission.Config.Settled): without it a restarted node
// counts its first burst of creates at their limits again.
type Settled struct {
	path string
	log  *slog.Logger

	mu    sync.Mutex
	sizes map[string]int64
}

// LoadSettled reads the sizes kept at path; an unreadable file is logged
// and starts empty.
func LoadSettled(path string, log *slog.Logger) *Settled {
	s := &Settled{path: path, log: log, sizes: map[string]int64{}}
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("read the templates' settled sizes; the first creates count at their limits", "path", path, "err", err)
		}
		return s
	}
	if err := json.Unmarshal(b, &s.sizes); err != nil {
		log.Warn("the templates' settled sizes are unreadable; the first creates count at their limits", "path", path, "err", err)
		s.sizes = map[string]int64{}
	}
	return s
}

// Sizes is a copy of the sizes kept.
func (s *Settled) Sizes() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.sizes)
}

// Learned records what key's sandboxes settled at
// (admission.Config.Learned): written whole to a temporary file and
// renamed, so a crash leaves the old file or the new one.
func (s *Settled) Learned(key string, mib int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sizes[key] = mib
	b, _ := json.Marshal(s.sizes)
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
		err = os.Rename(tmp, s.path)
		if err != nil {
			s.log.Warn("keep the templates' settled sizes", "err", err)
		}
	}
	s.log.Info("template's sandboxes settle", "template", key, "settled_mib", mib, "admitted_at_mib", memguard.Expected(1<<30, mib))
}

// SizeKey names what a template's sandboxes settle at: its name and its
// rootfs's digest, so a template made again with another program learns
// its size again instead of inheriting the old one's.
func SizeKey(t store.Template) string { return t.Name + "@" + t.Digest }
