// Package secretfile writes the secrets the project keeps on disk — keys,
// tokens, credentials — the one way: mode 0600 from the first byte, and
// whole or not at all (a temporary file renamed over the old one, so a
// crash leaves the old secret or the new, never half of one).
package secretfile

import "os"

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
