package main

import (
	"slices"
	"testing"
)

func TestParseSizes(t *testing.T) {
	for in, want := range map[string][]int{"100,500": {100, 500}, " 64 ": {64}, "500,100": {500, 100}} {
		got, err := parseSizes(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseSizes(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-5", "100,", "1.5", "100,100", "abc"} {
		if got, err := parseSizes(in); err == nil {
			t.Errorf("parseSizes(%q) = %v, want an error", in, got)
		}
	}
}

func TestLastLines(t *testing.T) {
	if got := lastLines("a\nb\nc\nd\n", 2); got != "c / d" {
		t.Errorf("lastLines = %q", got)
	}
	if got := lastLines("only", 3); got != "only" {
		t.Errorf("lastLines = %q", got)
	}
}
