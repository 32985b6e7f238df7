package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sandstorm/api"
	"sandstorm/internal/envd"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/sandbox/gvisor"
	"sandstorm/internal/testenv"
)

// baseScript is what the tests run as user in base: the SDK's commands
// are bash -l, in the user's home.
const baseScript = `id -un; python3 -c "import pip; print(pip.__version__)"; sudo -n true && echo sudo-ok; sudo -n id -un; pwd; touch .w && echo home-writable; git --version`

// pipVersion matches the second line of baseScript's output.
var pipVersion = regexp.MustCompile(`^[0-9]+(\.[0-9]+)+$`)

// userEnv is the environment envd gives a command of user in a sandbox of
// d: the sandbox's own (its init's), with the user's HOME, USER and
// LOGNAME (internal/envd, processes.env).
func userEnv(d Demo) []string {
	env := slices.DeleteFunc(slices.Clone(d.Env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "HOME" || k == "USER" || k == "LOGNAME"
	})
	return append(env, "HOME=/home/user", "USER=user", "LOGNAME=user")
}

func TestBaseRootfs(t *testing.T) {
	dir, d := buildOnce(t, "base")
	if d.Name != "base" || len(d.Ports) != 0 || !slices.Equal(d.Args, []string{"/bin/sleep", "infinity"}) {
		t.Errorf("Demo = %+v", d)
	}
	if d.Envd == nil || *d.Envd != (api.Envd{User: "user", Workdir: "/home/user"}) {
		t.Errorf("Demo.Envd = %+v", d.Envd)
	}
	// A template without ports is warm only with a probe on a port of its
	// own choosing: envd's.
	if w := d.Warm; w == nil || !reflect.DeepEqual(w.Probe, api.Probe{Port: envd.Port, Path: "/health"}) || w.Reseed.Signal != "" || !slices.Equal(w.Reseed.Command, []string{"/bin/true"}) || w.Pool != 1 {
		t.Fatalf("Demo.Warm = %+v", d.Warm)
	}
	for _, p := range []string{
		d.Args[0], d.Warm.Reseed.Command[0], "/bin/bash", "/bin/sh", "/usr/bin/python3", "/usr/bin/pip3",
		"/usr/lib/python3/dist-packages/pip/__init__.py", "/usr/lib/python3/dist-packages/setuptools/__init__.py",
		"/etc/ssl/certs/ca-certificates.crt", "/etc/pam.d/sudo", "/etc/pam.d/common-account", "/etc/sudo.conf",
		"/usr/libexec/sudo/sudoers.so", "/etc/security/limits.conf", "/etc/skel/.bashrc",
		"/usr/bin/git", "/usr/lib/git-core/git-daemon", "/usr/bin/python",
	} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil { // Stat: symlinks must resolve inside
			t.Errorf("missing %s: %v", p, err)
		}
	}
	for _, mod := range []string{"pam_unix.so", "pam_limits.so"} {
		if m, _ := filepath.Glob(filepath.Join(dir, "usr/lib/*/security", mod)); len(m) == 0 {
			t.Errorf("no %s: libpam could not open it", mod)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "usr/share/locale/*/*")); len(m) > 0 {
		t.Errorf("translations were installed: %v", m[:min(3, len(m))])
	}
	checkDebian(t, dir)
	for _, c := range []struct {
		path     string
		uid, gid int
		mode     os.FileMode
	}{
		{"usr/bin/sudo", 0, 0, 0o755 | os.ModeSetuid},
		{"etc/sudoers", 0, 0, 0o440},
		{"etc/sudoers.d/user", 0, 0, 0o440},
		{"etc/shadow", 0, 42, 0o640},
		{"tmp", 0, 0, 0o777 | os.ModeSticky},
		{"root", 0, 0, 0o700},
		{"home/user", baseUID, baseUID, 0o750 | os.ModeDir},
		{"home/user/.bashrc", baseUID, baseUID, 0o644},
		{"home/user/.profile", baseUID, baseUID, 0o644},
	} {
		fi, err := os.Lstat(filepath.Join(dir, c.path))
		if err != nil {
			t.Errorf("/%s: %v", c.path, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode() &^ os.ModeDir
		if c.mode&os.ModeDir != 0 && !fi.IsDir() {
			t.Errorf("/%s is not a directory", c.path)
		}
		if int(st.Uid) != c.uid || int(st.Gid) != c.gid || mode != c.mode&^os.ModeDir {
			t.Errorf("/%s: %d:%d %v, want %d:%d %v", c.path, st.Uid, st.Gid, mode, c.uid, c.gid, c.mode&^os.ModeDir)
		}
	}
	// Debian's /etc/sudoers, and the user's rule beside it.
	sudoers, err := os.ReadFile(filepath.Join(dir, "etc/sudoers"))
	if err != nil || !strings.Contains(string(sudoers), "\n@includedir /etc/sudoers.d\n") {
		t.Errorf("/etc/sudoers does not include /etc/sudoers.d (%v):\n%s", err, sudoers)
	}
	rule, err := os.ReadFile(filepath.Join(dir, "etc/sudoers.d/user"))
	if err != nil || !strings.Contains(string(rule), "\nuser\tALL=(ALL:ALL) NOPASSWD: ALL\n") {
		t.Errorf("/etc/sudoers.d/user lacks the user's rule (%v):\n%s", err, rule)
	}
	// The rootfs's own visudo (the host need not have sudo), in it.
	if out, err := exec.Command("chroot", dir, "/usr/sbin/visudo", "-c", "-f", "/etc/sudoers.d/user").CombinedOutput(); err != nil {
		t.Errorf("visudo -c: %v\n%s", err, out)
	}
	passwd, err := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	var user []string
	for line := range strings.Lines(string(passwd)) {
		if f := strings.Split(strings.TrimSpace(line), ":"); f[0] == "user" {
			user = f
		}
	}
	if len(user) != 7 || user[2] != "1000" || user[3] != "1000" || user[5] != "/home/user" || user[6] != "/bin/bash" {
		t.Errorf("/etc/passwd user = %q", user)
	}
	group, err := os.ReadFile(filepath.Join(dir, "etc/group"))
	if err != nil || !regexp.MustCompile(`(?m)^sudo:x:27:user$`).Match(group) || !regexp.MustCompile(`(?m)^user:x:1000:$`).Match(group) {
		t.Errorf("/etc/group lacks user's groups (%v):\n%s", err, group)
	}

	// As user, on this machine's kernel: what envd runs in a sandbox.
	cmd := exec.Command("chroot", "--userspec=1000:1000", dir, "/bin/bash", "-lc",
		`cd && id -un && python3 -m pip --version && echo $PATH && sh -c 'echo sh-ok' && python --version && tput -T xterm cols`)
	cmd.Env = userEnv(d)
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	// Debian's /etc/profile gives a user its PATH, games included.
	if err != nil || len(lines) != 6 || lines[0] != "user" || !strings.HasPrefix(lines[1], "pip ") ||
		lines[2] != "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games" || lines[3] != "sh-ok" ||
		!strings.HasPrefix(lines[4], "Python 3.11.") || lines[5] != "80" {
		t.Errorf("chroot as user: %v\n%s", err, out)
	}
	// The template's process stays up until it is stopped.
	sleep := exec.Command("chroot", dir, d.Args[0], d.Args[1])
	sleep.Env = d.Env
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleep.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("%v exited by itself: %v", d.Args, err)
	case <-time.After(200 * time.Millisecond):
	}
	sleep.Process.Kill()
	<-exited
}

