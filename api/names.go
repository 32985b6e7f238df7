package api

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
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

// MaxServes bounds a template's Serves.
const MaxServes = 8

// ValidServes checks a template's mesh services: a kind sam-node serves,
// a name the policy can grant (an MCP server's is a DNS label, as in
// "mcp://<server>" and "<server>__<tool>"; a model's printable, no
// spaces), one of the template's ports, an absolute clean path, and no
// name twice.
func ValidServes(serves []Serve, ports map[int]bool) error {
	if len(serves) > MaxServes {
		return fmt.Errorf("serves: at most %d", MaxServes)
	}
	seen := map[string]bool{}
	for _, sv := range serves {
		switch sv.Kind {
		case "mcp":
			if !ValidName(sv.Name) {
				return fmt.Errorf("serves: MCP server name %q: use 1-63 of a-z, 0-9 and '-'", sv.Name)
			}
		case "inference":
			if sv.Name == "" || len(sv.Name) > 128 || strings.ContainsFunc(sv.Name, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
				return fmt.Errorf("serves: model name %q: 1-128 printable characters, no spaces", sv.Name)
			}
		default:
			return fmt.Errorf("serves: kind %q: want mcp or inference", sv.Kind)
		}
		if !ports[sv.Port] {
			return fmt.Errorf("serves %s://%s: port %d is not one of the template's ports", sv.Kind, sv.Name, sv.Port)
		}
		if !strings.HasPrefix(sv.Path, "/") || path.Clean(sv.Path) != sv.Path || len(sv.Path) > 256 {
			return fmt.Errorf("serves %s://%s: path %q: want an absolute, clean path such as /mcp or /v1", sv.Kind, sv.Name, sv.Path)
		}
		key := sv.Kind + "://" + sv.Name
		if seen[key] {
			return fmt.Errorf("serves %s twice", key)
		}
		seen[key] = true
	}
	return nil
}
