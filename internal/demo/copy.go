package demo

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// copier replicates host paths into a rootfs at the same absolute paths.
//
// Symlinks are recreated verbatim (same target text) and their targets are
// copied too, and so is every symlinked directory on the way to a file (for
// example /lib -> usr/lib on merged-/usr systems). Since the rootfs mirrors
// the host's links, every path resolves inside the rootfs exactly as it
// does on the host: /usr/lib/x86_64-linux-gnu/libblas.so.3 ->
// /etc/alternatives/libblas.so.3-x86_64-linux-gnu -> .../blas/libblas.so.3
// all end up present.
type copier struct {
	root string
	// seen holds host paths (as requested, cleaned) already handled.
	seen map[string]bool
	// elfs are copied ELF files (canonical host paths) not yet scanned.
	elfs []string
	// match caches, per host path, whether it is an ELF file of the
	// machine and class being resolved.
	match map[string]bool
}

func newCopier(root string) *copier {
	return &copier{root: root, seen: make(map[string]bool), match: make(map[string]bool)}
}

// add copies the host path p (absolute) into the rootfs, with its symlinked
// parent directories and, for a symlink, its target. Directories are created
// but not filled. It returns an error wrapping fs.ErrNotExist if p does not
// exist on the host.
func (c *copier) add(p string) error {
	p = filepath.Clean(p)
	if c.seen[p] || p == "/" {
		return nil
	}
	c.seen[p] = true

	// Replicate symlinked ancestors first (e.g. /lib -> usr/lib).
	for anc := filepath.Dir(p); anc != "/"; anc = filepath.Dir(anc) {
		fi, err := os.Lstat(anc)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if err := c.add(anc); err != nil {
				return err
			}
		}
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	real := filepath.Join(parent, filepath.Base(p))
	fi, err := os.Lstat(real)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	dst := filepath.Join(c.root, real)
	if _, err := os.Lstat(dst); err == nil {
		return nil // reached before under another name
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}

	switch mode := fi.Mode(); {
	case mode.IsDir():
		if err := os.Mkdir(dst, mode.Perm()); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		return os.Chmod(dst, mode&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid))
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(real)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if err := os.Symlink(target, dst); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(parent, target)
		}
		// A dangling link stays dangling, as on the host.
		if err := c.add(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	case mode.IsRegular():
		isELF, err := copyFile(real, dst, fi)
		if err != nil {
			return err
		}
		if isELF {
			c.elfs = append(c.elfs, real)
		}
		return nil
	default:
		return nil // devices, fifos, sockets: never part of a rootfs copy
	}
}

// copyFile copies a regular file with its permission bits and times, and
// reports whether it is an ELF file.
func copyFile(src, dst string, fi fs.FileInfo) (isELF bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("demo: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, fmt.Errorf("demo: %w", err)
	}
	var magic [4]byte
	n, _ := io.ReadFull(in, magic[:])
	isELF = n == 4 && bytes.Equal(magic[:], []byte(elf.ELFMAG))
	if _, err = out.Write(magic[:n]); err == nil {
		_, err = io.Copy(out, in)
	}
	if err == nil {
		err = out.Chmod(fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky))
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		atime := fi.ModTime()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			atime = timespecTime(st.Atim)
		}
		err = os.Chtimes(dst, atime, fi.ModTime())
	}
	if err != nil {
		return false, fmt.Errorf("demo: copy %s: %w", src, err)
	}
	return isELF, nil
}