// TestBaseInRunsc runs baseScript as user in a real gVisor sandbox of the
// base rootfs, a user as envd makes one: uid 1000, no capabilities of its
// own, the node's bounding set. sudo works only when the sandbox lets a
// setuid file raise the effective uid: runsc --allow-suid, and no
// no_new_privs on the process (OCI noNewPrivileges). The two other cases
// pin down how sudo fails when either is missing.
func TestBaseInRunsc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test must run as root (it runs runsc)")
	}
	runsc, err := testenv.Runsc()
	if err != nil {
		t.Fatal(err)
	}
	dir, d := buildOnce(t, "base")
	t.Run("allow-suid", func(t *testing.T) {
		out, err := runBase(t, runsc, dir, d, false, "--allow-suid")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if err != nil || len(lines) != 7 || lines[0] != "user" || !pipVersion.MatchString(lines[1]) ||
			lines[2] != "sudo-ok" || lines[3] != "root" || lines[4] != "/home/user" || lines[5] != "home-writable" ||
			!strings.HasPrefix(lines[6], "git version 2.39.") {
			t.Errorf("runsc: %v\n%s", err, out)
		}
	})
	t.Run("no-new-privileges", func(t *testing.T) {
		out, _ := runBase(t, runsc, dir, d, true, "--allow-suid")
		if strings.Contains(out, "sudo-ok") || !strings.Contains(out, `"no new privileges" flag is set`) {
			t.Errorf("sudo under no_new_privs:\n%s", out)
		}
	})
	t.Run("no-allow-suid", func(t *testing.T) {
		out, _ := runBase(t, runsc, dir, d, false)
		if strings.Contains(out, "sudo-ok") || !strings.Contains(out, "effective uid is not 0") {
			t.Errorf("sudo without --allow-suid:\n%s", out)
		}
	})
}

