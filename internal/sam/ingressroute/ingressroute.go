// Package ingressroute is a boundary's way to its own node's ingress: a
// sandbox that reaches another sandbox's public URL
// (https://<port>-<id>.<domain>, E2B's getHost) is carried to the
// listener on its node that serves those names, as a client on the
// internet would be served by it. Without it that flow fails closed: the
// name resolves to the node (or to nothing, under a test domain), and a
// boundary never dials an address of its node (dialguard).
//
// The ingress serves such a flow exactly as it serves the internet (a
// key, an access token, or a port opened to public traffic); nothing is
// granted by where the flow comes from. The operator's policy still
// decides whether a sandbox may reach the names at all (name them, as
// "*.<domain>", in its egress), and the sandbox's own rules narrow it.
package ingressroute

import (
	"context"
	"crypto/x509"
	"net"
	"net/netip"
	"slices"

	"sandstorm/api"
)

// Route is where a node's sandbox names are served.
type Route struct {
	// Domain: the names routed are <port>-<id>.<Domain>
	// (api.SandboxHost), no other (not api.<Domain>).
	Domain string
	// Ports are the ports those names are served on (the port in the
	// URL); a flow to one of the names on another port is not routed.
	Ports []uint16
	// Addr is the listener serving them on this node.
	Addr netip.AddrPort
	// Roots verify its certificate when the boundary opens TLS to it
	// itself (a sandbox's network.rules or secrets for the name); nil:
	// the system's.
	Roots *x509.CertPool
}

// Match says whether a flow to host:port is one of the names served on
// the route's ingress. A nil route matches nothing.
func (r *Route) Match(host string, port uint16) bool {
	if r == nil || !slices.Contains(r.Ports, port) {
		return false
	}
	_, _, ok := api.SandboxHost(host, r.Domain)
	return ok
}

// Dial opens a connection to the ingress.
func (r *Route) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", r.Addr.String())
}

// Local is the address to dial for a listener on listen: an unspecified
// host (":8443", "0.0.0.0:8443") is this machine's loopback, a name where
// it resolves.
func Local(listen string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if host == "" {
		host = "0.0.0.0"
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(host, port))
	if err != nil {
		// A name (--listen localhost:8443): where it resolves now.
		ta, rerr := net.ResolveTCPAddr("tcp", net.JoinHostPort(host, port))
		if rerr != nil {
			return netip.AddrPort{}, rerr
		}
		ap = ta.AddrPort()
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if ap.Addr().IsUnspecified() {
		lo := netip.IPv6Loopback()
		if ap.Addr().Is4() {
			lo = netip.MustParseAddr("127.0.0.1")
		}
		ap = netip.AddrPortFrom(lo, ap.Port())
	}
	return ap, nil
}
