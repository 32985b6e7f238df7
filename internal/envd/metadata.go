package envd

import (
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/sys/unix"
)

// File metadata (envd 0.6.2): an upload's X-Metadata-<key> headers are
// kept as extended attributes user.e2b.<key> on the file, and given back
// in its EntryInfo (spec/envd/envd.yaml, POST /files). Each upload
// replaces the file's metadata with what it sends.

const xattrPrefix = "user.e2b."

// Limits of envd.yaml: keys and values printable US-ASCII, a key at most
// 246 bytes (the VFS's 255 less the prefix), all of a file's metadata at
// most 4096 bytes counting the prefix once per key.
const (
	maxMetaKey   = 246
	maxMetaTotal = 4096
)

// metadataOf reads an upload's metadata headers (the first of a repeated
// one), lowercasing keys.
func metadataOf(h http.Header) (map[string]string, error) {
	md := map[string]string{}
	total := 0
	for name, vs := range h {
		key, ok := strings.CutPrefix(http.CanonicalHeaderKey(name), "X-Metadata-")
		if !ok || len(vs) == 0 {
			continue
		}
		key = strings.ToLower(key)
		if key == "" || len(key) > maxMetaKey || !printable(key) || !printable(vs[0]) {
			return nil, fmt.Errorf("metadata %q: keys of 1-%d and values of printable US-ASCII only", key, maxMetaKey)
		}
		md[key] = vs[0]
		total += len(xattrPrefix) + len(key) + len(vs[0])
	}
	if total > maxMetaTotal {
		return nil, fmt.Errorf("metadata: %d bytes, at most %d", total, maxMetaTotal)
	}
	return md, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// setMetadata replaces the metadata of the file at p with md.
func setMetadata(p string, md map[string]string) error {
	for k := range readMetadata(p) {
		unix.Lremovexattr(p, xattrPrefix+k)
	}
	for k, v := range md {
		if err := unix.Lsetxattr(p, xattrPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("metadata %q: %w", k, err)
		}
	}
	return nil
}

// readMetadata is the metadata of the file at p (nil: none, or the
// filesystem keeps no extended attributes).
func readMetadata(p string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return nil
	}
	var md map[string]string
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		key, ok := strings.CutPrefix(name, xattrPrefix)
		if !ok {
			continue
		}
		val := make([]byte, 4096)
		m, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(val[:m])
	}
	return md
}
