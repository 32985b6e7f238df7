package bench

import (
	"os"
	"testing"
	"time"
)

func TestParseSchedstat(t *testing.T) {
	if d, err := parseSchedstat("123456789 4000 17\n"); err != nil || d != 123456789*time.Nanosecond {
		t.Errorf("got %v, %v", d, err)
	}
	for _, bad := range []string{"", "1 2", "x 2 3", "1 2 3 4"} {
		if _, err := parseSchedstat(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// TestProcessCPUCountsWork spins until this process's reading has grown by
// 20 ms; a reader that did not count running threads would never get
// there, and the spin is bounded in wall time so a loaded machine only
// makes it longer.
func TestProcessCPUCountsWork(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for deadline := time.Now().Add(10 * time.Second); ; {
		for range 100000 {
			x++
		}
		now, err := ProcessCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now-before >= 20*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s of spinning (x=%d) the reading grew by %v only", x, now-before)
		}
	}
	if _, err := ProcessCPU(1 << 30); err == nil {
		t.Error("a pid that does not exist: want an error")
	}
}
