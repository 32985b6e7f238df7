package meshconsole

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/sam/policy"
)

// TestRing: newest first, and bounded — the oldest go.
func TestRing(t *testing.T) {
	g := NewRing(3)
	if len(g.List()) != 0 {
		t.Fatal("a new ring is not empty")
	}
	for i := 1; i <= 5; i++ {
		g.Add(api.MeshRefusal{Reason: fmt.Sprint(i)})
		var got []string
		for _, r := range g.List() {
			got = append(got, r.Reason)
		}
		var want []string
		for j := i; j > 0 && j > i-3; j-- {
			want = append(want, fmt.Sprint(j))
		}
		if !slices.Equal(got, want) {
			t.Errorf("after %d: %v, want %v", i, got, want)
		}
	}
	if l := g.List(); l[0].Seq != 5 || l[2].Seq != 3 {
		t.Errorf("numbering: %+v", l)
	}
}

// TestPrincipals: each bound principal with its roles' services and
// egress merged (deduplicated, in the document's order), exactly the
// principals internal/sam/policy compiles; no document is no principal; a
// document members would refuse is refused here too.
func TestPrincipals(t *testing.T) {
	doc := `
roles:
  - {name: coder, services: ["inference://gpt-small", "mcp://everything/echo"], egress: ["api.github.com"]}
  - {name: reader, services: ["mcp://everything/echo", "mcp://docs"], egress: ["*.pypi.org"], egress_private: ["10.20.0.0/16"]}
bindings:
  - {principal: agent-b, roles: [reader]}
  - {principal: agent-a, roles: [coder, reader]}
`
	got, err := Principals(doc)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := policy.Parse([]byte(doc))
	var names []string
	for _, g := range got {
		names = append(names, g.Name)
	}
	if !slices.Equal(names, p.Principals()) {
		t.Fatalf("principals %v, want %v", names, p.Principals())
	}
	a := got[0]
	if !slices.Equal(a.Roles, []string{"coder", "reader"}) ||
		!slices.Equal(a.Services, []string{"inference://gpt-small", "mcp://everything/echo", "mcp://docs"}) ||
		!slices.Equal(a.Egress, []string{"api.github.com", "*.pypi.org"}) || !slices.Equal(a.EgressPrivate, []string{"10.20.0.0/16"}) {
		t.Errorf("agent-a: %+v", a)
	}
	if b := got[1]; !slices.Equal(b.Services, []string{"mcp://everything/echo", "mcp://docs"}) || len(b.Roles) != 1 {
		t.Errorf("agent-b: %+v", b)
	}
	if got, err := Principals(""); err != nil || len(got) != 0 {
		t.Errorf("no policy: %v %v", got, err)
	}
	if _, err := Principals("roles: [{name: x, services: [\"ftp://nope\"]}]\nbindings: []\n"); err == nil {
		t.Error("a policy members refuse was shown")
	}
}

func agentRow(principal, target string, count uint64, last time.Time) api.RefusalRow {
	return api.RefusalRow{Principal: principal, By: api.RefusedByBoundary, What: api.RefusedName, Target: target, Reason: "destination not granted",
		Count: count, First: last.Add(-time.Second), Last: last}
}

// TestAgents: members' reports are summed by row across reports and
// listed newest first; a member flooding rows keeps at most its share
// and cannot push another member's rows out; what is let go, and what a
// member could not itemise, is counted as dropped for that member.
func TestAgents(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	a := NewAgents(10, 4)
	a.Add("node-a", api.RefusalReport{Rows: []api.RefusalRow{agentRow("agent-a", "example.com", 3, t0)}, Dropped: 7})
	a.Add("node-a", api.RefusalReport{Rows: []api.RefusalRow{agentRow("agent-a", "example.com", 2, t0.Add(time.Minute))}})
	a.Add("node-b", api.RefusalReport{Rows: []api.RefusalRow{agentRow("agent-b", "example.com", 1, t0.Add(time.Second))}})
	l := a.List()
	if len(l) != 2 || l[0].Member != "node-a" || l[0].Count != 5 || !l[0].First.Equal(t0.Add(-time.Second)) || !l[0].Last.Equal(t0.Add(time.Minute)) {
		t.Fatalf("list: %+v", l)
	}
	if a.Dropped("node-a") != 7 || a.Dropped("node-b") != 0 {
		t.Errorf("dropped: %d %d", a.Dropped("node-a"), a.Dropped("node-b"))
	}
	// node-c floods: 100 rows in one report, newer than everything.
	var flood []api.RefusalRow
	for i := 0; i < 100; i++ {
		flood = append(flood, agentRow("attacker", fmt.Sprintf("n%d.example", i), 1, t0.Add(time.Hour+time.Duration(i)*time.Second)))
	}
	a.Add("node-c", api.RefusalReport{Rows: flood})
	l = a.List()
	per := map[string]int{}
	for _, r := range l {
		per[r.Member]++
	}
	if per["node-c"] != 4 || per["node-a"] != 1 || per["node-b"] != 1 || len(l) != 6 {
		t.Errorf("after a flood: %v", per)
	}
	if l[0].Target != "n99.example" || a.Dropped("node-c") != 96 {
		t.Errorf("the flood kept %q first, dropped %d; want its newest kept and 96 dropped", l[0].Target, a.Dropped("node-c"))
	}
	// Many members: the whole table holds its size; the oldest go.
	for m := 0; m < 5; m++ {
		a.Add(fmt.Sprintf("node-m%d", m), api.RefusalReport{Rows: []api.RefusalRow{agentRow("x", "a", 1, t0.Add(2*time.Hour)), agentRow("x", "b", 1, t0.Add(2*time.Hour))}})
	}
	if l := a.List(); len(l) != 10 {
		t.Errorf("%d rows, want 10", len(l))
	}
	if a.Dropped("node-a") != 7+5 || a.Dropped("node-b") != 1 || a.Dropped("node-c") != 100 {
		t.Errorf("the six oldest rows were not the ones let go: dropped %d, %d, %d", a.Dropped("node-a"), a.Dropped("node-b"), a.Dropped("node-c"))
	}
}
