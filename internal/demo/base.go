package demo

import (
	"fmt"

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

// basePackages are what base installs beyond minbase (which has bash,
// coreutils, dash, grep, sed, findutils, ncurses-base, sudo's
// libpam-modules, useradd and apt). Their dependencies come with them.
var basePackages = []string{
	// python3 with pip. Debian's pip depends on setuptools (which it
	// imports to build a source distribution) and wheel.
	"python3", "python3-pip",
	// Debian names its interpreter python3 only; E2B's base image, and
	// the SDK's tests, also run python.
	"python-is-python3",
	// The bundle pip's certifi reads (Debian patches it to
	// /etc/ssl/certs/ca-certificates.crt), made by the package's
	// maintainer script.
	"ca-certificates",
	"sudo",
	// What E2B's base image has and the SDK's own tests use: tput (the pty
	// tests), git with its daemon (the git tests serve a repository on the
	// sandbox's loopback).
	"ncurses-bin", "git",
	// curl, as E2B's base image has it (with HTTP/2: the secrets test
	// drives a boundary's HTTP/2 with it).
	"curl",
}

// baseCustomize makes the user, as E2B's base image does: uid and gid
// 1000, home /home/user from /etc/skel, login shell bash, in Debian's sudo
// group (27) for programs that look for it. Its password is locked ("!"):
// sudo is allowed without one (sudoers.d/user, baseFiles).
var baseCustomize = []string{
	fmt.Sprintf(`chroot "$1" useradd --create-home --uid %d --user-group --groups sudo --shell /bin/bash user`, baseUID),
}

var baseDemo = demoSpec{
	packages: debianHost,
	debian:   &debianSpec{include: basePackages, customize: baseCustomize},
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
	// dpkg gives files to root and others (a setuid-root sudo).
	asRoot: true,
	files:  baseFiles,
}

// baseFiles are what base changes in Debian's configuration.
func baseFiles(string) ([]rootFile, error) {
	return []rootFile{
		// sudo reads /etc/sudoers.d (Debian's /etc/sudoers includes it)
		// and ignores a file there that is not root's or that others may
		// write; 0440 is what visudo leaves. !fqdn: Debian builds sudo
		// --with-fqdn, and then each sudo looks its host up in DNS, and
		// warns "unable to resolve host" when it fails, as it does for a
		// sandbox's hostname (each its own, in no /etc/hosts).
		{path: "etc/sudoers.d/user", mode: 0o440, chown: true, data: "Defaults\t!fqdn\n" +
			"user\tALL=(ALL:ALL) NOPASSWD: ALL\n"},
		// Debian marks its Python EXTERNALLY-MANAGED (PEP 668), and pip
		// then refuses to install anything outside a virtualenv. A
		// sandbox is disposable and the SDK's users run "pip install"
		// straight away, as they can in E2B's image: allow it.
		{path: "etc/pip.conf", mode: 0o644, data: "[global]\nbreak-system-packages = true\n"},
		// useradd makes homes 0755 (Debian's HOME_MODE); the user's own,
		// as base has always had it.
		{path: "home/user", mode: 0o750, dir: true, chown: true, uid: baseUID, gid: baseUID},
		// E2B's SDK runs mcp-gateway by name in a login shell, whose PATH
		// is /etc/profile's: the gateway envd brings (read-only at
		// /.sandstorm, internal/mcpgateway) under a name on that PATH.
		{path: "usr/local/bin/mcp-gateway", link: "/.sandstorm/mcp-gateway"},
	}, nil
}
