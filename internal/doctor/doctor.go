// Package doctor finds out what this machine can do for Sandstorm and says
// so in words an operator can act on: every check that fails carries the
// command or setting that fixes it. Checks only look, except for three
// cheap, self-cleaning probes that are the only reliable way to know: a
// `runsc do /bin/true` smoke run, a throwaway network namespace and a
// throwaway cgroup.
package doctor

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"sandstorm/internal/sandbox/gvisor"
	"sandstorm/internal/sandbox/process"
)

// Check is the result of one check.
type Check struct {
	// Name is a short stable identifier, e.g. "runsc" (see Names).
	Name string `json:"name"`
	// OK is false when something Sandstorm needs is missing or broken.
	// Informational checks (kvm, criu, swap, cgroup-v1-freezer, daemon) are
	// OK whatever they find; Absent then says what they found is not there
	// or does not work, so it is not shown as working.
	OK bool `json:"ok"`
	// Absent: something optional is missing (✓ means "works": this is
	// printed with a different mark, and its Fix says what to do if it is
	// wanted).
	Absent bool `json:"absent,omitempty"`
	// Detail says what was found.
	Detail string `json:"detail"`
	// Fix says how to repair a failed check.
	Fix string `json:"fix,omitempty"`
}

// Thresholds below which the memory and disk checks fail.
const (
	MinAvailableMemMiB = 512 // MemAvailable, MiB
	MinFreeDiskGiB     = 2   // free space for the data directory, GiB
)

const (
	checkTimeout = 5 * time.Second  // default bound per check
	runscTimeout = 20 * time.Second // the runsc smoke run boots a sandbox
)

// Config says which installation to check.
type Config struct {
	// DataDir is where sandstormd keeps its state; the disk check measures
	// the filesystem holding it (or its nearest existing parent, before
	// first start).
	DataDir string
	// Runsc is the runsc binary sandstormd would run ("" is the one next
	// to this executable, as for sandstormd); Platform its platform (""
	// is gvisor.DefaultPlatform).
	Runsc, Platform string
	// Envd is the envd binary sandstormd would mount in sandboxes (""
	// is sandstorm-envd next to this executable, as for sandstormd).
	Envd string
	// UnitDirs are where the service check looks for sandstormd.service
	// (nil: systemd's, UnitDirs).
	UnitDirs []string
}

type checkFunc func(ctx context.Context, c Config) Check

// checks lists every check in report order, with its time bound.
var checks = []struct {
	name    string
	timeout time.Duration
	fn      checkFunc
}{
	{"root", checkTimeout, checkRoot},
	{"runsc", checkTimeout, checkRunsc},
	{"runsc-run", runscTimeout, checkRunscRun},
	{"runsc-kept", runscTimeout, checkRunscKept},
	{"envd", checkTimeout, checkEnvd},
	{"cgroup-v2", checkTimeout, checkCgroup2},
	{"cgroup-v1-freezer", checkTimeout, checkV1Freezer},
	{"netns", checkTimeout, checkNetns},
	{"kvm", checkTimeout, checkKVM},
	{"criu", checkTimeout, checkCRIU},
	{"nftables", checkTimeout, checkNft},
	{"memory", checkTimeout, checkMemory},
	{"swap", checkTimeout, checkSwap},
	{"disk", checkTimeout, checkDisk},
	{"service", checkTimeout, checkService},
}

// Names returns the name of every check Run performs, in report order.
func Names() []string {
	names := make([]string, len(checks))
	for i, c := range checks {
		names[i] = c.name
	}
	return names
}

// Run performs every check and returns one Check per name in Names, in that
// order. Checks run concurrently, each bounded by its own timeout (5 s; 20 s
// for the runsc smoke run) and by ctx; a check that overruns or panics is
// reported as failed rather than delaying or crashing the caller.
func Run(ctx context.Context, cfg Config) []Check {
	out := make([]Check, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = runOne(ctx, c.name, c.timeout, cfg, c.fn)
		}()
	}
	wg.Wait()
	return out
}

// runOne runs fn in its own goroutine so that a check stuck in a syscall
// that ignores ctx (a hung filesystem, say) still yields a result on time.
func runOne(ctx context.Context, name string, timeout time.Duration, cfg Config, fn checkFunc) Check {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan Check, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- Check{Detail: fmt.Sprintf("check crashed: %v", r), Fix: "report this as a Sandstorm bug"}
			}
		}()
		done <- fn(ctx, cfg)
	}()
	var c Check
	select {
	case c = <-done:
	case <-ctx.Done():
		// Give a check that honours ctx a moment to say what it
		// was doing, then give up on it.
		select {
		case c = <-done:
		case <-time.After(time.Second):
			c = Check{Detail: fmt.Sprintf("no answer within %v (%v)", timeout, ctx.Err()), Fix: "see what blocks: the machine may be overloaded or a filesystem hung"}
		}
	}
	c.Name = name
	return c
}

