package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// podman runs podman with everything it keeps in a directory of the
// benchmark's own (storage, run state, its temporary files, network
// configuration), runsc (the pinned one, as the daemon's) as its OCI
// runtime for RUN steps and containers alike, and cgroupfs (no systemd
// here). What it keeps elsewhere anyway is the footprint's to remove.
type podman struct {
	bin, runsc, dir string
}

// newPodman is podman under dir, or the reason it cannot run here.
func newPodman(runsc, dir string) (*podman, error) {
	bin, err := exec.LookPath("podman")
	if err != nil {
		return nil, fmt.Errorf("podman is not installed (apt-get install -y podman): %w", err)
	}
	for _, d := range []string{"root", "run", "tmp", "net", "vartmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	return &podman{bin: bin, runsc: runsc, dir: dir}, nil
}

// args are podman's global flags followed by args.
func (p *podman) args(args ...string) []string {
	return append([]string{
		"--root", filepath.Join(p.dir, "root"), "--runroot", filepath.Join(p.dir, "run"),
		"--tmpdir", filepath.Join(p.dir, "tmp"), "--network-config-dir", filepath.Join(p.dir, "net"),
		"--cgroup-manager", "cgroupfs", "--events-backend", "file", "--runtime", p.runsc,
	}, args...)
}

// run runs podman args and returns how long it took, and its output
// (combined) when it fails.
func (p *podman) run(ctx context.Context, args ...string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, p.bin, p.args(args...)...)
	// buildah's layer files go to TMPDIR (default /var/tmp).
	cmd.Env = append(os.Environ(), "TMPDIR="+filepath.Join(p.dir, "vartmp"))
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("podman %s: %v: %s", strings.Join(args, " "), err, lastLines(string(out), 6))
	}
	return d, nil
}

// version is podman's version line, "" if it does not say.
func (p *podman) version(ctx context.Context) string {
	out, _ := exec.CommandContext(ctx, p.bin, "--version").Output()
	return strings.TrimSpace(string(out))
}

// reset removes every container and image podman has under its
// directory (containers first: a runsc sandbox must not outlive the
// run), then the directory.
func (p *podman) reset(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	_, err := p.run(ctx, "rm", "--all", "--force", "--time", "0")
	if _, err2 := p.run(ctx, "system", "reset", "--force"); err == nil {
		err = err2
	}
	if err2 := os.RemoveAll(p.dir); err == nil {
		err = err2
	}
	return err
}

// lastLines is the last n lines of s, trimmed, joined by " / ".
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}
