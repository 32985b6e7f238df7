package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
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

// packageFiles returns the absolute paths of all files and directories the
// installed packages pkgs ship (dpkg -L), in listing order.
func packageFiles(pkgs []string) ([]string, error) {
	var files []string
	for _, p := range pkgs {
		out, err := dpkgList(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			// Skip diversion notes ("diverted by ...", "package diverts
			// others to: ...") and the root "/.".
			line := sc.Text()
			if !strings.HasPrefix(line, "/") {
				continue
			}
			if f := filepath.Clean(line); f != "/" {
				files = append(files, f)
			}
		}
	}
	return files, nil
}

// dpkgTimeout bounds each dpkg-query and dpkg -L: 6–7 ms measured; they
// only read dpkg's database, so 30 s is room for a cold, busy disk.
const dpkgTimeout = 30 * time.Second

// dpkgList is `dpkg -L pkg`, bounded by dpkgTimeout.
func dpkgList(pkg string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dpkgTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "dpkg", "-L", pkg)
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("demo: dpkg -L %s: timed out after %s, killed", pkg, dpkgTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("demo: dpkg -L %s: %w", pkg, err)
	}
	return out, nil
}