// Print writes checks as an aligned table: ✓ (works), – (optional and
// absent) or ✗ (needed and broken), the name, the detail, and for the last
// two an indented "fix: ..." line. It returns nothing:
// write errors on w are ignored, as for fmt.Fprintf to a terminal.
func Print(w io.Writer, checks []Check) {
	width := 0
	for _, c := range checks {
		width = max(width, utf8.RuneCountInString(c.Name))
	}
	for _, c := range checks {
		mark := "✓"
		switch {
		case !c.OK:
			mark = "✗"
		case c.Absent:
			mark = "–"
		}
		fmt.Fprintf(w, "%s %-*s  %s\n", mark, width, c.Name, c.Detail)
		if c.Fix != "" && (!c.OK || c.Absent) {
			fmt.Fprintf(w, "  %-*s  fix: %s\n", width, "", c.Fix)
		}
	}
}

// output runs name with args and returns its trimmed combined output. The
// child is killed when ctx ends; WaitDelay keeps a grandchild that inherited
// the output pipe from holding us past that.
func output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = time.Second
	cmd.Dir = "/"
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err := cmd.Run()
	if err != nil && ctx.Err() != nil {
		// Say that it was the deadline, and after how long.
		err = fmt.Errorf("killed after %s: %w", time.Since(start).Round(time.Millisecond), ctx.Err())
	}
	return strings.TrimSpace(buf.String()), err
}

// firstLine returns the first non-empty line of s, shortened to 160 bytes.
func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			if len(l) > 160 {
				l = l[:160] + "…"
			}
			return l
		}
	}
	return ""
}

// lastLine returns the last non-empty line of s (where tools put the error).
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return firstLine(lines[len(lines)-1])
}

func checkRoot(ctx context.Context, _ Config) Check {
	if uid := os.Geteuid(); uid != 0 {
		return Check{Detail: fmt.Sprintf("running as uid %d; sandboxes need root (namespaces, cgroups, runsc)", uid), Fix: "run sandstormd (and this check) as root, e.g. with sudo"}
	}
	return Check{OK: true, Detail: "running as root"}
}

// runscOf is the binary and platform cfg names, with sandstormd's defaults.
func runscOf(cfg Config) (path, platform string, err error) {
	path, platform = cfg.Runsc, cfg.Platform
	if platform == "" {
		platform = gvisor.DefaultPlatform
	}
	if path == "" {
		path, err = gvisor.DefaultRunsc()
	}
	return path, platform, err
}

// checkRunsc says which runsc sandstormd would run, and whether it is the
// version the repository pins (the one sandstormd is tested with;
// checkpoint images only restore on the runsc version that wrote them).
func checkRunsc(ctx context.Context, cfg Config) Check {
	path, platform, err := runscOf(cfg)
	if err != nil {
		return Check{Detail: err.Error() + "; the gvisor backend cannot run", Fix: "make runsc (builds the pinned gVisor into bin/, next to sandstormd), or pass --runsc PATH"}
	}
	v, err := gvisor.Version(ctx, path)
	if err != nil {
		return Check{Detail: err.Error(), Fix: "rebuild it: make runsc"}
	}
	if v != gvisor.PinnedVersion {
		return Check{OK: true, Absent: true,
			Detail: fmt.Sprintf("%s is %s, not the version this sandstormd pins (%s), platform %s", path, v, gvisor.PinnedVersion, platform),
			Fix:    "make runsc builds the pinned one; snapshots written by one runsc version do not restore on another"}
	}
	return Check{OK: true, Detail: fmt.Sprintf("%s, the pinned version (%s), platform %s", v, path, platform)}
}

// checkEnvd says whether commands and files in sandboxes (sandbox exec,
// cp, the E2B API) are on: the envd binary is there, and static — it runs
// inside sandboxes, whose rootfs need not have a libc.
func checkEnvd(ctx context.Context, cfg Config) Check {
	path := cfg.Envd
	if path == "" {
		exe, err := os.Executable()
		if err != nil {
			return Check{Detail: err.Error(), Fix: "pass serve --envd PATH"}
		}
		path = filepath.Join(filepath.Dir(exe), "sandstorm-envd")
	}
	f, err := elf.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Check{OK: true, Absent: true, Detail: "no " + path + ": sandbox exec and cp and the E2B API are off",
			Fix: "make build puts sandstorm-envd beside sandstormd (or: serve --envd PATH)"}
	}
	if err != nil {
		return Check{Detail: fmt.Sprintf("%s: %v", path, err), Fix: "rebuild it: make build"}
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return Check{Detail: path + " is dynamically linked; it runs inside sandboxes, which need not have a libc",
				Fix: "make build builds it static (CGO_ENABLED=0)"}
		}
	}
	return Check{OK: true, Detail: path + ", static: sandbox exec and cp and the E2B API are on"}
}

