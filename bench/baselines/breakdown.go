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

// rollup is what one smaps_rollup file says, in KiB: Pss, and Held, the
// part of it no reclaim can take back without swap (Pss_Anon plus
// Pss_Shmem: a Go heap, a sandbox's memory file). The rest of Pss is file
// pages (runsc's own text, the rootfs's libraries), which MemAvailable
// counts as available.
type rollup struct{ Pss, Held int64 }

// parseRollup reads a smaps_rollup file; a line it lacks is 0.
func parseRollup(b []byte) rollup {
	var r rollup
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		f := strings.Fields(rest)
		if !ok || len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch name {
		case "Pss":
			r.Pss = n
		case "Pss_Anon", "Pss_Shmem":
			r.Held += n
		}
	}
	return r
}

// classUsage is one process class's memory, in MiB, and how many
// processes it has.
type classUsage struct {
	PssMiB, HeldMiB float64
	Procs           int
}

// memoryByClass sums the memory of the host's processes by processClass.
func memoryByClass() map[string]classUsage {
	by := map[string]classUsage{}
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
		b, err := os.ReadFile(filepath.Join(dir, "smaps_rollup"))
		if err != nil {
			continue
		}
		r := parseRollup(b)
		u := by[class]
		u.PssMiB += float64(r.Pss) / 1024
		u.HeldMiB += float64(r.Held) / 1024
		u.Procs++
		by[class] = u
	}
	return by
}

// usageSince is after less before, class by class.
func usageSince(after, before map[string]classUsage) map[string]classUsage {
	d := map[string]classUsage{}
	for c, a := range after {
		b := before[c]
		d[c] = classUsage{PssMiB: a.PssMiB - b.PssMiB, HeldMiB: a.HeldMiB - b.HeldMiB, Procs: a.Procs - b.Procs}
	}
	return d
}
