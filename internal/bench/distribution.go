package bench

import "slices"

// Distribution is the nearest-rank summary of a sample in whatever unit the
// samples are in (the caller names the unit, e.g. a JSON field "latency_us").
// Like Summary, every figure is a sample that was observed: nothing is
// interpolated and there is no mean.
type Distribution struct {
	N   int     `json:"n"`
	Min float64 `json:"min"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Distribute returns the count, minimum, p50, p90, p99 and maximum of
// samples by nearest rank over the full sorted sample (samples need not be
// sorted and are not modified). It returns ErrEmpty for an empty sample.
func Distribute(samples []float64) (Distribution, error) {
	if len(samples) == 0 {
		return Distribution{}, ErrEmpty
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	at := func(p float64) float64 { return sorted[Rank(len(sorted), p)-1] }
	return Distribution{
		N:   len(sorted),
		Min: sorted[0],
		P50: at(50),
		P90: at(90),
		P99: at(99),
		Max: sorted[len(sorted)-1],
	}, nil
}
