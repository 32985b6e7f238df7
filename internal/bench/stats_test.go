package bench

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestRank(t *testing.T) {
	for _, c := range []struct {
		n    int
		p    float64
		want int
	}{
		{1, 0, 1}, {1, 50, 1}, {1, 99, 1}, {1, 100, 1},
		{2, 0, 1}, {2, 50, 1}, {2, 50.1, 2}, {2, 100, 2},
		{4, 25, 1}, {4, 26, 2}, {4, 75, 3}, {4, 76, 4},
		{5, 50, 3}, {5, 40, 2}, {5, 41, 3},
		{10, 99, 10}, {10, 90, 9},
		{50, 99, 50}, {50, 50, 25},
		{100, 99, 99}, {100, 1, 1}, {100, 100, 100},
		{200, 99, 198}, {1000, 99.9, 999}, {1000, 99, 990},
	} {
		if got := Rank(c.n, c.p); got != c.want {
			t.Errorf("Rank(%d, %v) = %d, want %d", c.n, c.p, got, c.want)
		}
	}
}

func TestPercentileKnownSamples(t *testing.T) {
	// The worked example of the nearest-rank method: 15, 20, 35, 40, 50.
	s := []float64{50, 15, 40, 20, 35}
	for _, c := range []struct{ p, want float64 }{
		{0, 15}, {5, 15}, {20, 15}, {30, 20}, {40, 20}, {50, 35}, {75, 40}, {99, 50}, {100, 50},
	} {
		got, err := Percentile(s, c.p)
		if err != nil || got != c.want {
			t.Errorf("Percentile(%v, %v) = %v, %v; want %v", s, c.p, got, err, c.want)
		}
	}
	if !slices.Equal(s, []float64{50, 15, 40, 20, 35}) {
		t.Errorf("Percentile modified its input: %v", s)
	}
	// Even n: the median is the lower middle value, never an average.
	got, _ := Percentile([]float64{4, 1, 3, 2}, 50)
	if got != 2 {
		t.Errorf("median of 1..4 = %v, want 2 (an observed value)", got)
	}
}

func TestPercentileSingle(t *testing.T) {
	for _, p := range []float64{0, 1, 50, 99, 100} {
		got, err := Percentile([]float64{7.5}, p)
		if err != nil || got != 7.5 {
			t.Errorf("Percentile([7.5], %v) = %v, %v", p, got, err)
		}
	}
}

func TestPercentileErrors(t *testing.T) {
	if _, err := Percentile(nil, 50); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty sample: err = %v, want ErrEmpty", err)
	}
	for _, p := range []float64{-1, 100.5} {
		if _, err := Percentile([]float64{1}, p); err == nil {
			t.Errorf("p = %v: no error", p)
		}
	}
}

func TestPercentileIsObserved(t *testing.T) {
	var s []float64
	for i := range 137 {
		s = append(s, float64((i*7919)%137)+0.25)
	}
	for p := 0.0; p <= 100; p += 0.5 {
		v, err := Percentile(s, p)
		if err != nil || !slices.Contains(s, v) {
			t.Fatalf("Percentile(p=%v) = %v, %v: not a sample", p, v, err)
		}
	}
}

func TestSummarize(t *testing.T) {
	var s []float64
	for i := 100; i >= 1; i-- {
		s = append(s, float64(i))
	}
	sum, err := Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{N: 100, MinMs: 1, P50Ms: 50, P99Ms: 99, MaxMs: 100}
	if sum != want {
		t.Errorf("Summarize(1..100) = %+v, want %+v", sum, want)
	}
	sum, _ = Summarize([]float64{3, 1, 2})
	if want := (Summary{N: 3, MinMs: 1, P50Ms: 2, P99Ms: 3, MaxMs: 3}); sum != want {
		t.Errorf("Summarize(3,1,2) = %+v, want %+v", sum, want)
	}
	sum, _ = Summarize([]float64{42})
	if want := (Summary{N: 1, MinMs: 42, P50Ms: 42, P99Ms: 42, MaxMs: 42}); sum != want {
		t.Errorf("Summarize(42) = %+v, want %+v", sum, want)
	}
	if _, err := Summarize(nil); !errors.Is(err, ErrEmpty) {
		t.Errorf("Summarize(nil): err = %v", err)
	}
}

func TestMs(t *testing.T) {
	if got := Ms(1234567 * time.Nanosecond); got != 1.234 {
		t.Errorf("Ms(1.234567ms) = %v, want 1.234", got)
	}
}
