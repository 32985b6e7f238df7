// Package secrets is what Sandstorm keeps of the secrets a sandbox uses
// but never holds (issue 33, item 4): the box that seals them at rest
// (AES-256-GCM under a key in a 0600 file of the data dir), the marker a
// sandbox is given in a secret's place, and the rules for a secret's name
// and the destinations it may go to. The boundary puts a secret in place
// of its marker on the way out (internal/sam/boundary, inject.go); the
// master stores them (store.SecretRows), a node keeps a sandbox's
// bindings sealed beside it (internal/node/secretbind).
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/secretfile"
)

// KeyFile is the box's key in a data dir: 32 random bytes, hex, 0600.
const KeyFile = "secrets.key"

// Box seals and opens values under one key. Sealed is nonce ‖ ciphertext;
// the additional data binds a value to where it is kept (a team and a
// name, a sandbox), so a sealed value copied to another row does not open.
type Box struct{ aead cipher.AEAD }

// OpenBox reads the key in path, making one on first use.
func OpenBox(path string) (*Box, error) {
	tok, err := secretfile.Ensure(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key %s: %w", path, err)
	}
	key, err := hex.DecodeString(tok)
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("secrets key %s: want 64 hex digits (32 bytes); move it aside only if no secret is stored yet, else the secrets stored under it are lost", path)
	}
	return NewBox(key)
}

// NewBox is a box with key (32 bytes).
func NewBox(key []byte) (*Box, error) {
	c, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	g, err := cipher.NewGCM(c)
	if err != nil {
		return nil, err
	}
	return &Box{aead: g}, nil
}

// Seal seals plain, bound to ad.
func (b *Box) Seal(plain []byte, ad string) []byte {
	nonce := make([]byte, b.aead.NonceSize(), b.aead.NonceSize()+len(plain)+b.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return b.aead.Seal(nonce, nonce, plain, []byte(ad))
}

// ErrSealed is a sealed value that does not open: another key, another
// place (ad), or changed bytes.
var ErrSealed = errors.New("sealed value does not open with this secrets key (<data-dir>/secrets.key): it was sealed under another key, or altered; masters sharing a store must share that file")

// Open opens what Seal sealed with the same ad.
func (b *Box) Open(sealed []byte, ad string) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < n+b.aead.Overhead() {
		return nil, ErrSealed
	}
	p, err := b.aead.Open(nil, sealed[:n], sealed[n:], []byte(ad))
	if err != nil {
		return nil, ErrSealed
	}
	return p, nil
}

// MarkerPrefix starts every marker: a marker is MarkerPrefix and 32 hex
// digits, new for each sandbox and secret, so one seen in a log or a
// request names no secret and cannot be guessed.
const MarkerPrefix = "sandstorm-secret-"

// NewMarker is a new marker.
func NewMarker() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return MarkerPrefix + hex.EncodeToString(b[:])
}

// Bounds on what is stored.
const (
	MaxValueBytes = 16 << 10
	MaxHosts      = 32
)

// CheckName refuses a name that is not 1-64 of A-Z, a-z, 0-9 and "_.-".
func CheckName(name string) error {
	if name == "" || len(name) > 64 {
		return errdefs.New(errdefs.ErrBadInput, "secret name %q: use 1-64 of A-Z, a-z, 0-9 and '_.-'", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return errdefs.New(errdefs.ErrBadInput, "secret name %q: use 1-64 of A-Z, a-z, 0-9 and '_.-'", name)
		}
	}
	return nil
}

// CheckValue refuses an empty or oversized value, and one that holds a
// line break or NUL (it goes into HTTP headers).
func CheckValue(v []byte) error {
	if len(v) == 0 || len(v) > MaxValueBytes {
		return errdefs.New(errdefs.ErrBadInput, "secret value: %d bytes; want 1 to %d", len(v), MaxValueBytes)
	}
	if strings.ContainsAny(string(v), "\r\n\x00") {
		return errdefs.New(errdefs.ErrBadInput, "secret value: holds a line break or NUL; it is sent in HTTP headers (a trailing newline from a file? use printf, not echo)")
	}
	return nil
}

// CheckHosts is hosts as kept (lower case), or why one is not a
// destination: a DNS name ("api.example.com") or every name under one
// ("*.example.com"). Addresses are refused: a secret goes to a name whose
// certificate the boundary verifies, never to whatever holds an address.
func CheckHosts(hosts []string) ([]string, error) {
	if len(hosts) == 0 || len(hosts) > MaxHosts {
		return nil, errdefs.New(errdefs.ErrBadInput, "secret hosts: %d given; want 1 to %d names it may be sent to", len(hosts), MaxHosts)
	}
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		name := strings.TrimPrefix(h, "*.")
		if !validDNSName(name) || !strings.Contains(name, ".") {
			return nil, errdefs.New(errdefs.ErrBadInput, "secret host %q: want a DNS name with a dot (api.example.com) or *.name; no addresses, ports or schemes", h)
		}
		out = append(out, h)
	}
	return out, nil
}

func validDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	// All digits and dots is an IPv4 address, not a name.
	return strings.Trim(s, "0123456789.") != ""
}

// HostMatches reports whether host (lower case, no port) is one of hosts:
// equal to a name, or under a "*.name" (one or more labels deep; the
// bare name is not under it).
func HostMatches(hosts []string, host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, h := range hosts {
		if suffix, ok := strings.CutPrefix(h, "*"); ok {
			if strings.HasSuffix(host, suffix) && len(host) > len(suffix) {
				return true
			}
		} else if host == h {
			return true
		}
	}
	return false
}
