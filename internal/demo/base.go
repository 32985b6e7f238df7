package demo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"sandstorm/api"
	"sandstorm/internal/envd"
)

// The base demo is the template the E2B SDK starts when it is given none
// ("base"): a Debian userland in which the SDK's commands run as "user"
// (uid 1000, home /home/user), who may sudo without a password. Its
// sandboxes run envd as their init (api.Process.Envd) so that the
// commands envd starts are in every checkpoint; the template's own process
// only has to stay alive, and serves nothing.

// baseUID is the uid and gid of "user", as in E2B's base image.
const baseUID = 1000

// basePackages are the packages of base whose files are all copied.
var basePackages = []string{
	"bash", "coreutils",
	// /bin/sh: system(3), Python's subprocess with shell=True and
	// setuptools' build steps run it.
	"dash",
	// Debian's Essential text tools, which shell one-liners assume.
	"grep", "sed", "findutils",
	"python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "python3.11",
	// /usr/bin/python3 (python3-minimal) and the rest of Debian's python3.
	"python3-minimal", "python3",
	// pip, and the packages Debian's pip depends on: it imports
	// setuptools, pkg_resources and distutils to build a source
	// distribution, and wheel to install one.
	"python3-pip", "python3-setuptools", "python3-pkg-resources", "python3-wheel",
	"python3-distutils", "python3-lib2to3",
	"sudo",
	// sudo goes through PAM even for a NOPASSWD rule (account and
	// session), and libpam opens its modules (pam_unix.so, pam_limits.so)
	// with dlopen: no ELF file names them, so only the package brings them.
	"libpam-modules",
	// What E2B's base image has and the SDK's own tests use: python
	// (not only python3), tput and the terminfo it reads (the pty
	// tests), git with its daemon (the git tests serve a repository on
	// the sandbox's loopback).
	"python-is-python3", "ncurses-bin", "ncurses-base", "git",
}

var baseDemo = demoSpec{
	// ca-certificates is needed for the bundle its maintainer script
	// writes (update-ca-certificates), which pip's vendored certifi reads
	// (Debian patches it to /etc/ssl/certs/ca-certificates.crt); the
	// package's own files, one PEM file per authority, are not.
	packages:     append(slices.Clone(basePackages), "ca-certificates"),
	copyPackages: basePackages,
	hostFiles:    []string{"/etc/ssl/certs/ca-certificates.crt"},
	// Stays alive and costs nothing: envd, its parent, does the work.
	args: []string{"/bin/sleep", "infinity"},
	env: []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
	},
	envd: &api.Envd{User: "user", Workdir: "/home/user"},
	// Warm: a sandbox of base is a restore of envd already listening, and
	// one is kept ready per node (Pool 1, the default of template create
	// --warm-pool); the template has no port, so the probe is envd's
	// GET /health (204), which answers once envd serves. The reseed is a
	// command that does nothing, because nothing needs one: the only
	// processes in the image are sleep and envd, which draws its
	// randomness from getrandom (crypto/rand), served to each sandbox
	// anew by its own sentry. A reseed signal would not do: envd passes
	// it on to sleep, which dies of it, and the sandbox with it.
	warm: &api.Warm{
		Probe:  api.Probe{Port: envd.Port, Path: "/health"},
		Reseed: api.Reseed{Command: []string{"/bin/true"}},
		Pool:   1,
	},
	// sudo must stay a setuid-root file and /home/user be uid 1000's.
	asRoot: true,
	files:  baseFiles,
}

