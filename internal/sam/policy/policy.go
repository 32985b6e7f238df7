// Package policy decides what a principal may reach: which mesh services
// (models, MCP servers and tools) and which external names. Its decisions
// are pure — names in, verdict out, no I/O (policy.go, classify.go) — so
// the boundary can decide on a name before anything is dialled (the SAM
// seed: "a denied flow is decided from the name and never dialled"). Two
// loops keep a policy current around them: a file watched and reloaded
// (watch.go) and a policy followed from another process (follow.go).
//
// A policy file (YAML or JSON) holds roles and bindings:
//
//	roles:
//	  - name: coder
//	    services: ["inference://*", "mcp://calc", "mcp://everything/echo"]
//	    egress: ["api.github.com", "*.pypi.org"]
//	    egress_private: ["10.20.0.0/16"]
//	bindings:
//	  - principal: agent-a
//	    roles: [coder]
//
// A service grant is "inference://<model>" (or "inference://*") or
// "mcp://<server>" (every tool of it), "mcp://<server>/<tool>" (one tool) or
// "mcp://*". An egress entry is an exact host name, a single leading "*."
// label (any name below that domain, not the domain itself), or an exact IPv4
// or IPv6 literal. Anything ambiguous is rejected when the file is loaded:
// "*", inner wildcards ("api.*.com"), trailing dots, ports, schemes, CIDRs.
// A principal with no binding, or no policy at all, may reach nothing.
//
// An allowed name is still only dialled at a public address: the boundary
// checks what it resolves to (internal/sam/dialguard) and never dials loopback,
// link-local, the node or a sandbox. Private space (RFC 1918, RFC 6598,
// fc00::/7) and the networks the node is attached to are refused too,
// unless a role lists the prefixes its names may resolve into under
// egress_private (CIDRs of at least /8, or /7 for IPv6). Egress literals and
// egress_private prefixes that no policy could ever reach (loopback,
// link-local, multicast…) are rejected when the file is loaded.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"sandstorm/internal/sam/dialguard"
)

// File is the on-disk shape of a policy.
type File struct {
	Roles    []Role    `json:"roles"`
	Bindings []Binding `json:"bindings"`
}

// Role is a named set of grants.
type Role struct {
	Name     string   `json:"name"`
	Services []string `json:"services,omitempty"`
	Egress   []string `json:"egress,omitempty"`
	// EgressPrivate lists the private (or on-link) prefixes this role's
	// allowed names may resolve to; without it they are refused.
	EgressPrivate []string `json:"egress_private,omitempty"`
}

// Binding gives a principal roles.
type Binding struct {
	Principal string   `json:"principal"`
	Roles     []string `json:"roles"`
}

// Policy is a parsed, validated policy. It is immutable and safe for
// concurrent use.
type Policy struct {
	grants map[string]*Grants
}

// Grants is what one principal may reach.
type Grants struct {
	models     map[string]bool // model names; "*" for all
	mcpServers map[string]bool // whole servers; "*" for all
	mcpTools   map[string]bool // "server/tool"
	exact      map[string]bool // host names and IP literals
	suffixes   []string        // ".example.org" for "*.example.org"
	private    []netip.Prefix  // egress_private
}

// Empty is the policy that grants nothing; the boundary uses it when no
// policy file is configured (fail closed).
func Empty() *Policy { return &Policy{grants: map[string]*Grants{}} }

// Load reads and parses a policy file.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	return p, nil
}

// Parse parses a policy from YAML or JSON, rejecting unknown fields and
// every ambiguous entry with an error that names it.
func Parse(data []byte) (*Policy, error) {
	var f File
	if err := DecodeStrict(data, &f, "policy"); err != nil {
		return nil, err
	}
	return Compile(f)
}

// DecodeStrict decodes YAML or JSON into v, an unknown field an error so
// that a misspelt key is not silently ignored; what names the document in
// the error. Policy files and sam-node's config are read alike.
func DecodeStrict(data []byte, v any, what string) error {
	// YAML is a superset of JSON; convert, then decode strictly.
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("not YAML or JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed %s: %w", what, err)
	}
	return nil
}

