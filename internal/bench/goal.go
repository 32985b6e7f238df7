package bench

import "fmt"

// Goal is what a series compared with a baseline must stay within: at
// most Ratio times the baseline, or (PlusMs > 0) at most PlusMs
// milliseconds over it. The zero Goal is none: the comparison is only
// reported.
type Goal struct {
	Ratio  float64 `json:"ratio,omitempty"`
	PlusMs float64 `json:"plus_ms,omitempty"`
}

// Set reports whether g is a goal at all.
func (g Goal) Set() bool { return g.Ratio > 0 || g.PlusMs > 0 }

func (g Goal) String() string {
	switch {
	case g.PlusMs > 0:
		return fmt.Sprintf("≤ +%g ms", g.PlusMs)
	case g.Ratio > 0:
		return fmt.Sprintf("≤ %g", g.Ratio)
	}
	return ""
}

// Met says whether v against baseline b meets g.
func (g Goal) Met(v, b float64) bool {
	if g.PlusMs > 0 {
		return v-b <= g.PlusMs
	}
	return v/b <= g.Ratio
}

// Meets is Met as a pointer, for results files (nil: no goal).
func (g Goal) Meets(v, b float64) *bool {
	m := g.Met(v, b)
	return &m
}

// Format is v against b as g reads it: milliseconds over (and the ratio)
// for a PlusMs goal, else the ratio.
func (g *Goal) Format(v, b float64) string {
	if g != nil && g.PlusMs > 0 {
		return fmt.Sprintf("%+.1f ms (%.2f)", v-b, v/b)
	}
	return fmt.Sprintf("%.2f", v/b)
}

// Verdict says whether a goal was met over the run (overall; nil: no
// goal), and whether its rounds straddle it (met of rounds).
func Verdict(overall *bool, met, rounds int) string {
	if overall == nil {
		return "—"
	}
	v := "not met"
	if *overall {
		v = "met"
	}
	if rounds > 1 && met != 0 && met != rounds {
		v += fmt.Sprintf(" (straddles: %d of %d rounds)", met, rounds)
	}
	return v
}
