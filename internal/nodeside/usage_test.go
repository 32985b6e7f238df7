package nodeside

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDiskBytesWalksOncePerWindow: what a sandbox wrote is a walk of its
// upper layer, served again for diskFresh; a walk cut short is answered
// but not kept.
func TestDiskBytesWalksOncePerWindow(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) {
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a", 100)
	var c cpuReadings
	if got := c.diskBytes(context.Background(), "sb", dir); got != 100 {
		t.Fatalf("first walk: %d, want 100", got)
	}
	write("b", 50)
	if got := c.diskBytes(context.Background(), "sb", dir); got != 100 {
		t.Errorf("within the window: %d, want the kept 100", got)
	}
	c.disk["sb"] = diskReading{at: time.Now().Add(-diskFresh), bytes: 100}
	if got := c.diskBytes(context.Background(), "sb", dir); got != 150 {
		t.Errorf("after the window: %d, want 150", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.diskBytes(ctx, "other", dir)
	if _, kept := c.disk["other"]; kept {
		t.Error("a walk cut short was kept")
	}
}
