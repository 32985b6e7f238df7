package node

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"sandstorm/internal/envd"
	"sandstorm/internal/sandbox/gvisor"
	"sandstorm/internal/store"
)

// Layout of one sandbox's directory under <data-dir>/sandboxes/<id>:
//
//	bundle/config.json  OCI runtime spec, written at every cold start
//	bundle/rootfs/      overlay mount: template rootfs (lower) + upper/
//	upper/, work/       the sandbox's volume: all it wrote; kept when detached
//	snapshot/           checkpoint image of the last snapshot (complete)
//	snapshot.tmp/       checkpoint being written (incomplete until renamed)
//	console.log         the container's stdout and stderr
type layout string

func (l layout) bundle() string   { return filepath.Join(string(l), "bundle") }
func (l layout) rootfs() string   { return filepath.Join(string(l), "bundle", "rootfs") }
func (l layout) upper() string    { return filepath.Join(string(l), "upper") }
func (l layout) work() string     { return filepath.Join(string(l), "work") }
func (l layout) snapshot() string { return filepath.Join(string(l), "snapshot") }
func (l layout) snapTmp() string  { return filepath.Join(string(l), "snapshot.tmp") }
func (l layout) log() string      { return filepath.Join(string(l), "console.log") }

// mark appends a line of the node's own to the sandbox's console log, so a
// person reading its logs sees when it was started, restored or stopped —
// a restart (a cold start after detach) above all. Best effort: a log that
// cannot be written loses only the line.
func (l layout) mark(format string, args ...any) {
	f, err := os.OpenFile(l.log(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "--- %s sandstorm: %s ---\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

// hasSnapshot reports whether a complete checkpoint image is on disk. An
// image is renamed from snapshot.tmp only after runsc checkpoint succeeded,
// so its presence means it is whole.
func (l layout) hasSnapshot() bool {
	_, err := os.Stat(l.snapshot())
	return err == nil
}

// mountRootfs mounts the overlay of the template's rootfs and the sandbox's
// volume at bundle/rootfs, unless already mounted (after a restart). Each
// sandbox writes only to its own upper dir, so the template stays pristine.
func (l layout) mountRootfs(lower string) error {
	for _, d := range []string{l.rootfs(), l.upper(), l.work()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if mounted(l.rootfs()) {
		return nil
	}
	for _, p := range []string{lower, l.upper(), l.work()} {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("path %q has a comma or colon, which overlayfs options cannot carry", p)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, l.upper(), l.work())
	if err := unix.Mount("overlay", l.rootfs(), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", l.rootfs(), err)
	}
	return nil
}

// unmountRootfs undoes mountRootfs; not mounted is not an error.
func (l layout) unmountRootfs() error {
	if !mounted(l.rootfs()) {
		return nil
	}
	if err := unix.Unmount(l.rootfs(), 0); err != nil {
		// A runsc gofer that is still exiting can hold it for a moment.
		if err := unix.Unmount(l.rootfs(), unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", l.rootfs(), err)
		}
	}
	return nil
}

// mounted reports whether path is a mount point, from /proc/self/mountinfo.
func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMount(f[4]) == path {
			return true
		}
	}
	return false
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// PrepareBundle lays out dir the way the node lays out a sandbox's
// directory for a cold start, and returns the OCI bundle in it:
// bundle/rootfs is the overlay of t.Rootfs over dir/upper (mountRootfs) and
// bundle/config.json the spec writeSpec writes. envdDir, when not "", is
// the host directory holding the sandstorm-envd binary, mounted read-only
// at /.sandstorm; a template whose process runs envd as its init
// (t.Process.Envd != nil) cannot be laid out without it. It is exported
// for internal/bench/raw, which times raw runsc on the same bundle
// sandstormd runs; the node does more around it (network, resolver,
// boundary). dir must be absolute; ReleaseBundle undoes the mount.
func PrepareBundle(dir string, t store.Template, limitMiB int64, hostname, netnsPath, envdDir string) (string, error) {
	l := layout(dir)
	if err := l.mountRootfs(t.Rootfs); err != nil {
		return "", err
	}
	if err := l.writeSpec(t, limitMiB, hostname, netnsPath, envdDir); err != nil {
		l.unmountRootfs()
		return "", err
	}
	return l.bundle(), nil
}

// ReleaseBundle unmounts the rootfs PrepareBundle mounted in dir (not
// mounted is not an error); removing dir is left to the caller.
func ReleaseBundle(dir string) error { return layout(dir).unmountRootfs() }

// envdSource is the host directory l's spec mounts at envdMount ("" if it
// has no spec, or mounts none).
func (l layout) envdSource() string {
	data, err := os.ReadFile(filepath.Join(l.bundle(), "config.json"))
	if err != nil {
		return ""
	}
	var s specs.Spec
	if json.Unmarshal(data, &s) != nil {
		return ""
	}
	for _, m := range s.Mounts {
		if m.Destination == envdMount {
			return m.Source
		}
	}
	return ""
}

// hostname is the hostname l's spec gives its sandbox ("" without one).
func (l layout) hostname() string {
	data, err := os.ReadFile(filepath.Join(l.bundle(), "config.json"))
	if err != nil {
		return ""
	}
	var s specs.Spec
	if json.Unmarshal(data, &s) != nil {
		return ""
	}
	return s.Hostname
}

// writeSpec writes bundle/config.json: the OCI runtime spec of template t,
// joining the sandbox's network namespace at netnsPath, with a memory
// limit of limitMiB (runsc sets it on the sandbox's cgroup and reports it
// to the sandbox as its total memory) and a high OOM score, so that the
// kernel's OOM killer takes a sandbox before anything of the node's. With
// envdDir, that host directory (holding only the envd binary) is mounted
// read-only at /.sandstorm (envd.go).
func (l layout) writeSpec(t store.Template, limitMiB int64, hostname, netnsPath, envdDir string) error {
	env := t.Process.Env
	if !hasEnv(env, "PATH") {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	cwd := t.Process.Cwd
	if cwd == "" {
		cwd = "/"
	}
	s := specs.Spec{
		Version:  specs.Version,
		Hostname: hostname,
		Root:     &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args:         t.Process.Args,
			Env:          env,
			Cwd:          cwd,
			User:         specs.User{UID: 0, GID: 0},
			Capabilities: defaultCaps(),
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			// A template whose init is envd is an E2B-style userland
			// (the base demo) whose user may sudo: setuid must work in
			// it (gvisor.Backend.flags). For every other, no process
			// gains privileges.
			NoNewPrivileges: t.Process.Envd == nil,
		},
		Mounts: gvisor.Mounts(),
		Linux: &specs.Linux{
			Namespaces: gvisor.Namespaces(netnsPath),
		},
	}
	if envdDir != "" {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: envdMount, Type: "bind", Source: envdDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if e := t.Process.Envd; e != nil {
		if envdDir == "" {
			return fmt.Errorf("template %s runs envd as its init (process.envd), and this node has no envd (--envd none, or no sandstorm-envd beside sandstormd)", t.Name)
		}
		s.Process.Args = envdInitArgs(*e, t.Process.Args)
		// envd's own runtime lean; it gives its process the template's
		// environment back (envd.LeanEnv).
		s.Process.Env = envd.LeanEnv(s.Process.Env)
	}
	oom := SandboxOOMScoreAdj
	s.Process.OOMScoreAdj = &oom
	if limitMiB > 0 {
		limit := limitMiB << 20
		s.Linux.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
	}
	data, err := json.MarshalIndent(&s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.bundle(), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(l.bundle(), "config.json.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(l.bundle(), "config.json"))
}

func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

// defaultCaps is the capability set `runsc spec` gives a container: the
// classic Docker default, minus nothing. The sandbox is gVisor's; these
// capabilities are the sentry's emulation, not the host's.
func defaultCaps() *specs.LinuxCapabilities {
	c := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_CHOWN", "CAP_DAC_OVERRIDE",
		"CAP_FOWNER", "CAP_FSETID", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD"}
	return &specs.LinuxCapabilities{Bounding: c, Effective: c, Permitted: c}
}
