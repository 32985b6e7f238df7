// Package dialguard decides which addresses a boundary may dial for an
// external name the policy allowed. Policy decides on names (internal/sam/policy),
// which is right, but a name is only a claim: through the node's resolver,
// /etc/hosts or a hostile DNS server (DNS rebinding) an allowed name can
// point at the node itself, at another sandbox, or at the provider's internal
// network. So the address a name resolves to is checked again, on the socket
// that is about to connect (Guard.Control, a net.Dialer Control hook), so a
// second resolution cannot differ from the one checked.
//
// The decision is split in two, as the rest of the project splits deciders
// from I/O:
//   - Classify and Decide are pure: an address (and what the kernel's
//     routing table said about it) in, a Class out. They are tested
//     exhaustively and fuzzed.
//   - Guard asks the kernel (a route lookup, RTM_GETROUTE, for every dial:
//     not a cache taken at start, so an address added to the node later is
//     seen) and then calls Decide.
//
// What is never dialled, whatever the policy says: loopback, unspecified,
// link-local (169.254/16 — the synthetic pool and cloud metadata addresses
// are in it — and fe80::/10), multicast, broadcast, reserved space, the
// node's sandbox subnets, any address of the node itself and anything routed
// into a sandbox's veth; and, unless opted into, the networks the node is
// attached to (on-link destinations: its LAN, its router, its neighbours); IPv4-mapped, -compatible, -translated and NAT64
// forms of those are judged by the IPv4 address inside. Private ranges
// (RFC 1918, RFC 6598 shared space, fc00::/7) are refused unless the policy
// lets that principal reach a prefix of them (policy: egress_private),
// because on a real node they are the provider's internal network.
package dialguard

import "net/netip"

// Class is why an address may or may not be dialled. The set is closed, so
// it can be a metrics label.
type Class int

const (
	// Public: an ordinary unicast address; may be dialled.
	Public Class = iota
	// PrivateAllowed: private, inside a prefix the policy opted into.
	PrivateAllowed
	// Loopback: 127.0.0.0/8, ::1.
	Loopback
	// Unspecified: 0.0.0.0/8 ("this network": a connect to 0.0.0.0 reaches
	// the local host on Linux) and ::.
	Unspecified
	// LinkLocal: 169.254.0.0/16 (RFC 3927; the boundary's synthetic pool and
	// cloud metadata endpoints such as 169.254.169.254), fe80::/10.
	LinkLocal
	// Multicast: 224.0.0.0/4, ff00::/8, or a multicast route.
	Multicast
	// Broadcast: 255.255.255.255, or a directed broadcast route.
	Broadcast
	// Reserved: 240.0.0.0/4 (RFC 1112), 192.0.0.0/24 (RFC 6890), the
	// discard prefix 100::/64 (RFC 6666), Teredo 2001::/32 (RFC 4380, whose
	// inner address is obfuscated), deprecated site-local fec0::/10, and
	// unroutable destinations (blackhole, unreachable, prohibit routes).
	Reserved
	// Private: RFC 1918, RFC 6598 (100.64.0.0/10), fc00::/7, not opted into.
	Private
	// SandboxNet: inside a sandbox subnet of this node, or routed into a
	// sandbox's veth.
	SandboxNet
	// NodeAddress: an address of this node (a local route).
	NodeAddress
	// LocalNetwork: on a network the node is attached to (a route with no
	// gateway): the node's LAN, its provider's router and neighbours.
	// Allowed only inside a prefix the policy opted into.
	LocalNetwork
	// Invalid: not an address at all, or a route type Decide does not know
	// (fail closed).
	Invalid
	// NumClasses is the number of classes, for arrays indexed by Class.
	NumClasses
)

const nClasses = NumClasses

var classNames = [nClasses]string{"public", "private_allowed", "loopback", "unspecified", "link_local", "multicast", "broadcast", "reserved", "private", "sandbox", "node", "local_network", "invalid"}

