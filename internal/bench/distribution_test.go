package bench

import (
	"errors"
	"slices"
	"testing"
)

func TestDistribute(t *testing.T) {
	var s []float64
	for i := 1000; i >= 1; i-- {
		s = append(s, float64(i))
	}
	orig := slices.Clone(s)
	d, err := Distribute(s)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Distribution{N: 1000, Min: 1, P50: 500, P90: 900, P99: 990, Max: 1000}); d != want {
		t.Errorf("Distribute(1..1000) = %+v, want %+v", d, want)
	}
	if !slices.Equal(s, orig) {
		t.Errorf("Distribute modified its input")
	}
	// Agrees with Summarize on the figures both report.
	sum, _ := Summarize(s)
	if sum.N != d.N || sum.MinMs != d.Min || sum.P50Ms != d.P50 || sum.P99Ms != d.P99 || sum.MaxMs != d.Max {
		t.Errorf("Distribute %+v disagrees with Summarize %+v", d, sum)
	}
	d, _ = Distribute([]float64{7})
	if want := (Distribution{N: 1, Min: 7, P50: 7, P90: 7, P99: 7, Max: 7}); d != want {
		t.Errorf("Distribute(7) = %+v", d)
	}
	// Ten samples: p90 is the 9th, p99 the 10th.
	d, _ = Distribute([]float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1})
	if d.P50 != 5 || d.P90 != 9 || d.P99 != 10 {
		t.Errorf("Distribute(1..10) = %+v", d)
	}
	if _, err := Distribute(nil); !errors.Is(err, ErrEmpty) {
		t.Errorf("Distribute(nil): err = %v", err)
	}
}
