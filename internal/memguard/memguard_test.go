package memguard

import (
	"math"
	"testing"
	"time"
)

func TestHeadroom(t *testing.T) {
	for _, c := range []struct {
		avail, reserve int64
		ps             []Promise
		want           int64
	}{
		{4096, 1024, nil, 3072},
		// A sandbox admitted at 1024 that holds 100 so far still counts
		// the 924 it has to take.
		{4096, 1024, []Promise{{1024, 100}}, 2148},
		// One that grew past what it was admitted at owes nothing more.
		{4096, 1024, []Promise{{256, 300}, {512, 0}}, 2560},
		{1000, 1024, nil, -24},
	} {
		if got := Headroom(c.avail, c.reserve, c.ps); got != c.want {
			t.Errorf("Headroom(%d, %d, %v) = %d, want %d", c.avail, c.reserve, c.ps, got, c.want)
		}
	}
}

func TestExpected(t *testing.T) {
	for _, c := range []struct{ limit, settled, want int64 }{
		{1024, 0, 1024},    // never seen: its whole limit
		{1024, 100, 125},   // seen at 100: +25 %
		{1024, 1000, 1024}, // never above the limit
		{1024, 4, 16},      // never below the floor
		{0, 0, 16},
	} {
		if got := Expected(c.limit, c.settled); got != c.want {
			t.Errorf("Expected(%d, %d) = %d, want %d", c.limit, c.settled, got, c.want)
		}
	}
}

func TestReadings(t *testing.T) {
	if a, err := AvailableMiB(); err != nil || a <= 0 {
		t.Fatalf("AvailableMiB: %d %v", a, err)
	}
	if p := PressureSome10(); p < -1 || p > 100 {
		t.Fatalf("PressureSome10: %v", p)
	}
}

func TestWatchLow(t *testing.T) {
	w := WatchLow(time.Millisecond)
	first := w.Min()
	if first <= 0 || first == math.MaxInt64 {
		t.Fatalf("no first reading: %d", first)
	}
	if w.At().IsZero() {
		t.Fatal("no time for the first reading")
	}
	low := w.Stop()
	if low > first || low <= 0 {
		t.Fatalf("Stop returned %d after a first reading of %d", low, first)
	}
	if w.Stop() != low {
		t.Fatal("a second Stop changed the reading")
	}
}
