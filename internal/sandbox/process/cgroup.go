package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandstorm/internal/mountinfo"
)

// Cgroup2Mount returns the absolute path where the cgroup v2 (unified)
// hierarchy is mounted. It reads /proc/self/mountinfo rather than assuming
// /sys/fs/cgroup because hybrid machines mount v2 at /sys/fs/cgroup/unified
// next to the v1 controllers; when mountinfo names no cgroup2 mount it falls
// back to /sys/fs/cgroup if statfs says that is cgroup2. The error says that
// no v2 hierarchy was found (or that mountinfo could not be read).
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup v2 mount: %w", err)
	}
	defer f.Close()
	if mnt, ok := cgroup2FromMountinfo(f); ok {
		return mnt, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return "/sys/fs/cgroup", nil
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted (no cgroup2 entry in /proc/self/mountinfo and /sys/fs/cgroup is not cgroup2)")
}

// cgroup2FromMountinfo returns the first mount point whose filesystem type
// is cgroup2.
func cgroup2FromMountinfo(r io.Reader) (string, bool) {
	for _, m := range mountinfo.Parse(r) {
		if m.FSType == "cgroup2" {
			return m.Point, true
		}
	}
	return "", false
}

// writeCgroupFile writes val to the control file name in cgroup dir, in the
// single write(2) that cgroup control files expect.
func writeCgroupFile(dir, name, val string) error {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(val), 0); err != nil {
		return fmt.Errorf("write %q to %s: %w", val, filepath.Join(dir, name), err)
	}
	return nil
}

// cgroupEvents is the content of a cgroup's cgroup.events file.
type cgroupEvents struct {
	Populated bool // some process is in the cgroup or a descendant
	Frozen    bool // the freezer has finished stopping every process
}

func parseCgroupEvents(data []byte) cgroupEvents {
	var ev cgroupEvents
	for _, line := range bytes.Split(data, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			continue
		}
		on := string(bytes.TrimSpace(v)) == "1"
		switch string(k) {
		case "populated":
			ev.Populated = on
		case "frozen":
			ev.Frozen = on
		}
	}
	return ev
}

// readCgroupEvents reads dir/cgroup.events.
func readCgroupEvents(dir string) (cgroupEvents, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return cgroupEvents{}, err
	}
	return parseCgroupEvents(data), nil
}

// waitCgroupEvents blocks until done(cgroup.events of dir) is true, ctx is
// cancelled, or timeout passes. It uses poll(2) with POLLPRI, which kernfs
// signals whenever cgroup.events changes, so it wakes as soon as the
// freezer or the last exiting process updates the file; the 10 ms poll
// timeout is only a safety net re-read in case a notification is missed.
func waitCgroupEvents(ctx context.Context, dir string, timeout time.Duration, done func(cgroupEvents) bool) error {
	path := filepath.Join(dir, "cgroup.events")
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 256)
	for {
		// Re-reading from offset 0 also re-arms kernfs' change
		// notification for this open file.
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if done(parseCgroupEvents(buf[:n])) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting on %s (last: %q)", timeout, path, strings.TrimSpace(string(buf[:n])))
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
		if _, err := unix.Poll(fds, 10); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("poll %s: %w", path, err)
		}
	}
}

// killCgroup SIGKILLs every process in dir (via cgroup.kill, so processes
// forked concurrently cannot escape), waits up to timeout for the cgroup to
// empty, then removes it. A missing cgroup is not an error.
func killCgroup(ctx context.Context, dir string, timeout time.Duration) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := writeCgroupFile(dir, "cgroup.kill", "1"); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // removed concurrently
		}
		return err
	}
	if err := waitCgroupEvents(ctx, dir, timeout, func(ev cgroupEvents) bool { return !ev.Populated }); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("kill cgroup: %w", err)
	}
	// rmdir can briefly return EBUSY right after the last task left
	// while the kernel finishes tearing down its css_set; retry a little.
	deadline := time.Now().Add(timeout)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
