// Package mountinfo reads the kernel's table of this process's mounts,
// /proc/self/mountinfo (proc(5)): where a sandbox's overlay is mounted,
// what a run left mounted under a directory, where cgroup v2 is.
package mountinfo

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of the table: where it is mounted, and its
// filesystem type.
type Mount struct {
	Point  string
	FSType string
}

// Parse reads mountinfo lines from r: ID PARENT MAJ:MIN ROOT MOUNTPOINT
// OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS. A line can be long (an
// overlay's options name every lower directory): up to 1 MiB is read.
func Parse(r io.Reader) []Mount {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		m := Mount{Point: Unescape(f[4])}
		for i := 5; i+1 < len(f); i++ {
			if f[i] == "-" {
				m.FSType = f[i+1]
				break
			}
		}
		out = append(out, m)
	}
	return out
}

// Read is this process's mounts, in the kernel's order (a mount after
// the one it is mounted over).
func Read() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f), nil
}

// Under is the mount points at or below dir, deepest first (nested
// mounts come off before their parents); none if the table cannot be
// read.
func Under(dir string) []string {
	ms, _ := Read()
	var out []string
	for i := len(ms) - 1; i >= 0; i-- {
		if p := ms[i].Point; p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// Is reports whether path is a mount point.
func Is(path string) bool {
	ms, _ := Read()
	for _, m := range ms {
		if m.Point == path {
			return true
		}
	}
	return false
}

// Unescape undoes the octal escapes the kernel writes paths with (\040
// for a space, \011, \012, \134).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