// sandboxCaps is the capability set of the node's sandboxes
// (internal/node, defaultCaps): a command envd runs as a user keeps it as
// its bounding set, which is what a setuid-root sudo gets.
var sandboxCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_CHOWN", "CAP_DAC_OVERRIDE",
	"CAP_FOWNER", "CAP_FSETID", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD"}

// runBase runs baseScript as user in a runsc sandbox of rootfs (writes go
// to memory, so the rootfs stays as built; no network) and returns its
// combined output and exit error.
func runBase(t *testing.T, runsc, rootfs string, d Demo, noNewPrivs bool, flags ...string) (string, error) {
	t.Helper()
	bundle, state := t.TempDir(), t.TempDir()
	// With --network=none runsc bind-mounts an empty network namespace
	// at <root>/null-netns and leaves it there; unmounted before the
	// TempDir is removed (cleanups run last first).
	t.Cleanup(func() {
		for syscall.Unmount(filepath.Join(state, "null-netns"), syscall.MNT_DETACH) == nil {
		}
	})
	spec := specs.Spec{
		Version:  specs.Version,
		Hostname: "base-test",
		Root:     &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Args:            []string{"/bin/bash", "-lc", baseScript},
			Env:             userEnv(d),
			Cwd:             d.Envd.Workdir,
			User:            specs.User{UID: baseUID, GID: baseUID, AdditionalGids: []uint32{27}},
			Capabilities:    &specs.LinuxCapabilities{Bounding: sandboxCaps},
			NoNewPrivileges: noNewPrivs,
		},
		Mounts: gvisor.Mounts(),
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
		}},
	}
	b, err := json.Marshal(&spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("demo-base-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	global := []string{"--root", state, "--platform=" + gvisor.DefaultPlatform, "--network=none", "--overlay2=root:memory"}
	t.Cleanup(func() { exec.Command(runsc, append(global, "delete", "--force", id)...).Run() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, append(append(global, flags...), "run", "--bundle", bundle, id)...)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("runsc %v run: %v in %v\n%s", flags, err, time.Since(start).Round(time.Millisecond), out)
	return string(out), err
}

// checkDebian checks that the base rootfs is Debian 12 installed by dpkg,
// with base's packages in its database.
func checkDebian(t *testing.T, dir string) {
	t.Helper()
	osRelease, err := os.ReadFile(filepath.Join(dir, "etc/os-release"))
	if err != nil || !strings.Contains(string(osRelease), "\nVERSION_ID=\"12\"\n") || !strings.Contains(string(osRelease), "\nID=debian\n") {
		t.Errorf("/etc/os-release is not Debian 12's (%v):\n%s", err, osRelease)
	}
	out, err := exec.Command("dpkg-query", "--admindir="+filepath.Join(dir, "var/lib/dpkg"), "-W", "-f", "${Package} ${db:Status-Status}\n").Output()
	if err != nil {
		t.Fatalf("dpkg-query in the rootfs: %v", err)
	}
	got := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) == 2 {
			got[f[0]] = f[1]
		}
	}
	for _, p := range append(slices.Clone(basePackages), "bash", "coreutils", "dash", "libpam-modules", "python3-setuptools", "apt") {
		if got[p] != "installed" {
			t.Errorf("package %s: %q in the rootfs's dpkg database, want installed", p, got[p])
		}
	}
	// Nothing of the build machine's resolver or name is left in it.
	if _, err := os.Lstat(filepath.Join(dir, "etc/resolv.conf")); err == nil {
		t.Error("/etc/resolv.conf was left in the template")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/hostname")); string(b) != "sandstorm\n" {
		t.Errorf("/etc/hostname = %q", b)
	}
	t.Logf("%d packages installed", len(got))
}

// The code interpreter's process is the envd binary where the node
// mounts it.
func TestInterpreterDemoRunsMountedEnvd(t *testing.T) {
	if want := filepath.Join(layout.EnvdMount, layout.EnvdBinary); envdInSandbox != want {
		t.Errorf("code-interpreter runs %s, the node mounts envd at %s", envdInSandbox, want)
	}
}
