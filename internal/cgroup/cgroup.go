// Package cgroup finds the cgroup a process is in for one controller, on
// whichever hierarchy a node has: cgroup v1, v2, or both (hybrid, as on
// this project's Debian 12 machines: v1 controllers under
// /sys/fs/cgroup/<names>, v2 at /sys/fs/cgroup/unified). runsc makes one
// cgroup per sandbox and puts the sentry, the gofer and the stubs in it;
// the node reads and steers a sandbox's memory and CPU there.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrRoot is Find's answer for a process in the root cgroup, which
// stands for the whole machine: nothing may be read or pushed there as if
// it were one sandbox's.
var ErrRoot = errors.New("the process is in the root cgroup")

// Of is Find for process pid, with the file system saying which files
// exist.
func Of(pid int, controller, v2File string) (dir string, v2 bool, err error) {
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", false, err
	}
	return Find(string(text), controller, v2File, func(p string) bool {
		_, err := os.Stat(p)
		return err == nil
	})
}

// Find picks, from a /proc/<pid>/cgroup text (cgroups(7): one
// "ID:controllers:path" line per hierarchy, "0::path" for v2), the
// directory of the process's cgroup for controller (its v1 name:
// "memory", "cpuacct"):
//   - the v1 hierarchy that has controller, if one does, mounted at
//     /sys/fs/cgroup/<its controllers, comma-joined> (how systemd mounts
//     co-mounted ones, such as "cpu,cpuacct");
//   - else the v2 one, under the first of /sys/fs/cgroup/unified (hybrid)
//     and /sys/fs/cgroup (v2 only) where exists says v2File is: a v2
//     cgroup without the controller enabled has no such file.
//
// v2 says which of the two it is, since their files differ.
func Find(text, controller, v2File string, exists func(string) bool) (dir string, v2 bool, err error) {
	var unified string
	for _, line := range strings.Split(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				if parts[2] == "/" {
					return "", false, fmt.Errorf("%w of %s", ErrRoot, controller)
				}
				return filepath.Join("/sys/fs/cgroup", parts[1], parts[2]), false, nil
			}
		}
		if parts[0] == "0" {
			unified = parts[2]
		}
	}
	if unified == "/" {
		return "", false, fmt.Errorf("%w of v2, and no v1 %s hierarchy", ErrRoot, controller)
	}
	if unified == "" {
		return "", false, fmt.Errorf("the process is in no %s cgroup, v1 or v2", controller)
	}
	for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		d := filepath.Join(root, unified)
		if exists(filepath.Join(d, v2File)) {
			return d, true, nil
		}
	}
	return "", false, fmt.Errorf("the process's v2 cgroup %s has no %s (the %s controller is not enabled there)", unified, v2File, controller)
}
