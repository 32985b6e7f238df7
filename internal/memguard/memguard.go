// Package memguard reads how much memory the node has left, so the node can
// refuse work instead of running out ("Nodes protect themselves" in the
// Sandstorm seed: a node short on memory turns work away and still answers
// ssh).
package memguard

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// AvailableMiB returns MemAvailable from /proc/meminfo in MiB: the kernel's
// estimate of memory that can be handed out without swapping.
func AvailableMiB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "MemAvailable:") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			break
		}
		kb, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("meminfo: %w", err)
		}
		return kb / 1024, nil
	}
	return 0, fmt.Errorf("meminfo: no MemAvailable line")
}
