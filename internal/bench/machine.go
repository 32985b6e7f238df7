package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"sandstorm/internal/testenv"
)

// Machine describes the machine a run measured on.
type Machine struct {
	Hostname string `json:"hostname"`
	// CPUModel is the first "model name" of /proc/cpuinfo.
	CPUModel string `json:"cpu_model"`
	// Cores is the number of logical CPUs in /proc/cpuinfo.
	Cores int `json:"cores"`
	// MemoryMiB is MemTotal of /proc/meminfo, in MiB.
	MemoryMiB int64 `json:"memory_mib"`
	// Kernel is the kernel release (uname -r).
	Kernel string `json:"kernel"`
	// OS is PRETTY_NAME of /etc/os-release.
	OS string `json:"os,omitempty"`
	// Runsc is the version RunscPath prints (the first line of `runsc
	// --version` without "runsc version "), or why it is unknown.
	Runsc string `json:"runsc"`
	// RunscPath is the binary Runsc describes: the one the run used when
	// the tool knows it (UseRunsc), else DefaultRunsc's guess.
	RunscPath string `json:"runsc_path,omitempty"`
	GoVersion string `json:"go_version"`
}

// CollectMachine describes this machine. What cannot be read is reported
// in the field itself ("unknown: …") rather than failing the run.
func CollectMachine(ctx context.Context) Machine {
	m := Machine{GoVersion: runtime.Version()}
	var err error
	if m.Hostname, err = os.Hostname(); err != nil {
		m.Hostname = "unknown: " + err.Error()
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPUModel, m.Cores = parseCPUInfo(string(b))
	}
	if m.CPUModel == "" {
		m.CPUModel = "unknown"
	}
	if m.Cores == 0 {
		m.Cores = runtime.NumCPU()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemoryMiB = parseMemTotalMiB(string(b))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	} else {
		m.Kernel = "unknown: " + err.Error()
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		m.OS = parseOSRelease(string(b))
	}
	if p := DefaultRunsc(); p != "" {
		m.UseRunsc(ctx, p)
	} else {
		m.Runsc = "not found (no bin/runsc in the repository, none on PATH)"
	}
	return m
}

// UseRunsc records path as the runsc the run used, with its version. A
// tool that passes its sandstormd or raw runsc a binary of its own must
// say so: the default may be another runsc (Debian's 2022 one on PATH).
func (m *Machine) UseRunsc(ctx context.Context, path string) {
	m.RunscPath, m.Runsc = path, RunscVersion(ctx, path)
}

// String is a one-line description for reports.
func (m Machine) String() string {
	return fmt.Sprintf("%s: %s, %d cores, %.1f GiB, Linux %s, %s, runsc %s",
		m.Hostname, m.CPUModel, m.Cores, float64(m.MemoryMiB)/1024, m.Kernel, m.OS, m.Runsc)
}

// parseCPUInfo returns the first model name and the number of processors.
func parseCPUInfo(s string) (model string, cores int) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "processor":
			cores++
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		}
	}
	return model, cores
}

// parseMemTotalMiB returns MemTotal in MiB, or 0.
func parseMemTotalMiB(s string) int64 {
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return kb / 1024
			}
		}
	}
	return 0
}

func parseOSRelease(s string) string {
	for line := range strings.Lines(s) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
			return strings.Trim(v, `"'`)
		}
	}
	return ""
}

// DefaultRunsc is the runsc a run of this repository's tools uses unless
// told otherwise: bin/runsc of the repository around the working directory
// (`make runsc` builds the pinned gVisor there, and a sandstormd built by
// make runs the runsc beside it), else the runsc on PATH, else "".
func DefaultRunsc() string {
	if root, err := testenv.Root(); err == nil {
		p := filepath.Join(root, "bin", "runsc")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return ""
}

// RunscVersion is what path --version says (see parseRunscVersion), or
// why it is unknown.
func RunscVersion(ctx context.Context, path string) string {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "unknown: " + path + " --version: " + err.Error()
	}
	return parseRunscVersion(string(out))
}

// parseRunscVersion is the first line of runsc --version's output without
// its "runsc version " prefix: "gvisor.dev/gvisor@v0.0.0-…" for the pinned
// build, "0.0~20221219.0" for Debian's.
func parseRunscVersion(out string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return strings.TrimPrefix(line, "runsc version ")
}

// Source identifies the code that was measured.
type Source struct {
	// Commit is `git rev-parse HEAD`.
	Commit string `json:"commit"`
	// Dirty is whether `git status --porcelain --untracked-files=all` listed any change (outside
	// the ignored paths), i.e. whether the binary measured may differ from
	// Commit; Changes are those lines.
	Dirty   bool     `json:"dirty"`
	Changes []string `json:"changes,omitempty"`
	// Error says why the commit or status could not be read.
	Error string `json:"error,omitempty"`
}

// Short is the commit's first 7 hex digits, or "nocommit".
func (s Source) Short() string {
	if len(s.Commit) >= 7 {
		return s.Commit[:7]
	}
	return "nocommit"
}

// String is a one-line description for reports.
func (s Source) String() string {
	switch {
	case s.Commit == "":
		return "unknown commit (" + s.Error + ")"
	case s.Dirty:
		return fmt.Sprintf("%s, dirty (%d uncommitted changes)", s.Short(), len(s.Changes))
	default:
		return s.Short() + ", clean"
	}
}

// CollectSource reads the commit and the dirty state of the git work tree
// containing dir. Changes under the ignore paths (absolute, or relative to
// the top of the work tree; typically the results directory itself) do not
// make it dirty. Failures are reported in Source.Error.
func CollectSource(ctx context.Context, dir string, ignore ...string) Source {
	var s Source
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
				return "", fmt.Errorf("git %s: %s", args[0], strings.TrimSpace(string(ee.Stderr)))
			}
			return "", fmt.Errorf("git %s: %w", args[0], err)
		}
		return string(out), nil
	}
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		s.Error = err.Error()
		return s
	}
	s.Commit = strings.TrimSpace(head)
	top, err := git("rev-parse", "--show-toplevel")
	if err != nil {
		s.Error = err.Error()
		return s
	}
	top = strings.TrimSpace(top)
	var prefixes []string
	for _, p := range ignore {
		if filepath.IsAbs(p) {
			rel, err := filepath.Rel(top, p)
			if err != nil || strings.HasPrefix(rel, "..") {
				continue
			}
			p = rel
		}
		prefixes = append(prefixes, filepath.ToSlash(filepath.Clean(p)))
	}
	// Untracked files one by one, so an ignored path inside an untracked
	// directory can be told apart from the rest of it.
	status, err := git("status", "--porcelain", "--untracked-files=all")
	if err != nil {
		s.Error = err.Error()
		return s
	}
	for line := range strings.Lines(status) {
		line = strings.TrimRight(line, "\n")
		if line == "" || ignored(porcelainPath(line), prefixes) {
			continue
		}
		s.Changes = append(s.Changes, line)
	}
	s.Dirty = len(s.Changes) > 0
	return s
}

// porcelainPath is the (destination) path of a `git status --porcelain`
// line: "XY path" or "XY from -> to".
func porcelainPath(line string) string {
	if len(line) < 4 {
		return ""
	}
	p := line[3:]
	if _, to, ok := strings.Cut(p, " -> "); ok {
		p = to
	}
	return strings.Trim(p, `"`)
}

func ignored(path string, prefixes []string) bool {
	path = strings.TrimSuffix(path, "/")
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}
