// Package demo builds the rootfs directories of the built-in demo templates
// ("web", "app64", "node", "nginx" and "base").
//
// "web", "app64", "nginx" and "base" are Debian 12 installed from Debian's
// packages by mmdebstrap, as Debian's own images are (debian.go): what
// FROM debian:bookworm-slim with the demo's packages would give (python3;
// python3-numpy for app64; nginx). They need mmdebstrap on the host, root,
// and Debian's mirror (deb.debian.org); downloads are kept in AptCacheDir.
//
// "node" runs NodeSource's Node.js 20, which Debian 12 does not have (its
// nodejs is 18): its rootfs is the host's /usr/bin/node with every shared
// library it needs (found by reading PT_INTERP, DT_NEEDED and DT_RUNPATH
// with debug/elf, and searched like the dynamic linker does, copy.go), and
// the skeleton runsc needs (/proc, /dev, /sys, /tmp, a minimal /etc).
//
// Each demo adds its own server files: /srv/app.py, /srv/app.js or
// /etc/nginx/nginx.conf. Every server speaks the same small HTTP protocol
// on port 8000: GET / answers "count=N pid=P" with N kept in the server's
// memory, GET /healthz answers "ok".
//
// "base" is no server: it is the default template the E2B SDK assumes, a
// Debian userland (bash, coreutils, python3 with pip, sudo) with a user
// "user" who may sudo, whose sandboxes run envd as their init and serve no
// port (base.go).
package demo

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// Port is the TCP port every demo server listens on inside its sandbox.
const Port = 8000

// heapMiB is the size of the resident numpy array of the app64 demo.
const heapMiB = 64

//go:embed app.py
var appScript string

//go:embed app.js
var nodeScript string

//go:embed nginx.conf
var nginxConf string

// Demo describes a built demo template: how to start its process.
type Demo struct {
	// Name is the demo name ("web", "app64", "node", "nginx" or "base").
	Name string
	// Args is the process command line, absolute paths inside the rootfs.
	Args []string
	// Env is the process environment, "KEY=value" entries. The Python and
	// Node.js servers also honour PORT=<n> to listen on another port (tests
	// use this); nginx ignores it and listens where /etc/nginx/nginx.conf
	// says (a later "-c FILE" argument names another configuration).
	Env []string
	// Ports are the TCP ports the server listens on (0.0.0.0); none for
	// base.
	Ports []int
	// Envd, when set, is the template's api.Process.Envd: envd is the
	// sandbox's init, with the process as its child.
	Envd *api.Envd
	// Warm, when set, is the template's api.TemplateRequest.Warm: how it
	// is made warm when registered.
	Warm *api.Warm
}

// demoSpec is the static description of one demo.
type demoSpec struct {
	// packages are the Debian packages the demo needs installed on the
	// host: Packages returns them and Build checks them before writing
	// anything.
	packages []string
	// debian, when set, is how the rootfs is installed from Debian's
	// packages (buildDebian); hostFiles is then unused.
	debian *debianSpec
	// hostFiles are single host paths copied with the libraries they need:
	// the one executable of a package the demo uses that Debian's mirror
	// does not have.
	hostFiles []string
	// args and env are the process's (Demo.Args, Demo.Env).
	args, env []string
	// ports, envd and warm are Demo.Ports, Demo.Envd and Demo.Warm.
	ports []int
	envd  *api.Envd
	warm  *api.Warm
	// asRoot: the rootfs holds files that only root can make (a setuid
	// root executable, files owned by other users), so Build refuses to
	// run as anyone else rather than make a rootfs that breaks inside.
	asRoot bool
	// files returns the demo's own files, written last. root is the
	// rootfs, for files derived from what was copied into it.
	files func(root string) ([]rootFile, error)
}

// rootFile is a file, directory or symlink Build writes into the rootfs,
// replacing anything copied at that path (a directory is kept, with its
// contents, and given mode and owner).
type rootFile struct {
	path string // relative to the rootfs root
	mode os.FileMode
	data string
	link string // when set, a symlink with this target instead of data
	dir  bool   // when set, a directory instead of data
	// chown: owned by uid:gid, not by the user running Build.
	chown    bool
	uid, gid int
}

