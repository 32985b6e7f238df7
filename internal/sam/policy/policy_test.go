package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `
roles:
  - name: coder
    services: ["inference://gpt-small", "mcp://calc", "mcp://everything/echo"]
    egress: ["api.github.com", "*.pypi.org", "192.0.2.7"]
  - name: all-models
    services: ["inference://*"]
bindings:
  - principal: agent-a
    roles: [coder]
  - principal: agent-b
    roles: [all-models]
`

func TestDecide(t *testing.T) {
	p, err := Parse([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		principal, host string
		want            bool
	}{
		{"agent-a", "mesh.sam.alt", true},
		{"agent-a", "MESH.SAM.ALT.", true},
		{"nobody", "mesh.sam.alt", false},
		{"agent-a", "calc.mcp.sam.alt", true},
		{"agent-a", "everything.mcp.sam.alt", true}, // one tool granted: the server is reachable
		{"agent-a", "absent.mcp.sam.alt", false},
		{"agent-b", "calc.mcp.sam.alt", false},
		{"agent-a", "gpt-small.inference.sam.alt", true},
		{"agent-a", "gpt-big.inference.sam.alt", false},
		{"agent-b", "anything.inference.sam.alt", true},
		{"agent-a", "x.y.sam.alt", false},
		{"agent-a", "sam.alt", false},
		{"agent-a", "api.github.com", true},
		{"agent-a", "evil.api.github.com", false},
		{"agent-a", "files.pypi.org", true},
		{"agent-a", "a.b.pypi.org", true},
		{"agent-a", "pypi.org", false},
		{"agent-a", "192.0.2.7", true},
		{"agent-a", "192.0.2.8", false},
		{"agent-a", "localhost", false},
		{"agent-a", "127.0.0.1", false},
		{"agent-a", "::1", false},
		{"agent-b", "api.github.com", false},
	}
	for _, c := range cases {
		d, err := Classify(c.host)
		if err != nil {
			t.Fatalf("Classify(%q): %v", c.host, err)
		}
		got, reason := p.Decide(c.principal, d)
		if got != c.want {
			t.Errorf("Decide(%s, %s) = %v (%s), want %v", c.principal, c.host, got, reason, c.want)
		}
	}
	// Absent and present-but-not-granted services are refused alike.
	_, r1 := p.Decide("agent-b", mustClassify(t, "calc.mcp.sam.alt"))
	_, r2 := p.Decide("agent-b", mustClassify(t, "absent.mcp.sam.alt"))
	if r1 != r2 {
		t.Errorf("refusals differ: %q vs %q", r1, r2)
	}
	g := p.For("agent-a")
	if !g.MCPTool("everything", "echo") || g.MCPTool("everything", "add") || !g.MCPTool("calc", "add") {
		t.Error("tool grants wrong")
	}
	if !g.Model("gpt-small") || g.Model("gpt-big") || !p.For("agent-b").Model("anything/at-all") {
		t.Error("model grants wrong")
	}
}

func mustClassify(t *testing.T, h string) Dest {
	d, err := Classify(h)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestRejectsAmbiguousEntries(t *testing.T) {
	for _, bad := range []string{"*", "api.*.com", "*.com", "api.github.com.", "api.github.com:443", "https://x.org", "10.0.0.0/8", "a b", "*.*.org", "x.mesh.sam.alt", ""} {
		f := File{Roles: []Role{{Name: "r", Egress: []string{bad}}}}
		if _, err := Compile(f); err == nil {
			t.Errorf("egress %q accepted", bad)
		} else if bad != "" && !strings.Contains(err.Error(), bad) {
			t.Errorf("error for %q does not name it: %v", bad, err)
		}
	}
	for _, bad := range []string{"calc", "mcp://", "mcp://Calc", "mcp://*/echo", "mcp://calc/", "inference://gpt-*", "http://x"} {
		f := File{Roles: []Role{{Name: "r", Services: []string{bad}}}}
		if _, err := Compile(f); err == nil {
			t.Errorf("service %q accepted", bad)
		}
	}
	if _, err := Parse([]byte(`{"roles": [], "bindings": [{"principal": "a", "roles": ["missing"]}]}`)); err == nil {
		t.Error("binding to an unknown role accepted")
	}
	if _, err := Parse([]byte(`{"rolez": []}`)); err == nil {
		t.Error("unknown field accepted")
	}
}

func TestEgressAddresses(t *testing.T) {
	// Literals no policy could ever reach are rejected when loaded, with
	// the reason; private literals load (they may be opted into).
	for _, bad := range []string{"127.0.0.1", "::1", "169.254.169.254", "0.0.0.0", "224.0.0.1", "::ffff:127.0.0.1", "fe80::1"} {
		_, err := Compile(File{Roles: []Role{{Name: "r", Egress: []string{bad}}}})
		if err == nil || !strings.Contains(err.Error(), "never dialled") {
			t.Errorf("egress %q: %v, want a never-dialled error", bad, err)
		}
	}
	for _, bad := range []string{"10.0.0.0", "10.0.0.0/7", "0.0.0.0/0", "::/0", "fc00::/6", "127.0.0.0/8", "169.254.0.0/16", "ff00::/8", "fe80::/10", "::ffff:10.0.0.0/104", "x"} {
		if _, err := Compile(File{Roles: []Role{{Name: "r", EgressPrivate: []string{bad}}}}); err == nil {
			t.Errorf("egress_private %q accepted", bad)
		} else if !strings.Contains(err.Error(), bad) {
			t.Errorf("error for %q does not name it: %v", bad, err)
		}
	}
	p, err := Parse([]byte(`
roles:
  - {name: lan, egress: [db.internal, 10.20.0.5], egress_private: ["10.20.0.0/16", "fd00:1::/32"]}
  - {name: more, egress_private: ["192.168.7.0/24"]}
  - {name: none, egress: [api.github.com]}
bindings:
  - {principal: a, roles: [lan, more]}
  - {principal: b, roles: [none]}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := p.For("a").PrivateNets()
	if len(got) != 3 || got[0].String() != "10.20.0.0/16" || got[2].String() != "192.168.7.0/24" {
		t.Errorf("a's private nets: %v", got)
	}
	if n := p.For("b").PrivateNets(); len(n) != 0 {
		t.Errorf("b's private nets: %v", n)
	}
	if p.For("nobody").PrivateNets() != nil {
		t.Error("an unbound principal has private nets")
	}
}

func TestEmptyPolicyDeniesEverything(t *testing.T) {
	for _, h := range []string{"mesh.sam.alt", "example.com", "127.0.0.1"} {
		if ok, _ := Empty().Decide("anyone", mustClassify(t, h)); ok {
			t.Errorf("empty policy allowed %s", h)
		}
	}
}

func TestWatcherKeepsOldPolicyOnBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(path, []byte(sample), 0o600)
	w, err := NewWatcher(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte("roles: [{name: r, egress: ['*']}]"), 0o600)
	if w.Check() {
		t.Fatal("bad file accepted")
	}
	if !w.Current().For("agent-a").Egress("api.github.com") {
		t.Fatal("old policy not in force after a bad file")
	}
	os.WriteFile(path, []byte("roles: [{name: r, egress: [example.org]}]\nbindings: [{principal: agent-a, roles: [r]}]"), 0o600)
	if !w.Check() {
		t.Fatal("good file rejected")
	}
	if g := w.Current().For("agent-a"); !g.Egress("example.org") || g.Egress("api.github.com") {
		t.Fatal("new policy not in force")
	}
	if acc, rej := w.Counts(); acc != 1 || rej != 1 {
		t.Fatalf("counts = %d, %d", acc, rej)
	}
}

// FuzzClassify: the classifier never panics, and whatever it accepts as a
// name is normalised (lower case, no trailing dot) and classifies the same
// again.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"mesh.sam.alt", "calc.mcp.sam.alt.", "EXAMPLE.com", "127.0.0.1", "[::1]", "a..b", "x.inference.sam.alt", "-a.com", "sam.alt", strings.Repeat("a.", 130)} {
		f.Add(s)
	}
	p, _ := Parse([]byte(sample))
	f.Fuzz(func(t *testing.T, host string) {
		d, err := Classify(host)
		if err != nil {
			return
		}
		if !d.IsIP && (d.Host != strings.ToLower(d.Host) || strings.HasSuffix(d.Host, ".")) {
			t.Fatalf("Classify(%q).Host = %q not normalised", host, d.Host)
		}
		d2, err := Classify(d.Host)
		if err != nil || d2 != d {
			t.Fatalf("Classify(%q) = %+v, but Classify(%q) = %+v, %v", host, d, d.Host, d2, err)
		}
		if d.Kind == KindService && d.Type == "" {
			if ok, _ := p.Decide("agent-b", d); ok {
				t.Fatalf("invalid service name %q allowed", host)
			}
		}
	})
}
