// Package runtimes keeps the runsc builds a node has run sandboxes with,
// and decides which build runs what and which may go.
//
// Why: a checkpoint image restores only on the runsc that wrote it (gVisor
// refuses another version string: "runsc version does not match across
// checkpoint restore", runsc/boot/controller.go), and a sandbox that is
// running or paused has a sentry of the build that started or restored it,
// which only that build's CLI is sure to speak to (its control messages
// are that build's Go types, runsc/boot/controller.go). So an upgrade of
// the pinned runsc must not take the old build away while any of those
// still need it: every build the node has used is kept, content-addressed,
// under <data-dir>/runsc-versions/<key>/runsc (root's, 0755, in 0700
// directories), and each sandbox's row names the build its memory belongs
// to. A restore runs the build that wrote the image; a cold start always
// runs the current one, so old builds are needed less and less; a build
// that nothing needs any more is removed (Plan).
//
// Two builds can claim one version string (a rebuild with other flags, a
// patched gVisor under the same tag): runsc compares only the string, so
// an image of one would load into the other and fail in ways nobody can
// predict. A key is therefore the version and the SHA-256 of the binary.
//
// This file is the pure part: keys, and the decisions. set.go does the I/O.
package runtimes

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Key names one runsc build: "<version, made safe for a file name>-<the
// first 16 hex digits of its SHA-256>", e.g.
// "gvisor.dev_gvisor_v0.0.0-20260905035102-160fafc42237-3ecf70bd817346ba".
// It is the build's directory name and what a sandbox's row and an
// image's stamp say. "" is no build (a detached sandbox, or a row from
// before builds were kept).
type Key string

// hashLen is how many hex digits of the SHA-256 a key carries: 64 bits,
// enough that two builds on one node never share one by chance.
const hashLen = 16

// maxVersionLen bounds the version part of a key (a directory name).
const maxVersionLen = 96

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._+-]`)

// KeyOf is the key of a build whose `runsc --version` says version and
// whose SHA-256 is sha256hex (64 hex digits).
func KeyOf(version, sha256hex string) (Key, error) {
	if len(sha256hex) != 64 || strings.Trim(sha256hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("runtimes: %q is not a hex SHA-256", sha256hex)
	}
	v := unsafeChars.ReplaceAllString(version, "_")
	if v == "" || strings.Trim(v, ".") == "" {
		v = "unknown"
	}
	if len(v) > maxVersionLen {
		v = v[:maxVersionLen]
	}
	return Key(v + "-" + sha256hex[:hashLen]), nil
}

// Valid reports whether k has the shape KeyOf gives (a directory name that
// cannot climb out of its parent).
func (k Key) Valid() bool {
	s := string(k)
	i := strings.LastIndexByte(s, '-')
	if i <= 0 || len(s)-i-1 != hashLen || len(s) > maxVersionLen+1+hashLen {
		return false
	}
	if strings.Trim(s[i+1:], "0123456789abcdef") != "" {
		return false
	}
	v := s[:i]
	return !unsafeChars.MatchString(v) && strings.Trim(v, ".") != ""
}

// Hash is the hex prefix of the build's SHA-256 that k carries.
func (k Key) Hash() string {
	if !k.Valid() {
		return ""
	}
	return string(k)[len(k)-hashLen:]
}

// ForImage is the build that must restore an image: the one its stamp
// names (written beside the image when it was made); else the one its
// sandbox's row names (a checkpoint that finished after the node died has
// no stamp yet, and was written by the sandbox's build); else the current
// one (an image from before builds were kept: it restores only if the
// current build is the one that wrote it, and the node falls back to a
// cold start if not, as it always did).
func ForImage(stamp, row, current Key) Key {
	switch {
	case stamp != "":
		return stamp
	case row != "":
		return row
	}
	return current
}

// ForRow is the build that controls a sandbox whose row names row: that
// one, or the current one for a row from before builds were kept (such a
// sandbox was started by the runsc the node ran then, which is the
// current one unless the pin changed in the same upgrade).
func ForRow(row, current Key) Key {
	if row != "" {
		return row
	}
	return current
}

// Use is why a build is needed.
type Use string

const (
	// Running: a sandbox runs (hot) or is paused (frozen) on it: its
	// sentry is that build.
	Running Use = "running"
	// Image: a checkpoint image it wrote (a snapshot, a clone's image
	// while children are made) is on disk: only it restores it.
	Image Use = "image"
)

// Ref is one thing that needs build Key.
type Ref struct {
	Key Key
	Use Use
	// ID is the sandbox (or the clone stage) that needs it.
	ID string
}

// Kept is a build Plan keeps, and why.
type Kept struct {
	Key     Key
	Current bool
	// Running and Images count the refs of each use.
	Running, Images int
	// Why says it in words.
	Why string
}

// Missing is a build something needs that the node does not have (deleted,
// or refused because its content no longer matches its name): its
// sandboxes cannot be restored, and are started cold instead.
type Missing struct {
	Key             Key
	Running, Images int
}

// Plan decides which of the builds the node has (have) it keeps: the
// current one always, and every other one that refs still need. The rest
// are to be removed. Builds refs need that are not in have are missing.
// Every list is sorted by key.
func Plan(have []Key, current Key, refs []Ref) (keep []Kept, remove []Key, missing []Missing) {
	type count struct{ running, images int }
	need := map[Key]*count{}
	for _, r := range refs {
		if r.Key == "" {
			continue
		}
		c := need[r.Key]
		if c == nil {
			c = &count{}
			need[r.Key] = c
		}
		if r.Use == Running {
			c.running++
		} else {
			c.images++
		}
	}
	seen := map[Key]bool{}
	for _, k := range have {
		if seen[k] {
			continue
		}
		seen[k] = true
		c := need[k]
		if c == nil {
			c = &count{}
		}
		switch {
		case k == current:
			keep = append(keep, Kept{Key: k, Current: true, Running: c.running, Images: c.images, Why: why(true, c.running, c.images)})
		case c.running+c.images > 0:
			keep = append(keep, Kept{Key: k, Running: c.running, Images: c.images, Why: why(false, c.running, c.images)})
		default:
			remove = append(remove, k)
		}
	}
	for k, c := range need {
		if !seen[k] && k != current {
			missing = append(missing, Missing{Key: k, Running: c.running, Images: c.images})
		}
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].Key < keep[j].Key })
	sort.Slice(remove, func(i, j int) bool { return remove[i] < remove[j] })
	sort.Slice(missing, func(i, j int) bool { return missing[i].Key < missing[j].Key })
	return keep, remove, missing
}

func why(current bool, running, images int) string {
	var parts []string
	if current {
		parts = append(parts, "current: new sandboxes and cold starts run on it")
	}
	if running > 0 {
		parts = append(parts, fmt.Sprintf("%d %s on it", running, plural(running, "sandbox runs", "sandboxes run")))
	}
	if images > 0 {
		parts = append(parts, fmt.Sprintf("%d %s only it restores", images, plural(images, "image", "images")))
	}
	return strings.Join(parts, "; ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
