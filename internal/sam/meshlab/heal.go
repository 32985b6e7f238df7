package meshlab

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// Heal is what a Prober's record says of the time after a fault ended:
// how long until every probe succeeded for good, and what failed meanwhile.
type Heal struct {
	// After is from the fault's end until the last kind of probe began to
	// succeed for good (its first success after which none failed): every
	// member's names found and a cross-node call answered, each way.
	After time.Duration
	// Keys is each kind's own time ("call node-a→node-b", …).
	Keys map[string]time.Duration
	// Failed is how many probes that began in the window failed.
	Failed int
	// Relapses counts a success followed by a failure in the window: a
	// mesh that answered again, then broke (issue 29's +14 s).
	Relapses int
	// LongestOutage is the most failures in a row of any kind in the
	// window: 1 means every failure was followed by a success at the next
	// probe (the next "retry").
	LongestOutage int
	// Unhealed are the kinds whose last probe in the window failed.
	Unhealed []string
}

// Measure reads rec over [from, to]: the probes that began in it. A
// probe's success counts at its end (the moment a caller had its answer).
// keys limits it to kinds with one of these prefixes ("call ", "find ");
// none: every kind.
func Measure(rec map[string][]Probe, from, to time.Time, prefixes ...string) Heal {
	h := Heal{Keys: map[string]time.Duration{}}
	var keys []string
	for k := range rec {
		if matches(k, prefixes) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		var healedAt time.Time
		good, streak := false, 0
		seen := false
		for _, p := range rec[k] {
			if p.At.Before(from) || p.At.After(to) {
				continue
			}
			seen = true
			if p.OK {
				if !good {
					healedAt = p.At.Add(p.For)
				}
				good, streak = true, 0
				continue
			}
			h.Failed++
			if good {
				h.Relapses++
			}
			good = false
			streak++
			h.LongestOutage = max(h.LongestOutage, streak)
		}
		if !seen || !good {
			h.Unhealed = append(h.Unhealed, k)
			continue
		}
		d := max(healedAt.Sub(from), 0)
		h.Keys[k] = d
		h.After = max(h.After, d)
	}
	return h
}

func matches(k string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if len(k) >= len(p) && k[:len(p)] == p {
			return true
		}
	}
	return false
}

// Err says why h is not healed, or nil.
func (h Heal) Err() error {
	if len(h.Unhealed) > 0 {
		return fmt.Errorf("not healed: the last probe of %v failed", h.Unhealed)
	}
	return nil
}

// Cut drops all traffic between m and router r (nftables in m's
// namespace), as a partition would: nothing is reset, packets vanish.
func (l *Lab) Cut(m *Member, r *Router) error {
	return m.Host.nft("add", "element", "inet", "meshlab", "cut", "{ "+r.Host.Addr+" }")
}

// Uncut ends Cut.
func (l *Lab) Uncut(m *Member, r *Router) error {
	return m.Host.nft("delete", "element", "inet", "meshlab", "cut", "{ "+r.Host.Addr+" }")
}

// RestartRouter starts router r again (it was killed) and returns when it
// was asked to and when it serves.
func (l *Lab) RestartRouter(ctx context.Context, r *Router) (asked, up time.Time, err error) {
	return r.Proc.Restart(ctx, RouterReady)
}

// RestartMember starts member m again, likewise.
func (l *Lab) RestartMember(ctx context.Context, m *Member) (asked, up time.Time, err error) {
	return m.Proc.Restart(ctx, MemberReady)
}

// RestartControlPlane starts the control plane again, likewise.
func (l *Lab) RestartControlPlane(ctx context.Context) (asked, up time.Time, err error) {
	return l.CP.Restart(ctx, "control plane serving")
}
