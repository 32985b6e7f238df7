package main

import (
	"sandstorm/internal/bench/memstat"
	"sandstorm/internal/reclaim"

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

// memSnapshot is one reading of the host's memory as the runtimes use
// it: by process class, and by gVisor sandbox as its memory cgroup counts
// it.
type memSnapshot struct {
	ByClass   map[string]classUsage
	Sandboxes sandboxCgroups
}

// sandboxCgroups sums the memory cgroups that gVisor sentries are in
// (one per sandbox under every runtime here), in MiB: the charge the
// kernel keeps per sandbox. Anon is the sentry's and gofer's own heaps;
// Shmem the sandbox's memory file (the program's memory: gVisor's is a
// memfd); Cache page cache charged to it (files it read: its rootfs, a
// checkpoint image restored), which MemAvailable counts as available;
// Kernel what is charged besides pages (page tables, sockets,
// the sentry's kernel objects).
//
// This is the figure to read for a sandbox: the PSS of systrap's stubs
// attributes the memory file's pages to them several times over on this
// kernel (measured: stubs 17 MiB of Pss_Shmem for a web sandbox whose
// cgroup holds 9 MiB of shmem in all).
type sandboxCgroups struct {
	N                                                int
	UsageMiB, AnonMiB, ShmemMiB, CacheMiB, KernelMiB float64
}

// readSandboxCgroups reads the memory cgroups of the sentries pids.
func readSandboxCgroups(pids []int) sandboxCgroups {
	var s sandboxCgroups
	seen := map[string]bool{}
	for _, pid := range pids {
		cg, err := reclaim.CgroupOf(pid)
		if err != nil || seen[cg.Dir] {
			continue
		}
		seen[cg.Dir] = true
		b, err := os.ReadFile(filepath.Join(cg.Dir, "memory.stat"))
		if err != nil {
			continue
		}
		st := memstat.ParseStat(string(b))
		anon, file := st["rss"], st["cache"] // v1
		if cg.V2 {
			anon, file = st["anon"], st["file"]
		}
		usage := cg.Usage()
		const mib = 1 << 20
		s.N++
		s.UsageMiB += float64(usage) / mib
		s.AnonMiB += float64(anon) / mib
		s.ShmemMiB += float64(st["shmem"]) / mib
		s.CacheMiB += float64(file-st["shmem"]) / mib // both versions count shmem in file
		s.KernelMiB += float64(usage-anon-file) / mib
	}
	return s
}

// readMemory takes a memSnapshot.
func readMemory() memSnapshot {
	by, sentries := memoryByClass()
	return memSnapshot{ByClass: by, Sandboxes: readSandboxCgroups(sentries)}
}

// memoryByClass sums the memory of the host's processes by processClass,
// and returns the sentries' PIDs.
func memoryByClass() (map[string]classUsage, []int) {
	by := map[string]classUsage{}
	var sentries []int
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
		if class == "gVisor sentry" {
			pid, _ := strconv.Atoi(e.Name())
			sentries = append(sentries, pid)
		}
		r := parseRollup(b)
		u := by[class]
		u.PssMiB += float64(r.Pss) / 1024
		u.HeldMiB += float64(r.Held) / 1024
		u.Procs++
		by[class] = u
	}
	return by, sentries
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
