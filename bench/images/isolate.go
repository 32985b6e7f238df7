package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// strays are the processes whose command line names dir: what a tool the
// benchmark ran under dir left running (a runsc sandbox whose container
// podman could not remove).
func strays(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}
