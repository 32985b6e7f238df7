package ociimage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"sandstorm/internal/errdefs"
)

// maxLinks is how many symlinks one lookup may follow (Linux's own
// bound).
const maxLinks = 40

// maxAccountFile bounds /etc/passwd and /etc/group as read here.
const maxAccountFile = 4 << 20

// inRoot is the host path of p (absolute, as seen inside root) with every
// symlink on the way resolved as the sandbox would see it: inside root,
// an absolute target from root and ".." never above it. No host symlink
// is followed: each component is Lstat-ed below a prefix already known to
// hold none. A missing component, or one that is not a directory with
// more to come, is an error (fs.ErrNotExist, ENOTDIR): nothing lexical
// is appended that might cross a link later.
//
// The tree is one the node unpacked and nobody changes while it is read,
// so the checks and the later open see the same thing.
func inRoot(root, p string) (string, error) {
	resolved := "/"
	rest := p
	links := 0
	for rest != "" {
		var comp string
		comp, rest, _ = strings.Cut(rest, "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir(resolved)
			continue
		}
		next := path.Join(resolved, comp)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			links++
			if links > maxLinks {
				return "", &fs.PathError{Op: "resolve", Path: p, Err: unix.ELOOP}
			}
			target, err := os.Readlink(filepath.Join(root, next))
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(target, "/") {
				resolved = "/"
			}
			rest = target + "/" + rest
		case !fi.IsDir() && strings.Trim(rest, "/") != "":
			return "", &fs.PathError{Op: "resolve", Path: p, Err: unix.ENOTDIR}
		default:
			resolved = next
		}
	}
	return filepath.Join(root, resolved), nil
}

// ResolveExecutable is args0 as an absolute path inside the tree rootfs:
// args0 itself when absolute, else the first dir/args0 on pathList (a
// colon-separated PATH; relative entries are skipped) that is an
// executable regular file. Symlinks are resolved inside rootfs, never out
// of it; the path returned is the one found, not its link's target (a
// busybox applet goes by the name it is called). args0 relative with a
// slash is ErrBadInput (ImageConfig.Executable puts it under the working
// directory first); no such executable is ErrBadInput naming the PATH.
func ResolveExecutable(rootfs, args0, pathList string) (string, error) {
	switch {
	case args0 == "":
		return "", errdefs.New(errdefs.ErrBadInput, "no command to run: args[0] is empty")
	case strings.HasPrefix(args0, "/"):
		p := path.Clean(args0)
		if err := isExecutable(rootfs, p); err != nil {
			return "", errdefs.New(errdefs.ErrBadInput, "%s cannot be run in the image: %v", p, err)
		}
		return p, nil
	case strings.Contains(args0, "/"):
		return "", errdefs.New(errdefs.ErrBadInput, "%q is relative: it is found under the working directory, not on the PATH", args0)
	}
	for _, dir := range strings.Split(pathList, ":") {
		if !strings.HasPrefix(dir, "/") {
			continue
		}
		p := path.Join(dir, args0)
		if isExecutable(rootfs, p) == nil {
			return p, nil
		}
	}
	return "", errdefs.New(errdefs.ErrBadInput, "%q is not an executable file on the image's PATH (%s): give its absolute path", args0, pathList)
}

// isExecutable says why p, inside rootfs, is not a file one can run.
func isExecutable(rootfs, p string) error {
	host, err := inRoot(rootfs, p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errors.New("no such file")
		}
		return err
	}
	fi, err := os.Lstat(host)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return errors.New("not a regular file")
	case fi.Mode().Perm()&0o111 == 0:
		return errors.New("not executable")
	}
	return nil
}

// LookupUser reads user — "", "name", "uid", "name:group", "uid:gid" or a
// mix — against etc/passwd and etc/group inside rootfs, resolved as
// inRoot does. A numeric uid needs no entry (gid 0, home "/" then); a
// name must have one; gid is the entry's unless a group is given; "" is
// root.
func LookupUser(rootfs, user string) (uid, gid uint32, home string, err error) {
	name, group, hasGroup := strings.Cut(user, ":")
	if name == "" {
		if hasGroup {
			return 0, 0, "", errdefs.New(errdefs.ErrBadInput, "user %q names no user before its ':'", user)
		}
		name = "0"
	}
	passwd, err := readAccounts(rootfs, "/etc/passwd")
	if err != nil {
		return 0, 0, "", err
	}
	home = "/"
	n, numeric := parseID(name)
	var found bool
	for _, f := range passwd {
		if len(f) < 7 || (numeric && f[2] != strconv.FormatUint(uint64(n), 10)) || (!numeric && f[0] != name) {
			continue
		}
		u, ok1 := parseID(f[2])
		g, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			return 0, 0, "", errdefs.New(errdefs.ErrBadInput, "the image's /etc/passwd entry of %q has no valid uid and gid", name)
		}
		uid, gid, home, found = u, g, f[5], true
		break
	}
	switch {
	case found:
	case numeric:
		uid, gid = n, 0
	default:
		return 0, 0, "", errdefs.New(errdefs.ErrBadInput, "user %q is not in the image's /etc/passwd: give a uid or add the user", name)
	}
	if hasGroup {
		gid, err = lookupGroup(rootfs, group)
		if err != nil {
			return 0, 0, "", err
		}
	}
	if home == "" {
		home = "/"
	}
	return uid, gid, home, nil
}

func lookupGroup(rootfs, group string) (uint32, error) {
	if g, ok := parseID(group); ok {
		return g, nil
	}
	groups, err := readAccounts(rootfs, "/etc/group")
	if err != nil {
		return 0, err
	}
	for _, f := range groups {
		if len(f) >= 3 && f[0] == group {
			if g, ok := parseID(f[2]); ok {
				return g, nil
			}
		}
	}
	return 0, errdefs.New(errdefs.ErrBadInput, "group %q is not in the image's /etc/group: give a gid or add the group", group)
}

// parseID reads a uid or gid; (uint32)-1 means "unchanged" to the kernel,
// never an id.
func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == math.MaxUint32 {
		return 0, false
	}
	return uint32(n), true
}

// readAccounts is the colon-separated lines of a file like /etc/passwd
// inside rootfs (none when it is absent). It must be a regular file: a
// fifo would block, a device be read on the host.
func readAccounts(rootfs, file string) ([][]string, error) {
	data, err := readInRoot(rootfs, file, maxAccountFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "reading the image's %s: %v", file, err)
	}
	var lines [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, maxAccountFile)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lines = append(lines, strings.Split(line, ":"))
	}
	return lines, sc.Err()
}

// readInRoot reads the regular file p inside rootfs, at most max bytes.
func readInRoot(rootfs, p string, max int64) ([]byte, error) {
	host, err := inRoot(rootfs, p)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(host, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), host)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is over %d bytes", p, max)
	}
	return data, nil
}