// debianHost is what the host needs to build a Debian demo.
var debianHost = []string{"mmdebstrap"}

// pythonDemo is a demo serving app.py; heap is its HEAP_MIB (0: no numpy
// array), and extra are packages beyond Debian's python3.
func pythonDemo(heap int, extra ...string) demoSpec {
	return demoSpec{
		packages: debianHost,
		debian:   &debianSpec{include: append([]string{"python3"}, extra...)},
		asRoot:   true,
		args:     []string{"/usr/bin/python3", "/srv/app.py"},
		ports:    []int{Port},
		env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=/root",
			"LANG=C.UTF-8",
			"PYTHONUNBUFFERED=1",
			"PYTHONDONTWRITEBYTECODE=1",
		},
		files: func(string) ([]rootFile, error) {
			script := strings.Replace(appScript, "HEAP_MIB = 0 ", fmt.Sprintf("HEAP_MIB = %d ", heap), 1)
			if !strings.Contains(script, fmt.Sprintf("HEAP_MIB = %d ", heap)) {
				return nil, errors.New("demo: embedded app.py lacks the HEAP_MIB line")
			}
			return []rootFile{{path: "srv/app.py", mode: 0o644, data: script}}, nil
		},
	}
}

var demos = map[string]demoSpec{
	"web":   pythonDemo(0),
	"app64": pythonDemo(heapMiB, "python3-numpy"),
	"node": {
		packages: []string{"nodejs"},
		// The nodejs package also ships npm, corepack and the C++ headers
		// (5,372 paths, 64 MiB besides node, in NodeSource's 20.20.2); the
		// server needs only the executable, which in that build carries
		// its JavaScript library and ICU data (process.config:
		// node_shared false, icu_data_in set).
		hostFiles: []string{"/usr/bin/node"},
		args:      []string{"/usr/bin/node", "/srv/app.js"},
		ports:     []int{Port},
		env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=/root",
			// libuv (1.46 in Node 20) does file I/O through io_uring when
			// the kernel offers it; runsc offers it only with --iouring.
			// 0 keeps libuv on its thread pool, the same everywhere.
			"UV_USE_IO_URING=0",
		},
		files: staticFiles(rootFile{path: "srv/app.js", mode: 0o644, data: nodeScript}),
	},
	"nginx": {
		packages: debianHost,
		// Debian's configuration is replaced by nginx.conf, which needs
		// no module, mime.types or other include.
		debian: &debianSpec{include: []string{"nginx"}},
		asRoot: true,
		// -e: log to stderr from startup on, before the configuration is
		// read (Debian builds with --error-log-path=stderr; this does not
		// depend on it).
		args:  []string{"/usr/sbin/nginx", "-e", "stderr", "-c", "/etc/nginx/nginx.conf"},
		ports: []int{Port},
		env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		files: staticFiles(rootFile{path: "etc/nginx/nginx.conf", mode: 0o644, data: nginxConf}),
	},
	"base": baseDemo,
	// E2B's name for its code interpreter template.
	"code-interpreter": interpreterDemo,
}

// staticFiles is a demoSpec.files for fixed files.
func staticFiles(fs ...rootFile) func(string) ([]rootFile, error) {
	return func(string) ([]rootFile, error) { return fs, nil }
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
// host, suitable for "apt-get install -y": mmdebstrap for a demo installed
// from Debian's packages, nodejs for node. It returns nil for an unknown
// name.
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
// A Debian demo is installed from Debian's packages (buildDebian: a few
// seconds' download the first time, none after, then about half a minute
// of dpkg), owned as Debian owns it; node's is copied from the host
// (/usr/bin/node and the libraries it needs, a minimal /etc, empty /proc,
// /dev, /sys and /tmp) and owned by the calling user. Then the demo's own
// files are written (/srv/app.py, /srv/app.js, /etc/nginx/nginx.conf, or
// base's configuration).
//
// Errors: an unknown name; dir not empty or not a directory; a
// *MissingPackagesError when a package is not installed on the host, or a
// demo that must be built as root built by another user (both checked
// before anything is written); mmdebstrap failing (ErrUpstream: the mirror
// unreachable, a package missing) or timing out (ErrTimeout); a library
// needed by an ELF file that cannot be found; any I/O error. On error
// everything Build wrote is removed (and dir itself, if Build created it),
// unless something is still mounted under dir: then nothing is removed and
// the error says so.
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
	err = checkInstalled(name, spec.packages)
	if err == nil && spec.asRoot && os.Geteuid() != 0 {
		err = errdefs.New(errdefs.ErrForbidden, "demo %q: build it as root: dpkg gives its files to root and other users (a setuid-root sudo in base)", name)
	}
	if err == nil {
		err = build(dir, spec)
	}
	if err != nil {
		if merr := cleanup(dir, created); merr != nil {
			return Demo{}, errors.Join(err, merr)
		}
		return Demo{}, err
	}
	return describe(name, spec), nil
}

