package main

import (
	"slices"
	"testing"
	"time"
)

func TestParseFlagsDefaults(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.n != 50 || c.startN != 50 || c.wakeN != 50 || c.hotN != 200 {
		t.Errorf("default counts: n=%d start=%d wake=%d hot=%d", c.n, c.startN, c.wakeN, c.hotN)
	}
	if c.poll != 10*time.Millisecond {
		t.Errorf("default poll = %s, want 10ms", c.poll)
	}
	if !slices.Equal(c.templates, []string{"web", "app64"}) || !slices.Equal(c.series, allSeries) {
		t.Errorf("templates %v, series %v", c.templates, c.series)
	}
	c, err = parseFlags([]string{"-n", "20", "--hot-n", "7", "--series", "hot, frozen,hot", "--templates", "web"})
	if err != nil {
		t.Fatal(err)
	}
	if c.startN != 20 || c.wakeN != 20 || c.hotN != 7 {
		t.Errorf("-n 20 --hot-n 7: start=%d wake=%d hot=%d", c.startN, c.wakeN, c.hotN)
	}
	if !slices.Equal(c.series, []string{"hot", "frozen"}) || !c.wants("frozen") || c.wants("start") {
		t.Errorf("series = %v", c.series)
	}
	if c.wantsRaw() {
		t.Error("hot,frozen: wantsRaw")
	}
}

func TestParseFlagsRuntime(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.platform != "systrap" || c.runsc != "" || !c.wantsRaw() {
		t.Errorf("defaults: platform %q, runsc %q, wantsRaw %v", c.platform, c.runsc, c.wantsRaw())
	}
	for _, s := range rawSeries {
		if !slices.Contains(allSeries, s) {
			t.Errorf("raw series %s is not a measurement", s)
		}
	}
	c, err = parseFlags([]string{"--platform", "ptrace", "--runsc", "/x/runsc", "--series", "raw-restore"})
	if err != nil {
		t.Fatal(err)
	}
	if c.platform != "ptrace" || c.runsc != "/x/runsc" || !c.wantsRaw() {
		t.Errorf("platform %q, runsc %q, wantsRaw %v", c.platform, c.runsc, c.wantsRaw())
	}
	if _, err := parseFlags([]string{"--platform", "kvm"}); err == nil {
		t.Error("--platform kvm: no error")
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-n", "0"},
		{"--series", "warm"},
		{"--templates", ","},
		{"--poll", "0s"},
		{"--interleave", "0"},
		{"extra"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q): no error", args)
		}
	}
}

func TestParseCount(t *testing.T) {
	for _, c := range []struct {
		body string
		n    int
		ok   bool
	}{
		{"count=1 pid=1\n", 1, true},
		{"count=42 pid=1 heap_bytes=67108864\n", 42, true},
		{"ok", 0, false},
		{"count=x", 0, false},
	} {
		n, ok := parseCount(c.body)
		if n != c.n || ok != c.ok {
			t.Errorf("parseCount(%q) = %d, %v", c.body, n, ok)
		}
	}
}

func TestArgv0(t *testing.T) {
	for in, want := range map[string]string{
		"runsc-sandbox\x00--network=sandbox\x00boot\x00": "runsc-sandbox",
		"/usr/bin/runsc\x00run\x00":                      "runsc",
		"sleep":                                          "sleep",
	} {
		if got := argv0([]byte(in)); got != want {
			t.Errorf("argv0(%q) = %q, want %q", in, got, want)
		}
	}
	if got := argv0(nil); got == "runsc-sandbox" {
		t.Errorf("argv0(nil) = %q", got)
	}
}

// TestUpToShares checks the samples a series has at the end of each pass:
// never fewer than before, every pass's share within one of the others'
// (so a series and its baseline alternate evenly), and all of total at
// the last pass, for shares smaller and larger than one sample.
func TestUpToShares(t *testing.T) {
	for _, c := range []struct{ total, steps int }{{100, 20}, {100, 100}, {15, 20}, {7, 3}, {1, 4}} {
		prev, lo, hi := 0, c.total, 0
		for step := 1; step <= c.steps; step++ {
			n := upTo(c.total, step, c.steps)
			if n < prev {
				t.Fatalf("total %d, %d steps: step %d has %d, fewer than step %d's %d", c.total, c.steps, step, n, step-1, prev)
			}
			lo, hi = min(lo, n-prev), max(hi, n-prev)
			prev = n
		}
		if prev != c.total {
			t.Errorf("total %d, %d steps: ends at %d", c.total, c.steps, prev)
		}
		if hi-lo > 1 {
			t.Errorf("total %d, %d steps: shares from %d to %d", c.total, c.steps, lo, hi)
		}
	}
}
