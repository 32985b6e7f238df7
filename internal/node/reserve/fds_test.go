package reserve

import (
	"os"
	"testing"
)

// TestOpenFDs: the count moves with what this process opens.
func TestOpenFDs(t *testing.T) {
	before, limit, err := ProcessFDs()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if after, _, _ := ProcessFDs(); after != before+1 || limit == 0 {
		t.Errorf("open fds %d, then %d after one more open (limit %d)", before, after, limit)
	}
}