// checkRunscRun boots a real sandbox on the platform sandstormd would use.
// KVM is deliberately not tried: on nested-virtualisation VMs like the ones
// Sandstorm runs on, runsc's kvm platform hangs instead of failing.
func checkRunscRun(ctx context.Context, cfg Config) Check {
	path, platform, err := runscOf(cfg)
	if err != nil {
		return Check{Detail: "no runsc to run", Fix: "make runsc, or pass --runsc PATH"}
	}
	if os.Geteuid() != 0 {
		return Check{Detail: "smoke run skipped: needs root", Fix: "run as root"}
	}
	root, err := os.MkdirTemp("", "sandstorm-doctor-")
	if err != nil {
		return Check{Detail: err.Error(), Fix: "check that the temporary directory is writable"}
	}
	defer func() {
		(&gvisor.Backend{Root: root}).Close()
		os.RemoveAll(root)
	}()
	start := time.Now()
	out, err := output(ctx, path, "--root", root, "--network=none", "--platform="+platform, "do", "/bin/true")
	if err != nil {
		return Check{
			Detail: fmt.Sprintf("`runsc --platform=%s do /bin/true` failed: %v: %s", platform, err, lastLine(out)),
			Fix:    fmt.Sprintf("run `%s --debug --debug-log=/tmp/runsc/ --platform=%s do /bin/true` and read /tmp/runsc/; or try the other platform (sandstormd serve --platform %s)", path, platform, otherPlatform(platform)),
		}
	}
	return Check{OK: true, Detail: fmt.Sprintf("a %s sandbox ran /bin/true in %v; kvm platform not tried (it hangs on this kind of VM)", platform, time.Since(start).Round(time.Millisecond))}
}

func otherPlatform(p string) string {
	if p == "ptrace" {
		return "systrap"
	}
	return "ptrace"
}

// checkCgroup2 finds the v2 hierarchy the process backend uses and proves
// cgroup.freeze and cgroup.kill work by creating a throwaway child cgroup
// (the root cgroup has neither file, so it cannot tell).
func checkCgroup2(ctx context.Context, _ Config) Check {
	mnt, err := process.Cgroup2Mount()
	if err != nil {
		return Check{Detail: err.Error(), Fix: "mount it: mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 none /sys/fs/cgroup/unified (or boot with systemd.unified_cgroup_hierarchy=1)"}
	}
	// cgroup.controllers lists the controllers bound to v2 (not to v1);
	// cgroup.subtree_control those handed down to child cgroups.
	list := func(file string) string {
		b, _ := os.ReadFile(filepath.Join(mnt, file))
		if s := strings.TrimSpace(string(b)); s != "" {
			return s
		}
		return "none"
	}
	controllers := fmt.Sprintf("controllers on v2: %s, enabled for children: %s", list("cgroup.controllers"), list("cgroup.subtree_control"))
	probe := filepath.Join(mnt, fmt.Sprintf("sandstorm-doctor-%d-%x", os.Getpid(), rand.Uint32()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return Check{Detail: fmt.Sprintf("cgroup v2 at %s, but cannot create a cgroup there: %v", mnt, err), Fix: "run as root; if root already, make sure the cgroup2 mount is writable"}
	}
	defer os.Remove(probe)
	var missing []string
	for _, f := range []string{"cgroup.freeze", "cgroup.kill"} {
		if _, err := os.Stat(filepath.Join(probe, f)); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return Check{Detail: fmt.Sprintf("cgroup v2 at %s lacks %s", mnt, strings.Join(missing, " and ")), Fix: "upgrade the kernel to Linux 5.14 or newer (cgroup.freeze needs 5.2, cgroup.kill 5.14)"}
	}
	// The freezer and cgroup.kill are core cgroup v2 features that work
	// without any controller, which is the common hybrid case: say so,
	// since it surprises people.
	c := Check{OK: true, Detail: fmt.Sprintf("cgroup v2 at %s; cgroup.freeze and cgroup.kill available (%s)", mnt, controllers)}
	if !strings.Contains(" "+list("cgroup.subtree_control")+" ", " memory ") {
		// Freezing works without controllers; memory limits on v2 do not.
		// runsc puts its sandboxes in the v1 memory hierarchy when there is
		// one, so only the process backend is short.
		c.Absent = true
		c.Detail += "; no memory controller on v2 here, so the process backend cannot limit a sandbox's memory (the gvisor backend uses v1's)"
		c.Fix = "for the process backend: echo +memory > " + filepath.Join(mnt, "cgroup.subtree_control") + " (possible only when memory is not bound to cgroup v1: boot with systemd.unified_cgroup_hierarchy=1)"
	}
	return c
}

// checkV1Freezer reports whether a cgroup v1 freezer hierarchy is mounted
// (hybrid machines). Informational: Sandstorm pauses with cgroup v2.
func checkV1Freezer(ctx context.Context, _ Config) Check {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return Check{Detail: err.Error(), Fix: "mount /proc"}
	}
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, p := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(p) < 3 || p[0] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(p[2], ",") {
			if opt == "freezer" {
				return Check{OK: true, Detail: fmt.Sprintf("v1 freezer mounted at %s (hybrid cgroups); not needed, pausing uses cgroup v2", f[4])}
			}
		}
	}
	return Check{OK: true, Absent: true, Detail: "no v1 freezer mounted; not needed, pausing uses cgroup v2", Fix: "nothing to do"}
}

