// Package sandboxtest is what the tests of the sandbox backends
// (internal/sandbox/gvisor, internal/sandbox/process) share: a rootfs of
// the host's static busybox.
package sandboxtest

import (
	"os"
	"path/filepath"
	"testing"
)

// BusyboxRootfs makes rootfs with dirs (bin among them) and the host's
// static /bin/busybox in bin/, linked under the name of each of applets.
func BusyboxRootfs(t testing.TB, rootfs string, dirs, applets []string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("the tests need a static /bin/busybox (apt-get install -y busybox-static): %v", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range applets {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
}
