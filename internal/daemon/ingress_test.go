package daemon

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sandstorm/internal/pki"
)

// TestIngressRoute: where a node's boundaries carry the names of its
// sandboxes' URLs: a single daemon's API listener (on loopback when it
// listens on every address), with its CA as the roots; a fleet node's
// TLS ingress; nowhere for a node without one (plain HTTP, or none).
func TestIngressRoute(t *testing.T) {
	dir := t.TempDir()
	o := Options{Master: true, Node: true, DataDir: dir, Listen: ":8443", HostDomain: "sb.test"}
	if _, err := ingressRoute(o, nil); err == nil || !strings.Contains(err.Error(), pki.CAFile) {
		t.Errorf("a single daemon with no CA yet: %v", err)
	}
	if _, err := pki.EnsureCA(filepath.Join(dir, "pki")); err != nil {
		t.Fatal(err)
	}
	r, err := ingressRoute(o, nil)
	if err != nil || r == nil {
		t.Fatalf("a single daemon: %v, %v", r, err)
	}
	if r.Addr.String() != "127.0.0.1:8443" || !slices.Equal(r.Ports, []uint16{443, 8443}) || r.Domain != "sb.test" || r.Roots == nil {
		t.Errorf("a single daemon's route: %+v", r)
	}
	node := Options{Node: true, IngressListen: "10.0.0.5:9443", IngressCert: "c.pem", HostDomain: "sb.test"}
	if r, err := ingressRoute(node, nil); err != nil || r == nil || r.Addr.String() != "10.0.0.5:9443" || r.Roots != nil {
		t.Errorf("a node's TLS ingress: %+v, %v", r, err)
	}
	node.IngressCert = ""
	if r, err := ingressRoute(node, nil); err != nil || r != nil {
		t.Errorf("a node's plain-HTTP ingress: %+v, %v; want no route", r, err)
	}
	if r, err := ingressRoute(Options{Node: true}, nil); err != nil || r != nil {
		t.Errorf("a node with no ingress: %+v, %v; want no route", r, err)
	}
}