// Describe is how demo name runs, for a rootfs Build made before (a
// benchmark given a test's rootfs).
func Describe(name string) (Demo, error) {
	spec, ok := demos[name]
	if !ok {
		return Demo{}, fmt.Errorf("demo: unknown demo %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return describe(name, spec), nil
}

func describe(name string, spec demoSpec) Demo {
	d := Demo{
		Name:  name,
		Args:  slices.Clone(spec.args),
		Env:   slices.Clone(spec.env),
		Ports: slices.Clone(spec.ports),
	}
	if spec.envd != nil {
		e := *spec.envd
		d.Envd = &e
	}
	if spec.warm != nil {
		w := *spec.warm
		w.Reseed.Command = slices.Clone(w.Reseed.Command)
		d.Warm = &w
	}
	return d
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

// cleanup removes what a failed build wrote, unless something is mounted
// under dir (mmdebstrap's mounts are in its own namespace, so this would
// be someone else's): removing would delete through the mount.
func cleanup(dir string, created bool) error {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err == nil {
		if err := mountedUnder(abs); err != nil {
			return err
		}
	}
	if created {
		os.RemoveAll(dir)
		return nil
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
	return nil
}

func build(dir string, spec demoSpec) error {
	if spec.debian != nil {
		return buildDebian(dir, spec)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	b := newCopier(dir)
	for _, f := range spec.hostFiles {
		if err := b.add(f); err != nil {
			return err // the demo's executable: missing is an error
		}
	}
	if err := b.resolveLibraries(); err != nil {
		return err
	}
	if err := b.addUnwinder(); err != nil {
		return err
	}
	if err := writeSkeleton(dir); err != nil {
		return err
	}
	own, err := spec.files(dir)
	if err != nil {
		return err
	}
	return writeFiles(dir, own)
}

// writeSkeleton adds what runsc and every demo need besides copied files.
func writeSkeleton(dir string) error {
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
	return writeFiles(dir, []rootFile{
		// root runs every server. nobody/nogroup are the accounts programs
		// fall back to (nginx's compiled-in "user", for one).
		{path: "etc/passwd", mode: 0o644, data: "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
		{path: "etc/group", mode: 0o644, data: "root:x:0:\nnogroup:x:65534:\n"},
		{path: "etc/hosts", mode: 0o644, data: "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{path: "etc/nsswitch.conf", mode: 0o644, data: "passwd: files\ngroup: files\nhosts: files dns\n"},
		{path: "etc/hostname", mode: 0o644, data: "sandstorm\n"},
	})
}

// writeFiles writes fs into the rootfs at dir, creating parent directories
// (mode 0755) and replacing whatever is at each path, but a directory
// where a directory is asked for.
func writeFiles(dir string, fs []rootFile) error {
	for _, f := range fs {
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if fi, err := os.Lstat(p); err == nil && !(f.dir && fi.IsDir()) {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
		}
		var err error
		switch {
		case f.link != "":
			err = os.Symlink(f.link, p)
		case f.dir:
			err = os.MkdirAll(p, 0o755)
		default:
			err = os.WriteFile(p, []byte(f.data), f.mode)
		}
		if err == nil && f.chown {
			err = os.Lchown(p, f.uid, f.gid)
		}
		if err == nil && f.link == "" {
			// After the chown, which clears setuid and setgid bits; and
			// WriteFile's and MkdirAll's modes are masked by the umask.
			err = os.Chmod(p, f.mode)
		}
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	return nil
}
