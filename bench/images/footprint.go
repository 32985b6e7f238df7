package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"sandstorm/internal/mountinfo"
)

// footprint is what the external tools leave on the machine outside the
// directories the benchmark gives them: podman, skopeo and netavark keep
// a blob-info cache, IPAM state, runsc's default root and cgroups of
// their own whatever --root says. Taken before they run, it removes
// afterwards only what was not there before, so the machine is left as
// found, and never a path that was.
type footprint struct {
	// absent are the paths that did not exist when it was taken.
	absent []string
}

// toolPaths are the paths skopeo, umoci and podman (with netavark and
// runsc as its runtime) were seen to create here with their storage in
// a directory of the benchmark's own.
func toolPaths() []string {
	paths := []string{"/var/lib/containers", "/run/containers", "/run/libpod", "/run/runsc", "/run/crun"}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, c := range cg {
		if fi, err := os.Lstat(c); err == nil && fi.IsDir() {
			paths = append(paths, filepath.Join(c, "libpod_parent"))
		}
	}
	paths = append(paths, "/sys/fs/cgroup/libpod_parent") // cgroup v2
	return paths
}

// takeFootprint notes which of paths do not exist now.
func takeFootprint(paths []string) footprint {
	var f footprint
	for _, p := range paths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			f.absent = append(f.absent, p)
		}
	}
	return f
}

// clean removes every path that was absent when f was taken and exists
// now, and says what it removed and what it could not. What is mounted
// under such a path is unmounted first (runsc mounts a namespace file
// under its root, in this run's mount namespace). A directory under
// /sys/fs/cgroup is a cgroup: its child cgroups are removed with rmdir,
// deepest first (a cgroup that still has a process stays, and is said).
func (f footprint) clean() (removed, failed []string) {
	for _, p := range f.absent {
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		var err error
		for _, m := range mountinfo.Under(p) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		if strings.HasPrefix(p, "/sys/fs/cgroup/") {
			err = rmdirTree(p)
		} else {
			err = os.RemoveAll(p)
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		removed = append(removed, p)
	}
	return removed, failed
}

// rmdirTree removes the directory tree at root with rmdir alone, deepest
// first: the way cgroups are removed (their files cannot be).
func rmdirTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := os.Remove(d); err != nil {
			return err
		}
	}
	return nil
}
