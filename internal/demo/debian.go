package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/mountinfo"
)

// A Debian demo's rootfs is made the way Debian makes its own images:
// mmdebstrap installs Debian 12 (bookworm) from Debian's mirror into it,
// the minbase variant (Essential packages, apt and Priority: required,
// as in the debian:bookworm image) plus the demo's packages, with
// debian:bookworm-slim's dpkg path excludes (no documentation but the
// copyright files, no man or info pages, no translations). Maintainer
// scripts run as on any Debian machine: bytecode compiled by py3compile,
// ca-certificates' bundle, PAM's common-* files, users made by useradd.

// debianSpec is how a demo is installed from Debian's packages.
type debianSpec struct {
	// include are the packages beyond minbase (their dependencies come
	// with them, their recommendations do not).
	include []string
	// customize are shell commands mmdebstrap runs once the packages are
	// installed, "$1" the rootfs (chroot "$1" CMD runs CMD inside).
	customize []string
}

// Suite is the Debian release demo rootfs are made of.
const Suite = "bookworm"

// sources are the apt sources of a Debian demo: the release, its updates
// and its security updates, from the mirror Debian's images use (the one
// this project's machines install from too).
var sources = []string{
	"deb http://deb.debian.org/debian " + Suite + " main",
	"deb http://deb.debian.org/debian " + Suite + "-updates main",
	"deb http://deb.debian.org/debian-security " + Suite + "-security main",
}

// AptCacheDir keeps the .deb files and package lists of past Debian demo
// builds, so that the next build downloads only what changed on the
// mirror (apt checks each cached file's hash against the signed lists
// before it uses it). Builds that share it run one at a time.
const AptCacheDir = "/var/cache/sandstorm/apt"

// sourceDateEpoch is Debian 12's release day (2023-06-10). Maintainer
// scripts that stamp a time use it instead of the build's (useradd's
// last password change; py3compile then writes hash-checked bytecode,
// which costs a sandbox's Python start nothing measurable), so two builds
// from the same mirror state differ less.
const sourceDateEpoch = "1686355200"

// mmdebstrapTimeout bounds one build: about 30 s to 1 min measured on 2
// cores, downloads included; 20 min is room for a slow mirror.
const mmdebstrapTimeout = 20 * time.Minute

// slimExcludes are debian:bookworm-slim's dpkg filters (debuerreotype's
// --slimify). Given with --dpkgopt they stay in the rootfs's
// /etc/dpkg/dpkg.cfg.d, so packages installed in a sandbox later are slim
// too.
var slimExcludes = []string{
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
	"path-exclude=/usr/share/groff/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/linda/*",
	"path-exclude=/usr/share/lintian/overrides/*",
	"path-exclude=/usr/share/locale/*",
	"path-exclude=/usr/share/man/*",
}

// mmdebstrapArgs is the command line installing d into dir, with cache
// as the apt cache.
func mmdebstrapArgs(dir string, d debianSpec, cache string) []string {
	archives, lists := filepath.Join(cache, "archives"), filepath.Join(cache, "lists")
	args := []string{
		// unshare as root: the real uids (no user namespace), but the
		// mounts mmdebstrap makes in the rootfs (/proc, /sys, /dev) are in
		// a mount namespace of its own, gone with its processes however
		// they end; never on the host, where a build killed half-way
		// would leave them for the cleanup to delete through. It also
		// leaves /dev empty: runsc gives each sandbox its own.
		"--mode=unshare", "--variant=minbase", "--format=directory",
		// Merged /usr the way debootstrap (and so debian:bookworm) makes
		// it, directory symlinks and usr-is-merged; without it bookworm's
		// init-system-helpers pulls in usrmerge, and with it perl (55 MiB).
		"--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
		// dpkg syncs every file it writes unless told not to; a build cut
		// short is thrown away anyway (Debian's docker images set it too).
		"--dpkgopt=force-unsafe-io",
		// Keep the downloaded essential packages for the cache.
		"--skip=essential/unlink",
		"--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives \"$1\"/var/lib/apt/lists",
		"--setup-hook=sync-in " + archives + " /var/cache/apt/archives/",
		"--setup-hook=sync-in " + lists + " /var/lib/apt/lists/",
		// The slim filters leave no /usr/share/man/man1, where a JRE's
		// postinst links its man pages' alternatives: without it,
		// openjdk-17-jre-headless fails to configure, here and when
		// installed in a sandbox later (as in debian:bookworm-slim,
		// Debian bug #863199; its Dockerfiles make the directory too).
		"--setup-hook=mkdir -p \"$1\"/usr/share/man/man1",
	}
	for _, o := range slimExcludes {
		args = append(args, "--dpkgopt="+o)
	}
	if len(d.include) > 0 {
		args = append(args, "--include="+strings.Join(d.include, ","))
	}
	for _, c := range d.customize {
		args = append(args, "--customize-hook="+c)
	}
	args = append(args,
		"--customize-hook=sync-out /var/cache/apt/archives "+archives,
		"--customize-hook=sync-out /var/lib/apt/lists "+lists,
		Suite, dir)
	return append(args, sources...)
}

