package e2b

import (
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/secrets"
)

// networkRule is one of E2B's network.rules: a transform of the requests
// to its domain (the SDK's SandboxNetworkRule; headers only).
type networkRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

// parseRules reads a create's network.rules (domain → rules) as header
// rules for the sandbox's boundary (inject.Binding with Headers): the
// boundary ends TLS for exactly those names, with the sandbox's own CA,
// and sets the headers on each request, so the values never enter the
// sandbox — as E2B's egress proxy does. A rule does not allow its domain
// (E2B: "use allowOut to permit the traffic"): the policy and the
// sandbox's own egress rules still decide. Refused, not ignored: a rule
// for an address (TLS is ended for a name), a workload identity token
// (E2B's iam, not served), and a header that is not the request's to
// carry (framing, Host).
func parseRules(raw json.RawMessage) ([]inject.Binding, error) {
	var rules map[string][]networkRule
	if err := json.Unmarshal(raw, &rules); err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "network.rules: want {domain: [{transform: {headers: {name: value}}}]}: %v", err)
	}
	if len(rules) > maxRuleDomains {
		return nil, errdefs.New(errdefs.ErrBadInput, "network.rules: %d domains; at most %d", len(rules), maxRuleDomains)
	}
	var out []inject.Binding
	for _, domain := range slices.Sorted(maps.Keys(rules)) {
		name := ruleName(domain)
		if _, err := netip.ParsePrefix(name); err == nil || isAddr(name) {
			return nil, errdefs.New(errdefs.ErrNotSupported, "network.rules[%q]: an address; rules here are for names (the boundary ends TLS for a name)", domain)
		}
		hosts, err := secrets.CheckHosts([]string{name})
		if err != nil {
			return nil, errdefs.New(errdefs.ErrBadInput, "network.rules[%q]: %v", domain, err)
		}
		headers := map[string]string{}
		for _, r := range rules[domain] {
			if r.Transform == nil {
				continue
			}
			for k, v := range r.Transform.Headers {
				if err := checkRuleHeader(domain, k, v); err != nil {
					return nil, err
				}
				headers[http.CanonicalHeaderKey(k)] = v
			}
		}
		if len(headers) > 0 {
			out = append(out, inject.Binding{Name: "rule:" + hosts[0], Hosts: hosts, Headers: headers})
		}
	}
	return out, nil
}

// ruleName is the name a rule's key is for: the SDK's getHost(port) is
// host:port when its domain has a port (E2B_DOMAIN=example.test:8443, a
// server of one's own), and a rule is for the name, on every port of it
// (the boundary ends TLS for a name; the SNI has no port).
func ruleName(key string) string {
	host, port, err := net.SplitHostPort(key)
	if err != nil || port == "" || strings.Trim(port, "0123456789") != "" || strings.Contains(host, ":") {
		return key
	}
	return host
}

// maxRuleDomains bounds a sandbox's rules: each domain is a name its CA
// may sign for.
const maxRuleDomains = 64

func isAddr(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// ruleHeadersRefused are the headers a rule may not set: the request's
// framing and routing, which the boundary's HTTP owns.
var ruleHeadersRefused = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true, "Upgrade": true,
	"Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Connection": true, "Expect": true,
}

func checkRuleHeader(domain, k, v string) error {
	switch {
	case !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v):
		return errdefs.New(errdefs.ErrBadInput, "network.rules[%q]: header %q: not a valid header name and value", domain, k)
	case ruleHeadersRefused[http.CanonicalHeaderKey(k)]:
		return errdefs.New(errdefs.ErrBadInput, "network.rules[%q]: header %q is the request's own; a rule may not set it", domain, k)
	case strings.Contains(v, "${e2b.identity."):
		return errdefs.New(errdefs.ErrNotSupported, "network.rules[%q]: header %q holds a workload identity token (iam), which is not served here; store a secret instead (docs/API.md, Secrets)", domain, k)
	}
	return nil
}
