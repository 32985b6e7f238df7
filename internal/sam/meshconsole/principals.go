package meshconsole

import (
	"fmt"
	"slices"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/sam/policy"
)

// Principals is what each principal bound in doc (a policy document, in
// internal/sam/policy's format) may use: its roles' services, egress and
// private egress. The document is compiled by internal/sam/policy first, so
// only a policy members would enforce is shown, and the principals are
// exactly policy.Policy.Principals(); the grants are read from the
// document's roles since a compiled policy keeps no roles.
func Principals(doc string) ([]api.MeshConsolePrincipal, error) {
	out := []api.MeshConsolePrincipal{}
	if strings.TrimSpace(doc) == "" {
		return out, nil // none set: nothing granted
	}
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		return out, err
	}
	var f policy.File
	if err := policy.DecodeStrict([]byte(doc), &f, "policy"); err != nil {
		return out, err
	}
	roles := map[string]policy.Role{}
	for _, r := range f.Roles {
		roles[r.Name] = r
	}
	bound := map[string][]string{}
	for _, b := range f.Bindings {
		bound[b.Principal] = append(bound[b.Principal], b.Roles...)
	}
	add := func(to []string, xs []string) []string {
		for _, x := range xs {
			if !slices.Contains(to, x) {
				to = append(to, x)
			}
		}
		return to
	}
	for _, name := range p.Principals() {
		pr := api.MeshConsolePrincipal{Name: name, Roles: []string{}, Services: []string{}, Egress: []string{}}
		for _, rn := range bound[name] {
			r, ok := roles[rn]
			if !ok {
				return out, fmt.Errorf("principal %s: role %q not defined", name, rn)
			}
			pr.Roles = add(pr.Roles, []string{rn})
			pr.Services = add(pr.Services, r.Services)
			pr.Egress = add(pr.Egress, r.Egress)
			pr.EgressPrivate = add(pr.EgressPrivate, r.EgressPrivate)
		}
		out = append(out, pr)
	}
	return out, nil
}