// resolveLibraries copies, transitively, the dynamic linker and every
// DT_NEEDED library of every ELF file copied so far.
func (c *copier) resolveLibraries() error {
	for len(c.elfs) > 0 {
		p := c.elfs[len(c.elfs)-1]
		c.elfs = c.elfs[:len(c.elfs)-1]
		if err := c.resolveELF(p); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) resolveELF(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return nil // ELF magic but not a loadable object we understand
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			return fmt.Errorf("demo: %s: read PT_INTERP: %w", p, err)
		}
		interp := string(bytes.TrimRight(b, "\x00"))
		if err := c.add(interp); err != nil {
			return fmt.Errorf("demo: %s: dynamic linker %s: %w", p, interp, err)
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil || len(needed) == 0 {
		return nil // static, or no dynamic section
	}
	dirs := c.searchPath(f, p)
	for _, lib := range needed {
		found := ""
		if strings.Contains(lib, "/") {
			found = lib
		} else {
			for _, d := range dirs {
				if cand := filepath.Join(d, lib); c.matches(cand, f) {
					found = cand
					break
				}
			}
		}
		if found == "" {
			return fmt.Errorf("demo: %s needs %s, which is not in %s", p, lib, strings.Join(dirs, ":"))
		}
		if err := c.add(found); err != nil {
			return fmt.Errorf("demo: %s needs %s: %w", p, lib, err)
		}
	}
	return nil
}

// searchPath returns the directories the dynamic linker searches for the
// libraries of f (at host path p): DT_RPATH (when there is no DT_RUNPATH),
// DT_RUNPATH, then the system directories. ld.so.cache entries outside
// those are not used: the rootfs has no cache.
func (c *copier) searchPath(f *elf.File, p string) []string {
	var dirs []string
	rpath, _ := f.DynString(elf.DT_RUNPATH)
	if len(rpath) == 0 {
		rpath, _ = f.DynString(elf.DT_RPATH)
	}
	origin := filepath.Dir(p)
	for _, rp := range rpath {
		for d := range strings.SplitSeq(rp, ":") {
			d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", origin), "$ORIGIN", origin)
			if filepath.IsAbs(d) {
				dirs = append(dirs, filepath.Clean(d))
			}
		}
	}
	if t := multiarch(f); t != "" {
		dirs = append(dirs, "/lib/"+t, "/usr/lib/"+t)
	}
	return append(dirs, "/lib", "/usr/lib")
}

// multiarch returns the Debian multiarch triplet for f's machine.
func multiarch(f *elf.File) string {
	switch {
	case f.Machine == elf.EM_X86_64 && f.Class == elf.ELFCLASS64:
		return "x86_64-linux-gnu"
	case f.Machine == elf.EM_AARCH64:
		return "aarch64-linux-gnu"
	case f.Machine == elf.EM_386:
		return "i386-linux-gnu"
	case f.Machine == elf.EM_ARM:
		return "arm-linux-gnueabihf"
	case f.Machine == elf.EM_RISCV && f.Class == elf.ELFCLASS64:
		return "riscv64-linux-gnu"
	}
	return ""
}

// matches reports whether cand exists and is an ELF object of the same
// machine and class as f (the dynamic linker skips mismatches too).
func (c *copier) matches(cand string, f *elf.File) bool {
	key := fmt.Sprintf("%s|%v|%v", cand, f.Machine, f.Class)
	if m, ok := c.match[key]; ok {
		return m
	}
	g, err := elf.Open(cand)
	m := err == nil && g.Machine == f.Machine && g.Class == f.Class
	if err == nil {
		g.Close()
	}
	c.match[key] = m
	return m
}

func timespecTime(ts syscall.Timespec) time.Time {
	return time.Unix(ts.Sec, ts.Nsec)
}

// addUnwinder copies libgcc_s.so.1 next to every libc.so.6 in the rootfs.
// glibc loads it with dlopen (it is no DT_NEEDED of anything, so
// resolveLibraries cannot find it) to unwind a thread that exits or is
// cancelled; without it a program whose threads end at exit aborts:
// "libgcc_s.so.1 must be installed for pthread_exit to work" (seen in
// TestWebRootfs when the Python server's handler threads ended on SIGTERM).
func (c *copier) addUnwinder() error {
	var libcs []string
	for _, pat := range []string{"lib*/*/libc.so.6", "usr/lib*/*/libc.so.6", "lib*/libc.so.6", "usr/lib*/libc.so.6"} {
		m, _ := filepath.Glob(filepath.Join(c.root, pat))
		libcs = append(libcs, m...)
	}
	for _, l := range libcs {
		dir := strings.TrimPrefix(filepath.Dir(l), c.root)
		host := filepath.Join(dir, "libgcc_s.so.1")
		if _, err := os.Stat(host); err != nil {
			continue
		}
		if err := c.add(host); err != nil {
			return err
		}
	}
	return c.resolveLibraries()
}