// debootstrap installs d into dir (absent or empty) with mmdebstrap,
// using and refreshing the apt cache at cache.
func debootstrap(dir string, d debianSpec, cache string) error {
	for _, sub := range []string{"archives", "lists"} {
		if err := os.MkdirAll(filepath.Join(cache, sub), 0o755); err != nil {
			return fmt.Errorf("demo: apt cache: %w", err)
		}
	}
	unlock, err := lockDir(cache)
	if err != nil {
		return err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), mmdebstrapTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mmdebstrap", mmdebstrapArgs(dir, d, cache)...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+sourceDateEpoch)
	// Its own process group, so that a timeout ends apt and dpkg too,
	// not only mmdebstrap (they would go on writing into dir while the
	// cleanup removes it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if ctx.Err() != nil {
		return errdefs.New(errdefs.ErrTimeout, "demo: mmdebstrap did not finish in %s and was killed (is http://deb.debian.org reachable?): %s", mmdebstrapTimeout, out.String())
	}
	if err != nil {
		return errdefs.New(errdefs.ErrUpstream, "demo: mmdebstrap %s into %s: %v (its output ends: %s)", Suite, dir, err, out.String())
	}
	return nil
}

// lockDir takes an exclusive lock on dir/.lock, waiting for it: two
// builds writing the same cache at once could each see the other's
// half-written file.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("demo: apt cache lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("demo: apt cache lock: %w", err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// tailMax is how much of mmdebstrap's output an error quotes: its last
// lines say what failed.
const tailMax = 4 << 10

// tail keeps the last tailMax bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - tailMax; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// buildDebian makes a Debian demo's rootfs in dir and writes the demo's
// own files into it.
func buildDebian(dir string, spec demoSpec) error {
	// Absolute: mmdebstrap would take a relative one starting with "-"
	// for an option.
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	// mmdebstrap takes an empty directory, but not one whose parent is
	// missing.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := debootstrap(dir, *spec.debian, AptCacheDir); err != nil {
		return err
	}
	// mmdebstrap copies the build machine's resolver configuration; each
	// sandbox gets its own (its boundary's), and a template must not
	// carry this machine's.
	if err := os.Remove(filepath.Join(dir, "etc", "resolv.conf")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("demo: %w", err)
	}
	if err := writeFiles(dir, debianSkeleton); err != nil {
		return err
	}
	own, err := spec.files(dir)
	if err != nil {
		return err
	}
	return writeFiles(dir, own)
}

// debianSkeleton replaces what mmdebstrap copies from the build machine
// (its hostname) and adds /etc/hosts, which minbase lacks (netbase ships
// it).
var debianSkeleton = []rootFile{
	{path: "etc/hostname", mode: 0o644, data: "sandstorm\n"},
	{path: "etc/hosts", mode: 0o644, data: "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
}

// mountedUnder reports an error when anything is mounted at or below dir:
// removing dir would then delete through the mount.
func mountedUnder(dir string) error {
	if m := mountinfo.Under(dir); len(m) > 0 {
		return errdefs.New(errdefs.ErrPrecondition, "demo: %s is still mounted under %s; unmount it (umount -R) and remove the directory by hand", strings.Join(m, ", "), dir)
	}
	return nil
}
