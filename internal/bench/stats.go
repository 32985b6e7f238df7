// Package bench holds what Sandstorm's benchmarks share: nearest-rank
// statistics over raw samples, and a results file that records the machine,
// the source tree, the parameters and every sample, written as JSON (for
// tools) and as a Markdown table (for people).
//
// Samples are latencies in milliseconds throughout; field and JSON names end
// in Ms / _ms to say so.
package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// ErrEmpty is returned when a statistic is asked of an empty sample.
var ErrEmpty = errors.New("bench: empty sample")

// Rank returns the 1-based nearest rank of the p-th percentile in a sample
// of n values: the smallest rank r such that at least p% of the sample is at
// or below the r-th smallest value, i.e. ceil(p/100 × n), and at least 1. So
// p = 0 is the minimum, p = 100 the maximum, and p = 50 of an even n is the
// lower of the two middle values. n must be at least 1 and p in [0, 100].
func Rank(n int, p float64) int {
	// p*n is exact for the integer percentiles used here; the tolerance
	// keeps a p such as 99.9, which has no exact binary form, from
	// rounding up past the rank it means.
	r := int(math.Ceil(p*float64(n)/100 - 1e-9))
	return min(max(r, 1), n)
}

// Percentile returns the nearest-rank p-th percentile (p in [0, 100]) of
// samples, which need not be sorted and are not modified. The result is
// always one of the samples: a value that was actually observed, never an
// interpolation between two.
func Percentile(samples []float64, p float64) (float64, error) {
	if len(samples) == 0 {
		return 0, ErrEmpty
	}
	if math.IsNaN(p) || p < 0 || p > 100 {
		return 0, fmt.Errorf("bench: percentile %v outside [0, 100]", p)
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return sorted[Rank(len(sorted), p)-1], nil
}

// Summary is the nearest-rank summary of a sample, in milliseconds.
type Summary struct {
	N     int     `json:"n"`
	MinMs float64 `json:"min_ms"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// Summarize returns the count, minimum, median (p50), p99 and maximum of
// samples (milliseconds), all by nearest rank over the full sorted sample,
// so each figure is a sample that was observed. With fewer than 100 samples
// p99 is the maximum. It returns ErrEmpty for an empty sample.
func Summarize(samples []float64) (Summary, error) {
	d, err := Distribute(samples)
	if err != nil {
		return Summary{}, err
	}
	return Summary{N: d.N, MinMs: d.Min, P50Ms: d.P50, P99Ms: d.P99, MaxMs: d.Max}, nil
}

// Ms converts a duration to milliseconds, keeping microseconds.
func Ms(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}
