package controlplane

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/policy"
)

const policyV1 = `
roles:
  - name: coder
    services: ["inference://llama", "mcp://calc"]
    egress: ["api.github.com"]
bindings:
  - principal: agent-a
    roles: [coder]
`

// A JSON policy is taken as well as YAML.
const policyV2 = `{"roles":[{"name":"coder","services":["inference://*"]}],"bindings":[{"principal":"agent-b","roles":["coder"]}]}`

func TestPolicy(t *testing.T) { eachStore(t, testPolicy) }

// testPolicy: before any is set a member gets version 0 (nothing
// granted); the operator's policy is validated as members parse it — a
// bad one is a 400 that names the fault, and the one in force stays —
// each accepted one is the next version; a member presenting its
// credential gets it, and a 304 while it holds the newest; no
// credential, a made-up one or a revoked member's is refused.
func testPolicy(t *testing.T, p *plane) {
	ctx := context.Background()
	c := p.member()
	cred, err := c.Enrol(ctx, token(t, p, 2, time.Hour), "node-a", key(t))
	if err != nil {
		t.Fatal(err)
	}
	got, changed, err := c.Policy(ctx, cred.Credential, 0)
	if err != nil || !changed || got.Version != 0 || got.Document != "" {
		t.Fatalf("no policy yet: %+v %v %v, want version 0", got, changed, err)
	}
	set, err := p.admin.SetPolicy(ctx, []byte(policyV1))
	if err != nil || set.Version != 1 {
		t.Fatalf("set a good policy: %+v, %v", set, err)
	}
	for _, bad := range []struct{ doc, says string }{
		{"roles: [{name: x, services: [\"http://nope\"]}]", "http://nope"},
		{"roles: [{name: x, egress: [\"*\"]}]", "*"},
		{"bindings: [{principal: a, roles: [ghost]}]", "ghost"},
		{"rolez: []", "rolez"},
		{"{not yaml", "YAML"},
		{"", "empty"},
	} {
		_, err := p.admin.SetPolicy(ctx, []byte(bad.doc))
		if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("policy %q: %v, want a 400 naming %q", bad.doc, err, bad.says)
		}
	}
	if _, err := p.admin.SetPolicy(ctx, []byte(strings.Repeat("#", MaxPolicyBytes+1))); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("a policy over a MiB: %v, want too large", err)
	}
	got, changed, err = c.Policy(ctx, cred.Credential, 0)
	if err != nil || !changed || got.Version != 1 || got.Document != policyV1 {
		t.Fatalf("after refused puts: %+v, %v; want version 1 unchanged", got, err)
	}
	pol, err := policy.Parse([]byte(got.Document))
	if err != nil || !pol.For("agent-a").Model("llama") || pol.For("agent-a").Model("gpt") {
		t.Errorf("the served document: %v", err)
	}
	if got, changed, err = c.Policy(ctx, cred.Credential, 1); err != nil || changed || got.Version != 1 {
		t.Errorf("polling with the newest version: %+v changed=%v %v, want a 304", got, changed, err)
	}
	if set, err = p.admin.SetPolicy(ctx, []byte(policyV2)); err != nil || set.Version != 2 {
		t.Fatalf("set a JSON policy: %+v, %v", set, err)
	}
	if got, changed, err = c.Policy(ctx, cred.Credential, 1); err != nil || !changed || got.Version != 2 {
		t.Errorf("polling with an old version: %+v %v", got, err)
	}
	if got, _, err = p.admin.Policy(ctx, "", 0); err != nil || got.Version != 2 {
		t.Errorf("the operator's get: %+v, %v", got, err)
	}

	for name, cr := range map[string]string{"none": "", "made up": "eyJhbGciOiJFZERTQSJ9.e30.c2ln", "truncated": cred.Credential[:len(cred.Credential)-4]} {
		if _, _, err := c.Policy(ctx, cr, 0); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("a %s credential: %v, want 401", name, err)
		}
	}
	if _, err := p.admin.SetPolicy(ctx, nil); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("an empty PUT: %v", err)
	}
	if _, err := c.SetPolicy(ctx, []byte(policyV1)); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("a PUT without the admin token: %v, want 401", err)
	}
	if err := p.admin.Revoke(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Policy(ctx, cred.Credential, 0); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("a revoked member's get: %v, want 403", err)
	}
	p.add(11 * time.Minute)
	cred2, err := c.Enrol(ctx, token(t, p, 1, time.Hour), "node-b", key(t))
	if err != nil {
		t.Fatal(err)
	}
	p.add(11 * time.Minute)
	if _, _, err := c.Policy(ctx, cred2.Credential, 0); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("an expired credential: %v, want 401", err)
	}
}

// jwtKeyID is the "kid" a credential's header names.
func jwtKeyID(t *testing.T, tok string) string {
	t.Helper()
	h, _, _ := strings.Cut(tok, ".")
	b, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	var hdr struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(b, &hdr); err != nil {
		t.Fatal(err)
	}
	return hdr.Kid
}
