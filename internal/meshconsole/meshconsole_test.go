package meshconsole

import (
	"fmt"
	"slices"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/policy"
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
// principals internal/policy compiles; no document is no principal; a
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
