package refusals

import (
	"unicode/utf8"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// kinds are what each decider refuses: a boundary flows, names and
// connections; sam-node models, MCP servers and tools.
var kinds = map[string]map[string]bool{
	api.RefusedByBoundary: {
		api.RefusedName: true, api.RefusedDNS: true, api.RefusedAddress: true,
		api.RefusedUnknownAddress: true, api.RefusedMeshRequest: true, api.RefusedForeign: true,
	},
	api.RefusedBySAMNode: {api.RefusedModel: true, api.RefusedMCPServer: true, api.RefusedTool: true},
}

// Check is what a receiver asks of a report before it merges it: at
// most MaxRows rows, each of a known decider and kind, text within the
// limits and printable, a count, and times in order. A report that fails
// is refused whole (errdefs.ErrBadInput) and nothing of it is kept: the
// sender's own tables make its rows, so a bad one is a bug or a forgery.
func Check(rep api.RefusalReport) error {
	if len(rep.Rows) > MaxRows {
		return errdefs.New(errdefs.ErrBadInput, "%d rows: at most %d in a report (count the rest in dropped)", len(rep.Rows), MaxRows)
	}
	for i, r := range rep.Rows {
		bad := func(format string, args ...any) error {
			return errdefs.New(errdefs.ErrBadInput, "row %d: "+format, append([]any{i}, args...)...)
		}
		switch {
		case !printable(r.Principal, MaxPrincipal) || r.Principal == "" || hasSpace(r.Principal):
			return bad("principal %q: 1 to %d printable bytes, no spaces", r.Principal, MaxPrincipal)
		case kinds[r.By] == nil:
			return bad("by %q: want %s or %s", r.By, api.RefusedByBoundary, api.RefusedBySAMNode)
		case !kinds[r.By][r.What]:
			return bad("what %q is not something %s refuses", r.What, r.By)
		case r.Target == "" || !printable(r.Target, MaxTarget):
			return bad("target: 1 to %d bytes of printable text", MaxTarget)
		case r.Reason == "" || !printable(r.Reason, MaxReason):
			return bad("reason: 1 to %d bytes of printable text", MaxReason)
		case r.From != "" && (r.By != api.RefusedBySAMNode || !printable(r.From, MaxMember) || hasSpace(r.From)):
			return bad("from %q: a member's name, for a call sam-node took from another member", r.From)
		case r.Count == 0:
			return bad("count 0")
		case r.First.IsZero() || r.Last.Before(r.First):
			return bad("first %s and last %s: want first ≤ last", r.First, r.Last)
		}
	}
	return nil
}

// printable: at most n bytes of valid UTF-8 with no control character
// (what clean makes of any text).
func printable(s string, n int) bool {
	if len(s) > n || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

func hasSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return true
		}
	}
	return false
}
