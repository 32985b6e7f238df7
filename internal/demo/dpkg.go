package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// installed returns the subset of pkgs that dpkg reports as installed.
func installed(pkgs []string) (map[string]bool, error) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		return nil, fmt.Errorf("demo: dpkg-query not found (demo rootfs are built from Debian packages): %w", err)
	}
	args := append([]string{"-W", "-f", "${Package} ${db:Status-Status}\n", "--"}, pkgs...)
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), dpkgTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "dpkg-query", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	// Exit status 1 only means some package is unknown; the others are
	// still printed.
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("demo: dpkg-query: timed out after %s, killed (is dpkg's database locked or the disk hung?)", dpkgTimeout)
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			return nil, fmt.Errorf("demo: dpkg-query: %v: %s", err, strings.TrimSpace(stderr.String()))
		}
	}
	ok := make(map[string]bool)
	for line := range strings.Lines(stdout.String()) {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "installed" {
			ok[f[0]] = true
		}
	}
	return ok, nil
}

// checkInstalled returns a *MissingPackagesError naming every package of
// pkgs that is not installed, or nil.
func checkInstalled(demo string, pkgs []string) error {
	ok, err := installed(pkgs)
	if err != nil {
		return err
	}
	var missing []string
	for _, p := range pkgs {
		if !ok[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return &MissingPackagesError{Demo: demo, Packages: missing}
	}
	return nil
}

// dpkgTimeout bounds each dpkg-query: 6–7 ms measured; it only reads
// dpkg's database, so 30 s is room for a cold, busy disk.
const dpkgTimeout = 30 * time.Second
