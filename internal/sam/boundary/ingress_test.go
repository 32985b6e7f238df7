package boundary

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"testing"

	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/ingressroute"
	"sandstorm/internal/sam/inject"
)

// TestIngressRoute: a flow to another sandbox's public URL
// (<port>-<id>.wild.test) is carried to the route's ingress, on loopback,
// which the guard refuses to any resolved name, without resolving the
// name; with a header rule for that name the boundary ends the
// sandbox's TLS, verifies the ingress with the route's roots (the
// sandbox's Set has none of them) and the ingress sees the header. What
// the route does not serve is resolved as any name is: api.<domain>, and
// a sandbox name on another port. The sandbox's own rules still apply:
// with every address denied, the flow is refused.
func TestIngressRoute(t *testing.T) {
	fleetCA, port, seen := headerServer(t, "X-Test-Token", "*.wild.test")
	fleetRoots, sandboxRoots := x509.NewCertPool(), x509.NewCertPool()
	fleetRoots.AppendCertsFromPEM(fleetCA)
	caPEM, caKey, _ := inject.NewCA("sb", []string{"8080-abc.wild.test"})
	sandboxRoots.AppendCertsFromPEM(caPEM)
	set, err := inject.NewSet([]inject.Binding{{Name: "rule:8080-abc.wild.test", Hosts: []string{"8080-abc.wild.test"}, Headers: map[string]string{"X-Test-Token": "v"}}}, caPEM, caKey, x509.NewCertPool())
	if err != nil {
		t.Fatal(err)
	}
	route := &ingressroute.Route{Domain: "wild.test", Ports: []uint16{port}, Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Roots: fleetRoots}
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) { c.Secrets, c.Ingress = set, route })
	get := func(host string, roots *x509.CertPool) (string, error) {
		t.Helper()
		c, err := e.socksDialer(t, "unix", nil).DialContext(t.Context(), "tcp", fmt.Sprintf("%s:%d", host, port))
		if err != nil {
			return "", err
		}
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: roots})
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", host, port)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return "", err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return seen(fmt.Sprintf("%s:%d", host, port)), nil
	}
	if got, err := get("8080-abc.wild.test", sandboxRoots); err != nil || got != "v" {
		t.Errorf("the rule's name through the ingress: header %q, %v; want v", got, err)
	}
	if got, err := get("8081-abc.wild.test", fleetRoots); err != nil || got != "" {
		t.Errorf("another sandbox name, spliced to the ingress: header %q, %v; want none", got, err)
	}
	if _, err := get("api.wild.test", fleetRoots); err == nil {
		t.Error("api.wild.test reached the ingress: it is not a sandbox's name")
	}
	if resolved, _ := e.rec.touched(); !slices.Equal(resolved, []string{"api.wild.test"}) {
		t.Errorf("resolved %q; want api.wild.test alone (the sandbox names go to the ingress unresolved)", resolved)
	}
	if !route.Match("8080-abc.wild.test", port) || route.Match("8080-abc.wild.test", port+1) || route.Match("8080-abc.wild.test.evil", port) {
		t.Error("Match: a sandbox name on its port only")
	}
	deny, err := egress.Parse(nil, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	e.b.SetEgress(deny)
	if _, err := get("8081-abc.wild.test", fleetRoots); err == nil {
		t.Error("denyOut 0.0.0.0/0: the flow to the ingress was carried")
	}
}
