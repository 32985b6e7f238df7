// Package layout is a Sandstorm node's directory of one sandbox (or one
// warm template's build) on disk: the paths in it, the overlay of the
// template's rootfs over the sandbox's volume, and the OCI runtime spec
// the node writes for runsc. It holds no state: a Dir is a path.
package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/envd"
	"sandstorm/internal/mountinfo"
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
type Dir string

func (l Dir) Bundle() string   { return filepath.Join(string(l), "bundle") }
func (l Dir) Rootfs() string   { return filepath.Join(string(l), "bundle", "rootfs") }
func (l Dir) Upper() string    { return filepath.Join(string(l), "upper") }
func (l Dir) Work() string     { return filepath.Join(string(l), "work") }
func (l Dir) Snapshot() string { return filepath.Join(string(l), "snapshot") }
func (l Dir) SnapTmp() string  { return filepath.Join(string(l), "snapshot.tmp") }
func (l Dir) Log() string      { return filepath.Join(string(l), "console.log") }

// mark appends a line of the node's own to the sandbox's console log, so a
// person reading its logs sees when it was started, restored or stopped —
// a restart (a cold start after detach) above all. Best effort: a log that
// cannot be written loses only the line.
func (l Dir) Mark(format string, args ...any) {
	f, err := os.OpenFile(l.Log(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "--- %s sandstorm: %s ---\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

// hasSnapshot reports whether a complete checkpoint image is on disk. An
// image is renamed from snapshot.tmp only after runsc checkpoint succeeded,
// so its presence means it is whole.
func (l Dir) HasSnapshot() bool {
	_, err := os.Stat(l.Snapshot())
	return err == nil
}

// mountRootfs mounts the overlay of the template's rootfs and the sandbox's
// volume at bundle/rootfs, unless already mounted (after a restart). Each
// sandbox writes only to its own upper dir, so the template stays pristine.
func (l Dir) MountRootfs(lower string) error {
	for _, d := range []string{l.Rootfs(), l.Upper(), l.Work()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if mountinfo.Is(l.Rootfs()) {
		return nil
	}
	for _, p := range []string{lower, l.Upper(), l.Work()} {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("path %q has a comma or colon, which overlayfs options cannot carry", p)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, l.Upper(), l.Work())
	if err := unix.Mount("overlay", l.Rootfs(), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", l.Rootfs(), err)
	}
	return nil
}

// unmountRootfs undoes mountRootfs; not mounted is not an error.
func (l Dir) UnmountRootfs() error {
	if !mountinfo.Is(l.Rootfs()) {
		return nil
	}
	if err := unix.Unmount(l.Rootfs(), 0); err != nil {
		// A runsc gofer that is still exiting can hold it for a moment.
		if err := unix.Unmount(l.Rootfs(), unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", l.Rootfs(), err)
		}
	}
	return nil
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
	l := Dir(dir)
	if err := l.MountRootfs(t.Rootfs); err != nil {
		return "", err
	}
	if err := l.WriteSpec(t, limitMiB, hostname, netnsPath, envdDir); err != nil {
		l.UnmountRootfs()
		return "", err
	}
	return l.Bundle(), nil
}

// ReleaseBundle unmounts the rootfs PrepareBundle mounted in dir (not
// mounted is not an error); removing dir is left to the caller.
func ReleaseBundle(dir string) error { return Dir(dir).UnmountRootfs() }

// envdSource is the host directory l's spec mounts at EnvdMount ("" if it
// has no spec, or mounts none).
func (l Dir) EnvdSource() string {
	s := l.readSpec()
	for _, m := range s.Mounts {
		if m.Destination == EnvdMount {
			return m.Source
		}
	}
	return ""
}

// hostname is the hostname l's spec gives its sandbox ("" without one).
func (l Dir) Hostname() string { return l.readSpec().Hostname }

// readSpec is l's bundle's OCI spec, empty when there is none or it does
// not parse.
func (l Dir) readSpec() specs.Spec {
	var s specs.Spec
	if data, err := os.ReadFile(filepath.Join(l.Bundle(), "config.json")); err == nil && json.Unmarshal(data, &s) != nil {
		return specs.Spec{}
	}
	return s
}

// writeSpec writes bundle/config.json: the OCI runtime spec of template t,
// joining the sandbox's network namespace at netnsPath, with a memory
// limit of limitMiB (runsc sets it on the sandbox's cgroup and reports it
// to the sandbox as its total memory) and a high OOM score, so that the
// kernel's OOM killer takes a sandbox before anything of the node's. With
// envdDir, that host directory (holding only the envd binary) is mounted
// read-only at /.sandstorm (internal/node/envdlink).
func (l Dir) WriteSpec(t store.Template, limitMiB int64, hostname, netnsPath, envdDir string) error {
	env := t.Process.Env
	if !hasEnv(env, "PATH") {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	cwd := t.Process.Cwd
	if cwd == "" {
		cwd = "/"
	}
	user, err := specUser(t.Process.User)
	if err != nil {
		return fmt.Errorf("template %s: %w", t.Name, err)
	}
	s := specs.Spec{
		Version:  specs.Version,
		Hostname: hostname,
		Root:     &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args:         t.Process.Args,
			Env:          env,
			Cwd:          cwd,
			User:         user,
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
		s.Mounts = append(s.Mounts, specs.Mount{Destination: EnvdMount, Type: "bind", Source: envdDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if e := t.Process.Envd; e != nil {
		if envdDir == "" {
			return fmt.Errorf("template %s runs envd as its init (process.envd), and this node has no envd (--envd none, or no sandstorm-envd beside sandstormd)", t.Name)
		}
		s.Process.Args = EnvdInitArgs(*e, t.Process.Args)
		// envd starts commands as any user (api.Process.User).
		s.Process.User = specs.User{}
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
	if err := os.MkdirAll(l.Bundle(), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(l.Bundle(), "config.json.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(l.Bundle(), "config.json"))
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

// Files beside a warm template's build: WarmImage is its checkpoint
// image, WarmVersion the file naming the runtime that wrote it (an image
// restores only on that runtime).
func (l Dir) WarmImage() string   { return filepath.Join(string(l), "image") }
func (l Dir) WarmVersion() string { return filepath.Join(string(l), "runsc-version") }

// AgentSock is the host side of the sandbox's boundary: the Unix socket
// its agent's traffic leaves by.
func (l Dir) AgentSock() string { return filepath.Join(string(l), "agent.sock") }

// HasSnapshotFiles reports whether the snapshot directory holds anything
// (a move's image arrived in it).
func (l Dir) HasSnapshotFiles() bool { return NonEmpty(l.Snapshot()) }

// NonEmpty reports whether dir exists and holds an entry.
func NonEmpty(dir string) bool {
	ents, err := os.ReadDir(dir)
	return err == nil && len(ents) > 0
}

// WriteResolvConf points the sandbox's resolver at its boundary. It is
// written into the overlay (the sandbox's volume), never the template.
func (l Dir) WriteResolvConf(host netip.Addr) error {
	etc := filepath.Join(l.Rootfs(), "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	path := filepath.Join(etc, "resolv.conf")
	os.Remove(path) // a symlink in the template must not be written through
	return os.WriteFile(path, []byte("nameserver "+host.String()+"\noptions ndots:0\n"), 0o644)
}

// The envd binary's place in a sandbox (docs/ARCHITECTURE.md, "envd"):
// its build's host directory is mounted read-only at EnvdMount, holding
// EnvdBinary.
const (
	EnvdMount  = "/.sandstorm"
	EnvdBinary = "sandstorm-envd"
)

// specUser is the spec's user for api.Process.User ("UID:GID", "": root).
// The master resolved any name against the image's own files; a node takes
// numbers only, since it must not read a rootfs's /etc/passwd on the host.
func specUser(u string) (specs.User, error) {
	if u == "" {
		return specs.User{}, nil
	}
	us, gs, ok := strings.Cut(u, ":")
	uid, uerr := strconv.ParseUint(us, 10, 32)
	gid, gerr := strconv.ParseUint(gs, 10, 32)
	if !ok || uerr != nil || gerr != nil {
		return specs.User{}, fmt.Errorf("process.user %q is not UID:GID", u)
	}
	return specs.User{UID: uint32(uid), GID: uint32(gid)}, nil
}

// EnvdInitArgs is the command line of a sandbox whose init is envd: envd,
// then the template's process after "--".
func EnvdInitArgs(e api.Envd, args []string) []string {
	out := []string{filepath.Join(EnvdMount, EnvdBinary), "--init", "--addr", ":" + strconv.Itoa(api.EnvdPort)}
	if e.User != "" {
		out = append(out, "--user", e.User)
	}
	if e.Workdir != "" {
		out = append(out, "--workdir", e.Workdir)
	}
	return append(append(out, "--"), args...)
}

// SandboxOOMScoreAdj is every sandbox process's oom_score_adj, written in
// its spec: the kernel's OOM killer takes the highest score first, so a
// sandbox goes before anything of the node's (node.DaemonOOMScoreAdj).
const SandboxOOMScoreAdj = 800

// CopyTree copies the directory src into dst (created), keeping modes,
// owners, times, links and sparse files; with reflinks where the
// filesystem has them, so a large volume costs little. A missing src is an
// empty volume.
func CopyTree(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src+"/.", dst+"/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp -a %s %s: %w: %s", src, dst, err, out)
	}
	return nil
}
