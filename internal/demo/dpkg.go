package demo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// installed returns the subset of pkgs that dpkg reports as installed.
func installed(pkgs []string) (map[string]bool, error) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		return nil, fmt.Errorf("demo: dpkg-query not found (demo rootfs are built from Debian packages): %w", err)
	}
	args := append([]string{"-W", "-f", "${Package} ${db:Status-Status}\n", "--"}, pkgs...)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("dpkg-query", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Exit status 1 only means some package is unknown; the others are
	// still printed.
	if err := cmd.Run(); err != nil {
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

// packageFiles checks that pkgs are installed and returns the absolute paths
// of all files and directories they ship (dpkg -L), in listing order.
func packageFiles(demo string, pkgs []string) ([]string, error) {
	if err := checkInstalled(demo, pkgs); err != nil {
		return nil, err
	}
	var files []string
	for _, p := range pkgs {
		out, err := exec.Command("dpkg", "-L", p).Output()
		if err != nil {
			return nil, fmt.Errorf("demo: dpkg -L %s: %w", p, err)
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