// baseFiles are base's accounts, its sudo and PAM configuration, and the
// user's home as useradd -m makes it (a copy of /etc/skel, from bash).
func baseFiles(root string) ([]rootFile, error) {
	fs := []rootFile{
		// root and user log in to bash. The sudo group is Debian's (27),
		// for programs that look for it; the sudoers rule below names the
		// user.
		{path: "etc/passwd", mode: 0o644, data: "root:x:0:0:root:/root:/bin/bash\n" +
			"user:x:1000:1000:user:/home/user:/bin/bash\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
		{path: "etc/group", mode: 0o644, data: "root:x:0:\nsudo:x:27:user\nshadow:x:42:\nuser:x:1000:\nnogroup:x:65534:\n"},
		// No account has a password ("*"); pam_unix's account check,
		// which sudo runs for the NOPASSWD rule too, reads the rest: an
		// empty last-change field turns ageing off (shadow(5)), where a
		// 0 would demand a new password first.
		{path: "etc/shadow", mode: 0o640, chown: true, uid: 0, gid: 42, data: "root:*:::::::\nuser:*:::::::\nnobody:*:::::::\n"},
		{path: "etc/nsswitch.conf", mode: 0o644, data: "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"},
		// sudo ignores a sudoers that is not root's or that others may
		// write; 0440 is what visudo leaves. !fqdn: Debian builds sudo
		// --with-fqdn, and then each sudo looks its host up in DNS, and
		// warns "unable to resolve host" when it fails, as it does for
		// a sandbox's hostname (each its own, in no /etc/hosts).
		{path: "etc/sudoers", mode: 0o440, chown: true, data: "Defaults\tenv_reset\n" +
			"Defaults\t!fqdn\n" +
			"Defaults\tsecure_path=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\n" +
			"root\tALL=(ALL:ALL) ALL\n" +
			"user\tALL=(ALL:ALL) NOPASSWD: ALL\n" +
			"@includedir /etc/sudoers.d\n"},
		// sudo's own /etc/pam.d/sudo and sudo-i (from the package) include
		// these, which Debian's pam-auth-update generates at install time
		// and so no package lists. pam_unix alone: a password (there is
		// none) against /etc/shadow, the account's expiry, and the
		// session's log line.
		{path: "etc/pam.d/common-auth", mode: 0o644, data: "auth\trequired\tpam_unix.so\n"},
		{path: "etc/pam.d/common-account", mode: 0o644, data: "account\trequired\tpam_unix.so\n"},
		{path: "etc/pam.d/common-session", mode: 0o644, data: "session\trequired\tpam_unix.so\n"},
		{path: "etc/pam.d/common-session-noninteractive", mode: 0o644, data: "session\trequired\tpam_unix.so\n"},
		// A login shell (bash -l, the SDK's commands) gets its PATH here,
		// as on Debian: root's with the sbin directories.
		{path: "etc/profile", mode: 0o644, data: `if [ "${EUID:-$(id -u)}" -eq 0 ]; then
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
else
  PATH=/usr/local/bin:/usr/bin:/bin
fi
export PATH
if [ "${PS1-}" ] && [ "${BASH-}" ] && [ -f /etc/bash.bashrc ]; then
  . /etc/bash.bashrc
fi
for i in /etc/profile.d/*.sh; do
  if [ -r "$i" ]; then . "$i"; fi
done
unset i
`},
		// Debian marks its Python EXTERNALLY-MANAGED (PEP 668), and pip
		// then refuses to install anything outside a virtualenv. A
		// sandbox is disposable and the SDK's users run "pip install"
		// straight away, as they can in E2B's image: allow it.
		{path: "etc/pip.conf", mode: 0o644, data: "[global]\nbreak-system-packages = true\n"},
		// sudo keeps its timestamps under /run; pip and others use
		// /var/tmp besides /tmp.
		{path: "run", mode: 0o755, dir: true},
		{path: "var/tmp", mode: 0o777 | os.ModeSticky, dir: true},
		{path: "home", mode: 0o755, dir: true},
		{path: "home/user", mode: 0o750, dir: true, chown: true, uid: baseUID, gid: baseUID},
	}
	skel := filepath.Join(root, "etc", "skel")
	ents, err := os.ReadDir(skel)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("demo: %w", err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(skel, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		fs = append(fs, rootFile{path: filepath.Join("home/user", e.Name()), mode: 0o644, data: string(b), chown: true, uid: baseUID, gid: baseUID})
	}
	return fs, nil
}
