// Package tier is the tiering policy of the Sandstorm seed ("How it works"):
// a sandbox drops one tier at a time as it stays idle — hot → frozen →
// snapshot → detached — and, when the node is short on memory, the sandboxes
// least in demand go to disk first. It is pure: views in, decisions out; the
// node carries the decisions out.
package tier

import (
	"fmt"
	"sort"
	"time"

	"sandstorm/api"
)

// Timers are the idle times after which a sandbox drops to the next tier,
// each counted from the later of its last activity and its arrival in its
// current tier. Zero disables that step (the sandbox stays where it is).
type Timers struct {
	Freeze   time.Duration // hot → frozen
	Snapshot time.Duration // frozen → snapshot
	Detach   time.Duration // snapshot → detached
}

// With is t with what o sets (a sandbox's own timers over the node's): a
// field o leaves empty keeps t's. An unparsable or negative duration is an
// error that names its field.
func (t Timers) With(o *api.IdleTimers) (Timers, error) {
	if o == nil {
		return t, nil
	}
	for _, f := range []struct {
		name, v string
		to      *time.Duration
	}{{"freeze_after", o.FreezeAfter, &t.Freeze}, {"snapshot_after", o.SnapshotAfter, &t.Snapshot}, {"detach_after", o.DetachAfter, &t.Detach}} {
		if f.v == "" {
			continue
		}
		d, err := time.ParseDuration(f.v)
		if err != nil || d < 0 {
			return t, fmt.Errorf("idle.%s %q: want a duration such as 30s or 5m, or 0 for never", f.name, f.v)
		}
		*f.to = d
	}
	return t, nil
}

// View is what the policy needs to know of one sandbox.
type View struct {
	ID         string
	Tier       api.Tier
	LastActive time.Time
	// TierSince is when the sandbox arrived in Tier.
	TierSince time.Time
	// Busy is true while a transition is in progress or connections are
	// open; busy sandboxes are never moved by the idle timers.
	Busy bool
	// Timers, when set, are the sandbox's own idle timers, in place of
	// the node's.
	Timers *Timers
}

// idleSince is when the sandbox last did anything or changed tier.
func (v View) idleSince() time.Time {
	if v.TierSince.After(v.LastActive) {
		return v.TierSince
	}
	return v.LastActive
}

// Next returns the tier an idle sandbox should drop to now, and whether it
// should move at all. canCheckpoint is false for backends without a
// snapshot tier (process backend): their frozen sandboxes go straight to
// detached after Snapshot+Detach.
func Next(v View, t Timers, now time.Time, canCheckpoint bool) (api.Tier, bool) {
	if v.Busy {
		return "", false
	}
	if v.Timers != nil {
		t = *v.Timers
	}
	idle := now.Sub(v.idleSince())
	switch v.Tier {
	case api.TierHot:
		if t.Freeze > 0 && idle >= t.Freeze {
			return api.TierFrozen, true
		}
	case api.TierFrozen:
		if canCheckpoint {
			if t.Snapshot > 0 && idle >= t.Snapshot {
				return api.TierSnapshot, true
			}
		} else if t.Snapshot > 0 && t.Detach > 0 && idle >= t.Snapshot+t.Detach {
			return api.TierDetached, true
		}
	case api.TierSnapshot:
		if t.Detach > 0 && idle >= t.Detach {
			return api.TierDetached, true
		}
	}
	return "", false
}

// Victims orders the sandboxes that hold memory (hot and frozen), least in
// demand first, for the memory guard to push to disk. Least in demand is
// least recently active: frozen ones before hot ones, since a frozen sandbox
// has already been idle past the freeze timer. exclude (the sandbox being
// woken) and busy sandboxes are left out.
func Victims(vs []View, exclude string) []View {
	var out []View
	for _, v := range vs {
		if v.ID == exclude || v.Busy {
			continue
		}
		if v.Tier == api.TierHot || v.Tier == api.TierFrozen {
			out = append(out, v)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if (out[i].Tier == api.TierFrozen) != (out[j].Tier == api.TierFrozen) {
			return out[i].Tier == api.TierFrozen
		}
		return out[i].LastActive.Before(out[j].LastActive)
	})
	return out
}