// Compile validates f and builds the policy.
func Compile(f File) (*Policy, error) {
	roles := map[string]*Grants{}
	var errs []error
	for _, r := range f.Roles {
		if r.Name == "" {
			errs = append(errs, errors.New("a role has no name"))
			continue
		}
		if roles[r.Name] != nil {
			errs = append(errs, fmt.Errorf("role %q defined twice", r.Name))
			continue
		}
		g := newGrants()
		for _, s := range r.Services {
			if err := g.addService(s); err != nil {
				errs = append(errs, fmt.Errorf("role %q: %w", r.Name, err))
			}
		}
		for _, e := range r.Egress {
			if err := g.addEgress(e); err != nil {
				errs = append(errs, fmt.Errorf("role %q: %w", r.Name, err))
			}
		}
		for _, e := range r.EgressPrivate {
			if err := g.addPrivate(e); err != nil {
				errs = append(errs, fmt.Errorf("role %q: %w", r.Name, err))
			}
		}
		roles[r.Name] = g
	}
	p := &Policy{grants: map[string]*Grants{}}
	for _, b := range f.Bindings {
		if b.Principal == "" {
			errs = append(errs, errors.New("a binding has no principal"))
			continue
		}
		g := p.grants[b.Principal]
		if g == nil {
			g = newGrants()
			p.grants[b.Principal] = g
		}
		for _, rn := range b.Roles {
			r := roles[rn]
			if r == nil {
				errs = append(errs, fmt.Errorf("binding for %q names unknown role %q", b.Principal, rn))
				continue
			}
			g.merge(r)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func newGrants() *Grants {
	return &Grants{models: map[string]bool{}, mcpServers: map[string]bool{}, mcpTools: map[string]bool{}, exact: map[string]bool{}}
}

func (g *Grants) merge(o *Grants) {
	for k := range o.models {
		g.models[k] = true
	}
	for k := range o.mcpServers {
		g.mcpServers[k] = true
	}
	for k := range o.mcpTools {
		g.mcpTools[k] = true
	}
	for k := range o.exact {
		g.exact[k] = true
	}
	g.suffixes = append(g.suffixes, o.suffixes...)
	g.private = append(g.private, o.private...)
}

func (g *Grants) addService(s string) error {
	kind, rest, ok := strings.Cut(s, "://")
	if !ok || rest == "" {
		return fmt.Errorf("service %q: want inference://<model>, mcp://<server> or mcp://<server>/<tool>", s)
	}
	switch kind {
	case "inference":
		// Model names may contain slashes ("google/gemma-2-2b-it").
		if strings.Contains(rest, "*") && rest != "*" {
			return fmt.Errorf("service %q: the only wildcard is inference://*", s)
		}
		g.models[rest] = true
	case "mcp":
		server, tool, hasTool := strings.Cut(rest, "/")
		if !ValidLabel(server) && server != "*" {
			return fmt.Errorf("service %q: server name must be a DNS label (a-z, 0-9, '-')", s)
		}
		switch {
		case !hasTool:
			g.mcpServers[server] = true
		case server == "*" || tool == "" || strings.ContainsAny(tool, "*/"):
			return fmt.Errorf("service %q: a tool grant names one server and one tool", s)
		default:
			g.mcpTools[server+"/"+tool] = true
		}
	default:
		return fmt.Errorf("service %q: unknown kind %q (want inference or mcp)", s, kind)
	}
	return nil
}

func (g *Grants) addEgress(e string) error {
	if ip, err := netip.ParseAddr(e); err == nil {
		if c, never := dialguard.NeverReachable(ip); never {
			return fmt.Errorf("egress %q: a %s address is never dialled for a sandbox", e, c)
		}
		g.exact[ip.Unmap().String()] = true
		return nil
	}
	if e == "" || e == "*" || strings.HasSuffix(e, ".") || strings.ContainsAny(e, ":/ ") {
		return fmt.Errorf("egress %q: want an exact host name, *.domain, or an IP literal (no trailing dot, port, scheme or CIDR)", e)
	}
	name := strings.ToLower(e)
	wild := strings.HasPrefix(name, "*.")
	if wild {
		name = name[2:]
	}
	if strings.Contains(name, "*") {
		return fmt.Errorf("egress %q: a wildcard may only be the whole first label (*.example.org)", e)
	}
	if !validHost(name) {
		return fmt.Errorf("egress %q: not a valid host name", e)
	}
	if wild && !strings.Contains(name, ".") {
		return fmt.Errorf("egress %q: a wildcard over a top-level domain is too broad", e)
	}
	if strings.HasSuffix(name, "."+MeshDomain) || name == MeshDomain {
		return fmt.Errorf("egress %q: mesh names are granted as services, not egress", e)
	}
	if wild {
		g.suffixes = append(g.suffixes, "."+name)
	} else {
		g.exact[name] = true
	}
	return nil
}

// addPrivate opts a role into a private (or on-link) prefix. A prefix
// shorter than /8 (/7 for IPv6) would be the wildcard "*" in disguise.
func (g *Grants) addPrivate(e string) error {
	p, err := netip.ParsePrefix(e)
	if err != nil {
		return fmt.Errorf("egress_private %q: want a CIDR such as 10.20.0.0/16", e)
	}
	if p.Addr().Zone() != "" || p.Addr().Is4In6() {
		return fmt.Errorf("egress_private %q: write IPv4 prefixes as IPv4", e)
	}
	if (p.Addr().Is4() && p.Bits() < 8) || (p.Addr().Is6() && p.Bits() < 7) {
		return fmt.Errorf("egress_private %q: too broad (at least /8, or /7 for IPv6)", e)
	}
	p = p.Masked()
	if c, never := dialguard.NeverReachable(p.Addr()); never {
		return fmt.Errorf("egress_private %q: %s addresses are never dialled for a sandbox", e, c)
	}
	g.private = append(g.private, p)
	return nil
}

// PrivateNets returns the private (or on-link) prefixes g's allowed names
// may resolve to.
func (g *Grants) PrivateNets() []netip.Prefix {
	if g == nil {
		return nil
	}
	return g.private
}

// For returns the grants of principal; nil (reach nothing) if it has no
// binding.
func (p *Policy) For(principal string) *Grants {
	if p == nil {
		return nil
	}
	return p.grants[principal]
}

// Principals returns the bound principals, sorted.
func (p *Policy) Principals() []string {
	out := make([]string, 0, len(p.grants))
	for k := range p.grants {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Model reports whether g may use model.
func (g *Grants) Model(model string) bool {
	return g != nil && (g.models["*"] || g.models[model])
}

// MCPServer reports whether g may reach MCP server at all (a whole-server
// or one-tool grant).
func (g *Grants) MCPServer(server string) bool {
	if g == nil {
		return false
	}
	if g.mcpServers["*"] || g.mcpServers[server] {
		return true
	}
	prefix := server + "/"
	for k := range g.mcpTools {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// MCPTool reports whether g may call tool on server.
func (g *Grants) MCPTool(server, tool string) bool {
	return g != nil && (g.mcpServers["*"] || g.mcpServers[server] || g.mcpTools[server+"/"+tool])
}

// Egress reports whether g may reach the external host (a name or an IP
// literal, as the agent gave it).
func (g *Grants) Egress(host string) bool {
	if g == nil {
		return false
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return g.exact[ip.String()]
	}
	host = strings.ToLower(host)
	if g.exact[host] {
		return true
	}
	for _, s := range g.suffixes {
		if strings.HasSuffix(host, s) && len(host) > len(s) {
			return true
		}
	}
	return false
}

// ValidLabel reports whether s is a DNS label as the mesh names services
// with one (an MCP server's name): a-z, 0-9 and '-', not at either end,
// at most 63.
func ValidLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func validHost(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !ValidLabel(l) && !(len(l) > 0 && ValidLabel(strings.ReplaceAll(l, "_", "a"))) {
			return false
		}
	}
	return true
}
