package nodeside

import (
	"errors"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/store"
)

// A create's egress rules: malformed is 400; a name in allow_out that
// the policy does not grant the sandbox's principal (its own, its
// template's, else its name) is 403; what the policy grants passes.
func TestCheckEgress(t *testing.T) {
	p, err := policy.Parse([]byte(`
roles:
  - {name: r, egress: ["api.example.com", "*.pypi.org"]}
bindings:
  - {principal: alice, roles: [r]}
  - {principal: tmpl, roles: [r]}
`))
	if err != nil {
		t.Fatal(err)
	}
	l := &Side{Policy: func() *policy.Policy { return p }}
	req := func(name, principal string, allow, deny []string) nodeapi.CreateRequest {
		return nodeapi.CreateRequest{Name: name, Principal: principal, Egress: &api.Egress{AllowOut: allow, DenyOut: deny}}
	}
	all := []string{"0.0.0.0/0"}
	for _, c := range []struct {
		what string
		t    store.Template
		req  nodeapi.CreateRequest
		want error
	}{
		{"granted names, by its name", store.Template{}, req("alice", "", []string{"api.example.com", "*.pypi.org", "files.pypi.org", "192.0.2.1"}, all), nil},
		{"by its template's principal", store.Template{Principal: "tmpl"}, req("x", "", []string{"api.example.com"}, all), nil},
		{"a name not granted", store.Template{}, req("alice", "", []string{"evil.example"}, all), errdefs.ErrForbidden},
		{"a wider wildcard than granted", store.Template{}, req("alice", "", []string{"*.example.com"}, all), errdefs.ErrForbidden},
		{"another principal's grant", store.Template{}, req("bob", "", []string{"api.example.com"}, all), errdefs.ErrForbidden},
		{"a name in deny_out", store.Template{}, req("alice", "", nil, []string{"api.example.com"}), errdefs.ErrBadInput},
		{"no rules", store.Template{}, nodeapi.CreateRequest{Name: "bob"}, nil},
	} {
		err := l.checkEgress(createdPrincipal(c.t, c.req), c.req.Egress)
		if (c.want == nil && err != nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	// No policy: nothing is granted.
	if err := (&Side{}).checkEgress("alice", &api.Egress{AllowOut: []string{"api.example.com"}, DenyOut: all}); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("no policy: %v", err)
	}
}
