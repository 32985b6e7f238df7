// Package secretfile writes the secrets the project keeps on disk — keys,
// tokens, credentials — the one way: mode 0600 from the first byte, and
// whole or not at all (a temporary file renamed over the old one, so a
// crash leaves the old secret or the new, never half of one).
package secretfile

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
)

// Write writes b to path, mode 0600.
func Write(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	// WriteFile's mode is for a new file only: a .tmp left by a crash
	// keeps its own.
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Ensure returns the secret token in path (trimmed), making one — 32
// random bytes, hex — on the first call, and putting the file back to
// 0600 if it was loosened.
func Ensure(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			os.Chmod(path, 0o600)
			return s, nil
		}
	}
	tok, err := NewToken()
	if err != nil {
		return "", err
	}
	return tok, Write(path, []byte(tok+"\n"))
}

// NewToken is 32 random bytes, hex.
func NewToken() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(raw[:]), nil
}
