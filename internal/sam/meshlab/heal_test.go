package meshlab

import (
	"testing"
	"time"
)

func TestMeasure(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(ms int) Probe { return Probe{At: at(ms), OK: true, For: 10 * time.Millisecond} }
	bad := func(ms int) Probe { return Probe{At: at(ms), Err: "x", For: 5 * time.Millisecond} }
	rec := map[string][]Probe{
		// Failed before the window (not counted), then twice, then for good.
		"call a→b": {bad(-500), bad(0), bad(200), ok(400), ok(600), ok(800)},
		// Answered at once, broke (a relapse), then for good at 1 s.
		"call b→a": {ok(0), bad(200), bad(400), bad(600), ok(1000), ok(1200)},
		"find a→b": {ok(100), ok(300)},
		"find b→a": {bad(100), ok(300)},
	}
	h := Measure(rec, t0, at(2000))
	if h.Err() != nil {
		t.Fatal(h.Err())
	}
	want := map[string]time.Duration{"call a→b": 410 * time.Millisecond, "call b→a": 1010 * time.Millisecond,
		"find a→b": 110 * time.Millisecond, "find b→a": 310 * time.Millisecond}
	for k, d := range want {
		if h.Keys[k] != d {
			t.Errorf("%s healed after %v, want %v", k, h.Keys[k], d)
		}
	}
	if h.After != 1010*time.Millisecond || h.Failed != 6 || h.Relapses != 1 || h.LongestOutage != 3 {
		t.Errorf("heal %+v", h)
	}
	calls := Measure(rec, t0, at(2000), "call ")
	if len(calls.Keys) != 2 || calls.Failed != 5 {
		t.Errorf("calls only: %+v", calls)
	}
	// A kind whose last probe failed has not healed.
	rec["find a→b"] = append(rec["find a→b"], bad(1500))
	if h := Measure(rec, t0, at(2000)); h.Err() == nil || len(h.Unhealed) != 1 {
		t.Errorf("a last failure: %+v", h)
	}
	// A window with no probe of a kind has not healed either.
	if h := Measure(rec, at(5000), at(6000)); h.Err() == nil {
		t.Errorf("no probe in the window: %+v", h)
	}
}