// checkNetns creates and deletes a uniquely named network namespace with
// ip(8), exactly as the node does for each sandbox.
func checkNetns(ctx context.Context, _ Config) Check {
	ip, err := exec.LookPath("ip")
	if err != nil {
		return Check{Detail: "ip (iproute2) is not on PATH", Fix: "apt-get install -y iproute2"}
	}
	name := fmt.Sprintf("sandstorm-doctor-%d-%x", os.Getpid(), rand.Uint32())
	if out, err := output(ctx, ip, "netns", "add", name); err != nil {
		return Check{Detail: fmt.Sprintf("ip netns add failed: %v: %s", err, lastLine(out)), Fix: "run as root; the kernel needs CONFIG_NET_NS"}
	}
	// Delete even if ctx has expired, or the probe would leak.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
	defer cancel()
	if out, err := output(dctx, ip, "netns", "del", name); err != nil {
		return Check{Detail: fmt.Sprintf("ip netns del %s failed: %v: %s", name, err, lastLine(out)), Fix: "delete it by hand: ip netns del " + name}
	}
	return Check{OK: true, Detail: "created and deleted a network namespace"}
}

// checkKVM is informational: only a Firecracker backend would need /dev/kvm,
// and none is built.
func checkKVM(ctx context.Context, _ Config) Check {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		why := err.Error()
		if errors.Is(err, os.ErrNotExist) {
			why = "/dev/kvm does not exist"
		}
		return Check{OK: true, Absent: true, Detail: why + "; not needed (no firecracker backend is built, and runsc runs on systrap or ptrace)", Fix: "nothing to do: only a KVM backend would use it"}
	}
	f.Close()
	return Check{OK: true, Detail: "/dev/kvm can be opened; unused (no firecracker backend is built, and runsc runs on systrap or ptrace)"}
}

// checkCRIU is informational: CRIU is the only way the process backend
// could get a snapshot tier, and it has no CRIU integration anyway.
func checkCRIU(ctx context.Context, _ Config) Check {
	const note = "the process backend has no snapshot tier (pause only)"
	installed, err := process.CheckCRIU(ctx)
	if !installed {
		return Check{OK: true, Absent: true, Detail: "criu not installed; " + note, Fix: "nothing to do for the gvisor backend (runsc checkpoints itself); the process backend has no CRIU integration"}
	}
	if err != nil {
		return Check{OK: true, Absent: true, Detail: fmt.Sprintf("`criu check` fails (%v); %s", err, note), Fix: "nothing to do for the gvisor backend; CRIU itself does not work on this kernel"}
	}
	return Check{OK: true, Detail: "`criu check` passes, but the process backend does not use CRIU; " + note}
}

