package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Where a runtime's memory goes: the proportional set size (PSS: a page
// shared by n processes counts 1/n to each, so the sum over processes is
// what they cost together) of every process on the host, by what it is.
// Read once a runtime holds its copies, it says which part of a copy's
// cost is the program, the sandbox's kernel (gVisor's sentry), its file
// proxy (gofer), and the runtime's daemons and shims.

// processClass names what a process is from its command line, or "" for
// one no runtime here started.
func processClass(comm string, argv []string) string {
	joined := strings.Join(argv, " ")
	base := ""
	if len(argv) > 0 {
		base = filepath.Base(argv[0])
	}
	switch {
	// runsc runs its gofer and sandbox as itself renamed (argv[0]
	// "runsc-gofer", "runsc-sandbox"; comm "exe"), and systrap's stub
	// processes as "exe" with no command line.
	case base == "runsc-gofer" || strings.Contains(joined, "runsc") && strings.Contains(joined, " gofer "):
		return "gVisor gofer"
	case base == "runsc-sandbox" || strings.Contains(joined, "runsc") && strings.Contains(joined, " boot "):
		return "gVisor sentry"
	case comm == "exe" && len(argv) == 0:
		return "gVisor systrap stubs"
	case base == "sandstormd":
		return "sandstormd"
	case base == "dockerd":
		return "dockerd"
	case base == "containerd":
		return "containerd"
	case strings.HasPrefix(base, "containerd-shim"):
		return "containerd shim"
	case base == "conmon":
		return "conmon"
	case base == "bwrap":
		return "bwrap"
	case strings.HasPrefix(comm, "python3"):
		return "the program (python3)"
	}
	return ""
}

// parsePss is the Pss of a smaps_rollup file, in KiB.
func parsePss(b []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// memoryByClass sums the PSS of the host's processes by processClass, in
// MiB, with how many processes each class has.
func memoryByClass() (mib map[string]float64, procs map[string]int) {
	mib, procs = map[string]float64{}, map[string]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue // gone
		}
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		var argv []string
		if len(cmdline) > 0 {
			argv = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		}
		class := processClass(strings.TrimSpace(string(comm)), argv)
		if class == "" {
			continue
		}
		rollup, err := os.ReadFile(filepath.Join(dir, "smaps_rollup"))
		if err != nil {
			continue
		}
		mib[class] += float64(parsePss(rollup)) / 1024
		procs[class]++
	}
	return mib, procs
}
