// Package testenv finds what the tests need from the repository's own
// build (the pinned runsc that `make runsc` puts in bin/, a PostgreSQL
// database of their own) and holds the few helpers many packages' tests
// share (helpers.go). It imports nothing of the project's, so any
// package's tests can use it.
package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Root is the repository's top directory: the first parent of the working
// directory (a test's package directory) that holds tools/runsc/go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "tools", "runsc", "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the sandstorm repository (no tools/runsc/go.mod above the working directory)")
		}
		dir = parent
	}
}

// PinnedRunsc is the gVisor version tools/runsc/go.mod pins, as runsc
// --version prints it when built by `make runsc`:
// "gvisor.dev/gvisor@<version>".
func PinnedRunsc(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "tools", "runsc", "go.mod"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "gvisor.dev/gvisor" {
			return "gvisor.dev/gvisor@" + fields[1], nil
		}
	}
	return "", errors.New("tools/runsc/go.mod does not require gvisor.dev/gvisor")
}

// Runsc is bin/runsc of the repository, checked to be the pinned version:
// a stale binary would test another runtime than the one shipped.
func Runsc() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	want, err := PinnedRunsc(root)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, "bin", "runsc")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: build the pinned runsc with `make runsc`", bin, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	got := strings.TrimPrefix(line, "runsc version ")
	if got != want {
		return "", fmt.Errorf("%s is %s, the repository pins %s: rebuild it with `make runsc`", bin, got, want)
	}
	return bin, nil
}

// Skip skips t for why, except on CI (CI set), where what the test needs
// is installed by .ci/run and it runs as root: a skip there would prove
// nothing, so it fails instead.
func Skip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s: CI's machine must have it (.ci/run installs it and runs as root)", why)
	}
	t.Skip(why)
}
