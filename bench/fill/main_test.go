package main

import "testing"

// TestLocal: the benchmark calls only its own daemon's gateway.
func TestLocal(t *testing.T) {
	for ep, want := range map[string]bool{
		"http://127.0.0.1:20000": true,
		"http://10.0.0.1:20000":  false,
		"https://127.0.0.1:1":    false,
		"http://example.com:80":  false,
		"http://127.0.0.1":       false,
		"":                       false,
	} {
		if got := local(ep); got != want {
			t.Errorf("local(%q) = %v, want %v", ep, got, want)
		}
	}
}