func (c Class) String() string {
	if c < 0 || c >= nClasses {
		return "invalid"
	}
	return classNames[c]
}

// Allowed reports whether an address of this class may be dialled.
func (c Class) Allowed() bool { return c == Public || c == PrivateAllowed }

// Classes lists every class, for registering metrics.
func Classes() []Class {
	out := make([]Class, nClasses)
	for i := range out {
		out[i] = Class(i)
	}
	return out
}

var (
	v4Loopback    = netip.MustParsePrefix("127.0.0.0/8")
	v4ThisNet     = netip.MustParsePrefix("0.0.0.0/8")
	v4LinkLocal   = netip.MustParsePrefix("169.254.0.0/16")
	v4Multicast   = netip.MustParsePrefix("224.0.0.0/4")
	v4Reserved    = netip.MustParsePrefix("240.0.0.0/4")
	v4IETF        = netip.MustParsePrefix("192.0.0.0/24")
	v4Broadcast   = netip.MustParseAddr("255.255.255.255")
	v4Private     = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10")}
	v6Unspecified = netip.IPv6Unspecified()
	v6Loopback    = netip.IPv6Loopback()
	v6LinkLocal   = netip.MustParsePrefix("fe80::/10")
	v6SiteLocal   = netip.MustParsePrefix("fec0::/10")
	v6Multicast   = netip.MustParsePrefix("ff00::/8")
	v6ULA         = netip.MustParsePrefix("fc00::/7")
	v6Discard     = netip.MustParsePrefix("100::/64")
	v6Teredo      = netip.MustParsePrefix("2001::/32")
	// Forms that carry an IPv4 address in their low 32 bits: IPv4-compatible
	// (::/96, RFC 4291 §2.5.5.1, deprecated), IPv4-translated
	// (::ffff:0:0/96, RFC 2765) and NAT64 (64:ff9b::/96, RFC 6052; the
	// local-use 64:ff9b:1::/48 of RFC 8215). A NAT64 gateway would carry a
	// flow to the IPv4 address inside, so that address is what is judged.
	v6Compat     = netip.MustParsePrefix("::/96")
	v6Translated = netip.MustParsePrefix("::ffff:0:0:0/96")
	v6NAT64      = netip.MustParsePrefix("64:ff9b::/96")
	v6NAT64Local = netip.MustParsePrefix("64:ff9b:1::/48")
	// 6to4 (2002::/16, RFC 3056) carries its IPv4 relay in bits 16–47.
	v6SixToFour = netip.MustParsePrefix("2002::/16")
)

// Classify says what a is by its address alone (no routing table): the
// static part of the decision. private is the set of private prefixes the
// principal's policy opted into; sandboxNets the node's sandbox subnets.
func Classify(a netip.Addr, private, sandboxNets []netip.Prefix) Class {
	if !a.IsValid() || a.Zone() != "" {
		// A zone only means something for link-local addresses, which are
		// refused anyway; an address with one is not what policy named.
		return Invalid
	}
	if a.Is4In6() {
		a = a.Unmap()
	}
	if a.Is6() {
		if inner, ok := embeddedV4(a); ok {
			c := Classify(inner, private, sandboxNets)
			if c.Allowed() && (v6Compat.Contains(a) || v6Translated.Contains(a)) {
				// Deprecated forms nobody dials on purpose.
				return Reserved
			}
			return c
		}
		return classify6(a, private)
	}
	for _, p := range sandboxNets {
		if p.Contains(a) {
			return SandboxNet
		}
	}
	switch {
	case v4Loopback.Contains(a):
		return Loopback
	case v4ThisNet.Contains(a):
		return Unspecified
	case v4LinkLocal.Contains(a):
		return LinkLocal
	case v4Multicast.Contains(a):
		return Multicast
	case a == v4Broadcast:
		return Broadcast
	case v4Reserved.Contains(a), v4IETF.Contains(a):
		return Reserved
	}
	for _, p := range v4Private {
		if p.Contains(a) {
			return privateClass(a, private)
		}
	}
	return Public
}

