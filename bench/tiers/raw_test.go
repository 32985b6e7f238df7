package main

import "testing"

// TestRunID keeps the run ID as short as internal/bench/raw's TestNames
// assumes: it names the raw namespace, veth (15 bytes at most) and
// containers (32).
func TestRunID(t *testing.T) {
	if id := newRunID(); len(id) != 6 {
		t.Errorf("run ID %q: want 6 hex digits", id)
	}
}
