// Package refusals carries agents' refusals from where they are decided
// to sam-one's console (issue 17, item 7: "recent refusals with
// reasons").
//
// Refusals are what an agent can make as fast as it likes: an attacker
// in a sandbox spamming names its policy does not grant reaches tens of
// thousands of refusals a second (bench/results/box-…: 16,700–21,500/s
// on one core), and no part of the way to the console may cost in
// proportion. So a refusal is counted, at the source, into a Table of
// (principal, by, what, target, reason, from) rows, a count each, which
// holds at most its size; a refusal that finds it full is only counted
// (Dropped). Adding is a map update under a mutex — nothing on the hot
// path waits for the network — and every interval Forward takes the
// table whole and sends it on: the boundaries of a machine to its
// sam-node (api.SAMRefusalsPath), each sam-node to the control plane
// (api.RefusalsPath). Each hop carries at most a table's rows however
// many refusals they stand for, and each receiver checks a report (Check)
// before it merges it into its own bounded table.
package refusals

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"sandstorm/api"
)

// Limits of a table and of a report, for every hop alike.
const (
	// MaxRows is the most rows a report carries, and the default size of
	// a table: a screenful many times over per interval. A full report
	// is about 0.5 MiB of JSON at the longest fields.
	MaxRows = 1024
	// MaxTarget and MaxReason bound a row's text; longer text is cut.
	MaxTarget = 256
	MaxReason = 256
	// MaxPrincipal is a principal's longest (boundary.validPrincipal);
	// MaxMember a member's (controlplane.nameRE).
	MaxPrincipal = 256
	MaxMember    = 63
	// MaxBodyBytes bounds a report's body at every receiver.
	MaxBodyBytes = 1 << 20
)

// Refusal is one refusal as its decider says it: who, where it was
// decided (api.RefusedBy*), what kind of thing (api.Refused*), which one,
// why, and for a mesh call, the member it came from.
type Refusal struct {
	Principal, By, What, Target, Reason, From string
}

type key Refusal

// Table counts refusals by (principal, by, what, target, reason, from),
// at most its size of them; the rest are counted in Dropped. A nil
// *Table counts nothing (a boundary with no one to report to). It is
// safe for concurrent use.
type Table struct {
	max int
	now func() time.Time

	mu      sync.Mutex
	rows    map[key]*api.RefusalRow
	dropped uint64
}

// NewTable is a table of at most size rows (MaxRows if size < 1).
func NewTable(size int) *Table {
	if size < 1 {
		size = MaxRows
	}
	return &Table{max: size, now: time.Now, rows: make(map[key]*api.RefusalRow)}
}

// Add counts one refusal. Its text is cut to the limits above and made
// printable UTF-8 (a SOCKS5 client names its destination in raw bytes).
func (t *Table) Add(r Refusal) {
	if t == nil {
		return
	}
	k := key{
		Principal: cleanName(r.Principal, MaxPrincipal),
		By:        r.By, What: r.What,
		Target: clean(r.Target, MaxTarget),
		Reason: clean(r.Reason, MaxReason),
		From:   cleanName(r.From, MaxMember),
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if row := t.rows[k]; row != nil {
		row.Count++
		row.Last = now
		return
	}
	if len(t.rows) >= t.max {
		t.dropped++
		return
	}
	t.rows[k] = &api.RefusalRow{Principal: k.Principal, By: k.By, What: k.What, Target: k.Target, Reason: k.Reason, From: k.From,
		Count: 1, First: now, Last: now}
}

// Merge adds a report's rows and its dropped count, as a table that was
// full adds them: rows that find no room are counted in Dropped. The
// report must have passed Check (or come from a Table).
func (t *Table) Merge(rep api.RefusalReport) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropped = AddSat(t.dropped, rep.Dropped)
	for _, r := range rep.Rows {
		k := key{Principal: r.Principal, By: r.By, What: r.What, Target: r.Target, Reason: r.Reason, From: r.From}
		if row := t.rows[k]; row != nil {
			Fold(row, r)
			continue
		}
		if len(t.rows) >= t.max {
			t.dropped = AddSat(t.dropped, r.Count)
			continue
		}
		row := r
		t.rows[k] = &row
	}
}

// Take empties the table and returns what it held: the rows newest first
// (then by principal, what, target: a stable order) and the dropped
// count. An empty report has no rows and Dropped 0.
func (t *Table) Take() api.RefusalReport {
	if t == nil {
		return api.RefusalReport{}
	}
	t.mu.Lock()
	rows, dropped := t.rows, t.dropped
	t.rows, t.dropped = make(map[key]*api.RefusalRow, min(len(rows), t.max)), 0
	t.mu.Unlock()
	out := api.RefusalReport{Rows: make([]api.RefusalRow, 0, len(rows)), Dropped: dropped}
	for _, r := range rows {
		out.Rows = append(out.Rows, *r)
	}
	Sort(out.Rows)
	return out
}

// Len is how many rows the table holds.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.rows)
}

// Sort orders rows newest first, then by principal, what, target, reason.
func Sort(rows []api.RefusalRow) {
	slices.SortFunc(rows, func(a, b api.RefusalRow) int {
		if c := b.Last.Compare(a.Last); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.Principal, b.Principal), strings.Compare(a.What, b.What),
			strings.Compare(a.Target, b.Target), strings.Compare(a.Reason, b.Reason),
			strings.Compare(a.By, b.By), strings.Compare(a.From, b.From))
	})
}

// Empty reports whether rep carries nothing.
func Empty(rep api.RefusalReport) bool { return len(rep.Rows) == 0 && rep.Dropped == 0 }

// Fold adds r into row, a row of the same key: the counts summed (AddSat),
// the span from the first First to the last Last.
func Fold(row *api.RefusalRow, r api.RefusalRow) {
	row.Count = AddSat(row.Count, r.Count)
	if r.First.Before(row.First) {
		row.First = r.First
	}
	if r.Last.After(row.Last) {
		row.Last = r.Last
	}
}

// AddSat adds without wrapping: a count that would pass 2^64 stays there.
func AddSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// cleanName is clean for a name, in which a space is not printable
// either.
func cleanName(s string, n int) string {
	s = clean(s, n)
	if strings.IndexByte(s, ' ') >= 0 {
		s = strings.ReplaceAll(s, " ", "?")
	}
	return s
}

// clean cuts s to at most n bytes on a rune boundary and replaces what is
// not printable (control characters, invalid UTF-8) with '?'. Text that
// needs neither — nearly all — is returned as it is, with no allocation.
func clean(s string, n int) string {
	ok := len(s) <= n
	if ok {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c >= 0x7f {
				ok = false
				break
			}
		}
	}
	if ok {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > n {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