func classify6(a netip.Addr, private []netip.Prefix) Class {
	switch {
	case a == v6Unspecified:
		return Unspecified
	case a == v6Loopback:
		return Loopback
	case v6LinkLocal.Contains(a):
		return LinkLocal
	case v6Multicast.Contains(a):
		return Multicast
	case v6SiteLocal.Contains(a), v6Discard.Contains(a), v6Teredo.Contains(a):
		return Reserved
	case v6ULA.Contains(a):
		return privateClass(a, private)
	}
	return Public
}

func privateClass(a netip.Addr, private []netip.Prefix) Class {
	for _, p := range private {
		if p.Contains(a) {
			return PrivateAllowed
		}
	}
	return Private
}

// embeddedV4 returns the IPv4 address an IPv6 address carries, for the
// forms that carry one. :: and ::1 are not IPv4-compatible addresses.
func embeddedV4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case a == v6Unspecified || a == v6Loopback:
		return netip.Addr{}, false
	case v6Compat.Contains(a), v6Translated.Contains(a), v6NAT64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case v6NAT64Local.Contains(a):
		// RFC 6052 §2.2: with a /48 prefix the IPv4 address is split
		// around the reserved octet u (bits 64–71): bytes 6,7 then 9,10.
		return netip.AddrFrom4([4]byte{b[6], b[7], b[9], b[10]}), true
	case v6SixToFour.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// RouteType is what the kernel's routing table says a destination is
// (the rtm_type of RTM_GETROUTE's answer, rtnetlink(7)).
type RouteType int

// The route types Decide distinguishes; every other one is refused.
const (
	RouteUnicast RouteType = iota + 1
	RouteLocal
	RouteBroadcast
	RouteMulticast
	RouteUnroutable // blackhole, unreachable, prohibit, throw, nat
)

// Route is the kernel's answer for one destination.
type Route struct {
	Type RouteType
	// Oif is the name of the interface the route leaves by ("" if none).
	Oif string
	// Gateway: the route goes through a router. A unicast route without
	// one is on-link: the destination is on a network the node is
	// attached to.
	Gateway bool
}

// Decide is the whole verdict for a, given what the kernel said about it.
// sandboxIfPrefix is the name prefix of sandbox veths on the host ("ssv"):
// a route out of one leads into a sandbox, whatever its subnet (another
// sandstormd's --subnet included).
func Decide(a netip.Addr, r Route, private, sandboxNets []netip.Prefix, sandboxIfPrefix string) Class {
	if c := Classify(a, private, sandboxNets); !c.Allowed() {
		return c
	}
	switch r.Type {
	case RouteUnicast:
	case RouteLocal:
		return NodeAddress
	case RouteBroadcast:
		return Broadcast
	case RouteMulticast:
		return Multicast
	case RouteUnroutable:
		return Reserved
	default:
		return Invalid
	}
	if sandboxIfPrefix != "" && len(r.Oif) >= len(sandboxIfPrefix) && r.Oif[:len(sandboxIfPrefix)] == sandboxIfPrefix {
		return SandboxNet
	}
	if !r.Gateway && privateClass(a, private) != PrivateAllowed {
		return LocalNetwork
	}
	return Classify(a, private, sandboxNets)
}

// NeverReachable reports whether a can never be dialled by any policy: a
// literal IP an egress entry names that is in one of these classes is a
// mistake the policy loader can reject. Private addresses are not in it
// (they can be opted into); node and sandbox addresses are only known at
// run time.
func NeverReachable(a netip.Addr) (Class, bool) {
	c := Classify(a, nil, nil)
	if c.Allowed() || c == Private {
		return c, false
	}
	return c, true
}
