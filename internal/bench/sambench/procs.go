package sambench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Proc is what one process cost when it was read.
type Proc struct {
	PID     int    `json:"pid"`
	Name    string `json:"name,omitempty"`
	RSSKiB  int64  `json:"rss_kib"`
	FDs     int    `json:"fds"`
	Threads int    `json:"threads"`
	Error   string `json:"error,omitempty"`
}

// findProcs returns the pids asked for: those given, and every process
// (other than this one) whose command name or argv[0] base name is name.
func findProcs(pids []int, name string) ([]int, error) {
	out := slices.Clone(pids)
	if name == "" {
		return out, nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	found := false
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if procName(pid) == name || argv0(pid) == name {
			found = true
			if !slices.Contains(out, pid) {
				out = append(out, pid)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no process named %q", name)
	}
	slices.Sort(out)
	return out, nil
}

func procName(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func argv0(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return ""
	}
	a, _, _ := strings.Cut(string(b), "\x00")
	return filepath.Base(a)
}

func ReadProcs(pids []int) []Proc {
	var out []Proc
	for _, pid := range pids {
		out = append(out, ReadProc(pid))
	}
	return out
}

// ReadProc reads VmRSS and Threads of /proc/<pid>/status and counts
// /proc/<pid>/fd.
func ReadProc(pid int) Proc {
	p := Proc{PID: pid, Name: procName(pid)}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		p.Error = err.Error()
		return p
	}
	p.RSSKiB, p.Threads = parseStatus(string(b))
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		p.Error = err.Error()
	}
	p.FDs = len(fds)
	return p
}

// parseStatus returns VmRSS (kB) and Threads of a /proc/<pid>/status.
func parseStatus(s string) (rssKiB int64, threads int) {
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rssKiB, _ = strconv.ParseInt(f[1], 10, 64)
		case "Threads:":
			threads, _ = strconv.Atoi(f[1])
		}
	}
	return rssKiB, threads
}

// workDir is dir, or when it is empty a new temporary directory named
// after prefix that done removes; done is a no-op for a directory given.
func workDir(dir, prefix string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	return d, func() { os.RemoveAll(d) }, nil
}

// startNode starts the sam-node bin with dir's node.yaml and policy.yaml,
// serving on the Unix socket nodeSock, its admin listener on loopback's
// adminPort, logging to dir/sam-node.log. The caller waits for it.
func startNode(ctx context.Context, bin, dir, nodeSock string, adminPort int) (*exec.Cmd, error) {
	nodeLog, _ := os.Create(filepath.Join(dir, "sam-node.log"))
	node := exec.CommandContext(ctx, bin, "--config", filepath.Join(dir, "node.yaml"), "--policy", filepath.Join(dir, "policy.yaml"),
		"--listen", "unix://"+nodeSock, "--admin-addr", fmt.Sprintf("127.0.0.1:%d", adminPort))
	node.Stdout, node.Stderr = nodeLog, nodeLog
	if err := node.Start(); err != nil {
		return nil, fmt.Errorf("sam-node: %w", err)
	}
	return node, nil
}
