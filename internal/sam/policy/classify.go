package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Mesh names (the SAM seed): the agent asks for mesh.sam.alt, which is in no
// DNS and has no route; its boundary decides what it means.
const (
	// MeshDomain is the suffix of every mesh name.
	MeshDomain = "sam.alt"
	// MeshHost is the mesh entrypoint: the local sam-node's agent API.
	MeshHost = "mesh." + MeshDomain
)

// Kind is what a destination name is.
type Kind int

const (
	// KindExternal: any name outside the mesh, or an IP literal; passes
	// only if the principal's egress allowlist names it.
	KindExternal Kind = iota
	// KindMesh: mesh.sam.alt, the entrypoint.
	KindMesh
	// KindService: <service>.<type>.sam.alt, one mesh service; also every
	// other name under sam.alt, which no grant matches.
	KindService
)

func (k Kind) String() string {
	switch k {
	case KindMesh:
		return "mesh"
	case KindService:
		return "service"
	default:
		return "external"
	}
}

// Dest is a classified destination.
type Dest struct {
	Kind Kind
	// Host is the normalised name (lower case, no trailing dot) or the IP
	// literal in canonical form.
	Host string
	// IsIP: Host is an IP literal.
	IsIP bool
	// Type ("mcp" or "inference") and Service name a mesh service; Type is
	// "" for a name under sam.alt that is not a valid service name.
	Type, Service string
}

// ErrBadName is returned for a destination that is not a host name or an
// IP literal.
var ErrBadName = errors.New("not a valid destination name")

// Classify says what host is. It accepts one trailing dot (the DNS
// fully-qualified form) and IPv6 literals with or without brackets.
func Classify(host string) (Dest, error) {
	h := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	if ip, err := netip.ParseAddr(h); err == nil {
		if ip.Zone() != "" {
			return Dest{}, fmt.Errorf("%w: %q has a zone", ErrBadName, host)
		}
		return Dest{Kind: KindExternal, Host: ip.Unmap().String(), IsIP: true}, nil
	}
	h = strings.ToLower(h)
	if !validHost(h) {
		return Dest{}, fmt.Errorf("%w: %q", ErrBadName, host)
	}
	switch {
	case h == MeshHost:
		return Dest{Kind: KindMesh, Host: h}, nil
	case h == MeshDomain || strings.HasSuffix(h, "."+MeshDomain):
		d := Dest{Kind: KindService, Host: h}
		labels := strings.Split(strings.TrimSuffix(h, "."+MeshDomain), ".")
		if len(labels) == 2 && (labels[1] == "mcp" || labels[1] == "inference") && ValidLabel(labels[0]) {
			d.Type, d.Service = labels[1], labels[0]
		}
		return d, nil
	default:
		return Dest{Kind: KindExternal, Host: h}, nil
	}
}

// Decide says whether principal may open a flow to d, and if not, why. The
// reason is the same for a service that does not exist and one that is not
// granted, so the boundary cannot be used to probe the mesh.
func (p *Policy) Decide(principal string, d Dest) (bool, string) {
	g := p.For(principal)
	if g == nil {
		return false, "no grants for this principal"
	}
	switch d.Kind {
	case KindMesh:
		return true, ""
	case KindService:
		switch d.Type {
		case "mcp":
			if g.MCPServer(d.Service) {
				return true, ""
			}
		case "inference":
			if g.Model(d.Service) {
				return true, ""
			}
		}
		return false, "destination not granted"
	default:
		if g.Egress(d.Host) {
			return true, ""
		}
		return false, "destination not granted"
	}
}
