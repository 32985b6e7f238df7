// Package demo builds the rootfs directories of the built-in demo templates
// ("web" and "app64") from the Debian packages installed on the host, with
// no container registry and no network access.
//
// A demo rootfs holds the files of a few Debian packages (the Python 3.11
// interpreter and standard library, plus numpy for app64), every shared
// library their ELF files need (found by reading PT_INTERP, DT_NEEDED and
// DT_RUNPATH with debug/elf, and searched like the dynamic linker does), the
// skeleton runsc needs (/proc, /dev, /sys, /tmp, a minimal /etc) and the
// server script /srv/app.py.
package demo

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Port is the TCP port every demo server listens on inside its sandbox.
const Port = 8000

// heapMiB is the size of the resident numpy array of the app64 demo.
const heapMiB = 64

//go:embed app.py
var appScript string

// Demo describes a built demo template: how to start its process.
type Demo struct {
	// Name is the demo name ("web" or "app64").
	Name string
	// Args is the process command line, absolute paths inside the rootfs.
	Args []string
	// Env is the process environment, "KEY=value" entries. The server also
	// honours PORT=<n> to listen on another port (tests use this).
	Env []string
	// Ports are the TCP ports the server listens on (0.0.0.0).
	Ports []int
}

// demoSpec is the static description of one demo.
type demoSpec struct {
	packages []string
	heapMiB  int
}

var demos = map[string]demoSpec{
	"web": {
		packages: []string{"python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib"},
	},
	"app64": {
		packages: []string{"python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "python3-numpy"},
		heapMiB:  heapMiB,
	},
}

// Names returns the known demo names, sorted.
func Names() []string {
	names := make([]string, 0, len(demos))
	for n := range demos {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Packages lists the Debian packages the named demo needs installed on the
// host, suitable for "apt-get install -y". It returns nil for an unknown
// name. Shared libraries those packages depend on (libc, libexpat, libblas,
// ...) are installed by apt as their dependencies and need not be listed.
func Packages(name string) []string {
	d, ok := demos[name]
	if !ok {
		return nil
	}
	return slices.Clone(d.packages)
}

// MissingPackagesError is returned by Build when Debian packages a demo
// needs are not installed on the host.
type MissingPackagesError struct {
	Demo     string
	Packages []string // the missing packages
}

func (e *MissingPackagesError) Error() string {
	return fmt.Sprintf("demo %q: Debian package(s) not installed: %s; install them with: apt-get install -y %s",
		e.Demo, strings.Join(e.Packages, ", "), strings.Join(e.Packages, " "))
}

// Build writes a self-contained rootfs for the named demo into dir, which is
// created (mode 0755) if missing and must otherwise be an empty directory.
// It copies the files of the demo's Debian packages from the host (except
// documentation, man pages and test suites), the shared libraries their ELF
// files need, a minimal /etc, empty /proc, /dev, /sys and /tmp, and the
// server script /srv/app.py. Everything is owned by the calling user.
//
// Errors: an unknown name; dir not empty or not a directory; a
// *MissingPackagesError when a package is not installed (checked before
// anything is written); a library needed by an ELF file that cannot be
// found; any I/O error. On error everything Build wrote is removed (and dir
// itself, if Build created it).
func Build(name, dir string) (Demo, error) {
	spec, ok := demos[name]
	if !ok {
		return Demo{}, fmt.Errorf("demo: unknown demo %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	if dir == "" {
		return Demo{}, errors.New("demo: empty destination directory")
	}
	created, err := prepareDir(dir)
	if err != nil {
		return Demo{}, err
	}
	files, err := packageFiles(name, spec.packages)
	if err == nil {
		err = build(dir, spec, files)
	}
	if err != nil {
		cleanup(dir, created)
		return Demo{}, err
	}
	return Demo{
		Name: name,
		Args: []string{"/usr/bin/python3", "/srv/app.py"},
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=/root",
			"LANG=C.UTF-8",
			"PYTHONUNBUFFERED=1",
			"PYTHONDONTWRITEBYTECODE=1",
		},
		Ports: []int{Port},
	}, nil
}

// prepareDir checks that dir is absent or an empty directory. It reports
// whether dir is absent (and so will be created by build).
func prepareDir(dir string) (absent bool, err error) {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("demo: %w", err)
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("demo: %s is not a directory", dir)
	}
	f, err := os.Open(dir)
	if err != nil {
		return false, fmt.Errorf("demo: %w", err)
	}
	defer f.Close()
	if names, _ := f.Readdirnames(1); len(names) > 0 {
		return false, fmt.Errorf("demo: destination %s is not empty", dir)
	}
	return false, nil
}

// cleanup removes what a failed build wrote.
func cleanup(dir string, created bool) {
	if created {
		os.RemoveAll(dir)
		return
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

func build(dir string, spec demoSpec, files []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	b := newCopier(dir)
	for _, f := range files {
		if skipPackagePath(f) {
			continue
		}
		if err := b.add(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			// A listed file may be missing when dpkg path-exclude is in
			// use (minimal images drop docs this way); anything else fails.
			return err
		}
	}
	if err := b.resolveLibraries(); err != nil {
		return err
	}
	return writeSkeleton(dir, spec)
}

// skipPackagePath reports whether a packaged file is left out of the rootfs:
// documentation, man/info pages, lintian overrides, and Python test suites.
func skipPackagePath(p string) bool {
	for _, pre := range []string{"/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/lintian"} {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	if strings.HasPrefix(p, "/usr/lib/python3/dist-packages/") {
		return slices.Contains(strings.Split(p, "/"), "tests")
	}
	return false
}

// writeSkeleton adds what runsc and Python need besides packaged files.
func writeSkeleton(dir string, spec demoSpec) error {
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"tmp", 0o777 | os.ModeSticky},
		{"etc", 0o755}, {"root", 0o700}, {"srv", 0o755}, {"usr/bin", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(dir, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	// /usr/bin/python3 belongs to python3-minimal; a relative link to the
	// interpreter from python3.11-minimal is all we need of it.
	py3 := filepath.Join(dir, "usr/bin/python3")
	if _, err := os.Lstat(py3); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink("python3.11", py3); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	script := strings.Replace(appScript, "HEAP_MIB = 0 ", fmt.Sprintf("HEAP_MIB = %d ", spec.heapMiB), 1)
	if !strings.Contains(script, fmt.Sprintf("HEAP_MIB = %d ", spec.heapMiB)) {
		return errors.New("demo: embedded app.py lacks the HEAP_MIB line")
	}
	files := []struct {
		path string
		mode os.FileMode
		data string
	}{
		{"etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
		{"etc/group", 0o644, "root:x:0:\nnogroup:x:65534:\n"},
		{"etc/hosts", 0o644, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"etc/nsswitch.conf", 0o644, "passwd: files\ngroup: files\nhosts: files dns\n"},
		{"etc/hostname", 0o644, "sandstorm\n"},
		{"srv/app.py", 0o644, script},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.path), []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	return nil
}
