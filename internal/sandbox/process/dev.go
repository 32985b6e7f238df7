package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// devNodes are the character devices every container's /dev gets: the
// ones programs expect to open freely, none that reach hardware or the host.
var devNodes = []struct {
	name         string
	major, minor uint32
}{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7},
	{"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
}

// makeDevTemplate makes sure <stateDir>/dev holds the template the init
// script copies into each container's /dev tmpfs, and returns its path. It
// is built in a temporary directory and renamed into place, so a Backend
// (possibly another instance over the same stateDir) never copies a
// half-built one; an existing template is kept.
func makeDevTemplate(stateDir string) (string, error) {
	dst := filepath.Join(stateDir, "dev")
	if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
		return dst, nil
	}
	tmp, err := os.MkdirTemp(stateDir, ".dev.tmp-")
	if err != nil {
		return "", fmt.Errorf("dev template: %w", err)
	}
	defer os.RemoveAll(tmp) // no-op once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("dev template: %w", err)
	}
	for _, n := range devNodes {
		p := filepath.Join(tmp, n.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return "", fmt.Errorf("dev template: mknod %s: %w", p, err)
		}
		// Mknod's mode is filtered by the umask.
		if err := os.Chmod(p, 0o666); err != nil {
			return "", fmt.Errorf("dev template: %w", err)
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(tmp, name)); err != nil {
			return "", fmt.Errorf("dev template: %w", err)
		}
	}
	// POSIX shared memory (shm_open) lives in /dev/shm; it shares the
	// 64 MiB /dev tmpfs.
	shm := filepath.Join(tmp, "shm")
	if err := os.Mkdir(shm, 0o755); err == nil {
		err = os.Chmod(shm, os.ModeSticky|0o777)
	}
	if err != nil {
		return "", fmt.Errorf("dev template: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		// Lost a race with another instance: theirs is just as good.
		if fi, serr := os.Lstat(dst); serr == nil && fi.IsDir() {
			return dst, nil
		}
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("dev template: %s exists and is not a directory", dst)
		}
		return "", fmt.Errorf("dev template: %w", err)
	}
	return dst, nil
}