func checkNft(ctx context.Context, _ Config) Check {
	const fix = "apt-get install -y nftables"
	path, err := exec.LookPath("nft")
	if err != nil {
		return Check{Detail: "nft is not on PATH", Fix: fix}
	}
	ver, err := output(ctx, path, "--version")
	if err != nil {
		return Check{Detail: fmt.Sprintf("nft --version failed: %v: %s", err, lastLine(ver)), Fix: "reinstall it: apt-get install --reinstall -y nftables"}
	}
	// The binary can exist while the kernel lacks nf_tables; listing
	// tables is read-only and proves the netlink side works.
	if os.Geteuid() == 0 {
		if out, err := output(ctx, path, "list", "tables"); err != nil {
			return Check{Detail: fmt.Sprintf("%s, but `nft list tables` fails: %s", ver, lastLine(out)), Fix: "load the kernel module: modprobe nf_tables"}
		}
	}
	return Check{OK: true, Detail: ver}
}

// meminfo returns the named fields of /proc/meminfo, in KiB.
func meminfo() (map[string]uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMeminfo(f)
}

func parseMeminfo(r io.Reader) (map[string]uint64, error) {
	m := map[string]uint64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		if n, err := strconv.ParseUint(fields[0], 10, 64); err == nil {
			m[k] = n
		}
	}
	return m, sc.Err()
}

func checkMemory(ctx context.Context, _ Config) Check {
	m, err := meminfo()
	if err != nil {
		return Check{Detail: err.Error(), Fix: "mount /proc"}
	}
	avail, ok := m["MemAvailable"]
	if !ok {
		return Check{Detail: "/proc/meminfo has no MemAvailable (kernel older than 3.14?)", Fix: "upgrade the kernel"}
	}
	availMiB, totalMiB := avail/1024, m["MemTotal"]/1024
	detail := fmt.Sprintf("%d MiB available of %d MiB", availMiB, totalMiB)
	if availMiB < MinAvailableMemMiB {
		return Check{Detail: detail, Fix: fmt.Sprintf("free memory (stop or freeze sandboxes) or add RAM: at least %d MiB should be available", MinAvailableMemMiB)}
	}
	return Check{OK: true, Detail: detail}
}

// checkSwap is informational: it reports swap devices and whether zswap
// (compressed swap cache) is on, which change how far frozen sandboxes can
// be squeezed out of RAM.
func checkSwap(ctx context.Context, _ Config) Check {
	data, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return Check{OK: true, Detail: "cannot read /proc/swaps: " + err.Error()}
	}
	var n int
	var totalKiB uint64
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 3 {
			continue // header
		}
		size, _ := strconv.ParseUint(f[2], 10, 64)
		totalKiB += size
		n++
	}
	swap := "no swap"
	if n > 0 {
		swap = fmt.Sprintf("%d swap device(s), %d MiB", n, totalKiB/1024)
	}
	zswap := "zswap not available in this kernel"
	if b, err := os.ReadFile("/sys/module/zswap/parameters/enabled"); err == nil {
		switch strings.TrimSpace(string(b)) {
		case "Y", "1":
			zswap = "zswap enabled"
		default:
			zswap = "zswap disabled"
		}
	}
	c := Check{OK: true, Detail: swap + "; " + zswap}
	if n == 0 {
		c.Absent = true
		c.Fix = "only for sandstormd --zswap (frozen sandboxes squeezed into compressed swap): fallocate -l 4G /swapfile && chmod 600 /swapfile && mkswap /swapfile && swapon /swapfile"
	}
	return c
}

// nearestExisting returns dir or, if it does not exist yet, its closest
// existing ancestor: the filesystem a not-yet-created data dir will be on.
func nearestExisting(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(dir); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no existing parent of %s", dir)
		}
		dir = parent
	}
}

func checkDisk(ctx context.Context, cfg Config) Check {
	dataDir := cfg.DataDir
	if dataDir == "" {
		return Check{Detail: "no data directory given", Fix: "pass the data directory sandstormd uses"}
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return Check{Detail: err.Error(), Fix: "check the data directory path"}
	}
	at, err := nearestExisting(abs)
	if err != nil {
		return Check{Detail: err.Error(), Fix: "check the data directory path"}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		return Check{Detail: fmt.Sprintf("statfs %s: %v", at, err), Fix: "check the data directory path"}
	}
	const gib = 1 << 30
	free := float64(st.Bavail) * float64(st.Bsize) / gib
	total := float64(st.Blocks) * float64(st.Bsize) / gib
	where := abs
	if at != abs {
		where = fmt.Sprintf("%s (does not exist yet; measured at %s)", abs, at)
	}
	detail := fmt.Sprintf("%.1f GiB free of %.1f GiB for %s", free, total, where)
	if free < MinFreeDiskGiB {
		return Check{Detail: detail, Fix: fmt.Sprintf("free space on that filesystem or put the data directory on a larger one: at least %d GiB should be free", MinFreeDiskGiB)}
	}
	return Check{OK: true, Detail: detail}
}
