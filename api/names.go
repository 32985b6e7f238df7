package api

import (
	"regexp"
	"slices"
	"syscall"
)

// The naming rules and limits of the API: what a master checks before it
// asks a node, and what a node checks again (issue 15: in one place, so
// the master needs nothing of the node's package to validate a request).

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidName reports whether s may name a sandbox or template: 1–63 of
// [a-z0-9-], starting with a letter or digit (it appears in paths, URLs
// and host names: RFC 1123 labels).
func ValidName(s string) bool { return nameRE.MatchString(s) }

var principalRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidPrincipal reports whether s may name a principal.
func ValidPrincipal(s string) bool { return principalRE.MatchString(s) }

// MaxWarmPool bounds a warm template's pool.
const MaxWarmPool = 16

// MaxClone bounds one clone's count.
const MaxClone = 100

// reseedSignals are the signals a warm template or a clone may reseed
// with: the ones programs catch for "reload"; never one that stops or
// kills by default.
var reseedSignals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
}

// ReseedSignal parses a reseed signal name ("SIGUSR1" or "USR1").
func ReseedSignal(name string) (syscall.Signal, bool) {
	if s, ok := reseedSignals[name]; ok {
		return s, true
	}
	s, ok := reseedSignals["SIG"+name]
	return s, ok
}

// ReseedSignals lists the names ReseedSignal takes.
func ReseedSignals() []string {
	var out []string
	for k := range reseedSignals {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
