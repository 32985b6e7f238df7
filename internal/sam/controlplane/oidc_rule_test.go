package controlplane

import "testing"

// TestAllowedIdentity: the OIDC allow rule fails closed — no rule allows
// nobody, an unverified address is no identity, a domain rule is that
// domain only (not a suffix of another, not a subdomain).
func TestAllowedIdentity(t *testing.T) {
	rule := OIDCConfig{AllowEmails: []string{"ops@example.com", "@corp.example"}, AllowSubjects: []string{"id-7"}}
	for _, c := range []struct {
		cfg      OIDCConfig
		sub, em  string
		verified bool
		want     bool
	}{
		{OIDCConfig{}, "id-7", "ops@example.com", true, false},
		{rule, "x", "ops@example.com", true, true},
		{rule, "x", "OPS@Example.com", true, true},
		{rule, "x", "ops@example.com", false, false},
		{rule, "x", "anyone@corp.example", true, true},
		{rule, "x", "a@evilcorp.example", true, false},
		{rule, "x", "a@sub.corp.example", true, false},
		{rule, "x", "a@b@corp.example", true, false},
		{rule, "x", "other@example.com", true, false},
		{rule, "id-7", "", false, true},
		{rule, "id-70", "", false, false},
		{OIDCConfig{AllowEmails: []string{"@"}, AllowSubjects: []string{""}}, "", "a@b.c", true, false},
	} {
		if _, got := allowedIdentity(c.cfg, c.sub, c.em, c.verified); got != c.want {
			t.Errorf("%+v sub=%q email=%q verified=%v: %v, want %v", c.cfg, c.sub, c.em, c.verified, got, c.want)
		}
	}
}
