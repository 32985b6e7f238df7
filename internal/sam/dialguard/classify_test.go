package dialguard

import (
	"net/netip"
	"testing"
)

var (
	testSandboxNets = []netip.Prefix{netip.MustParsePrefix("10.213.0.0/16")}
	optIn           = []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd00:1::/32")}
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		addr    string
		want    Class
		private []netip.Prefix
	}{
		{"8.8.8.8", Public, nil},
		{"198.51.100.10", Public, nil}, // documentation ranges are not anyone's internal network
		{"2606:4700::1111", Public, nil},
		{"127.0.0.1", Loopback, nil},
		{"127.255.1.2", Loopback, nil},
		{"::1", Loopback, nil},
		{"::ffff:127.0.0.1", Loopback, nil},
		{"0.0.0.0", Unspecified, nil},
		{"0.1.2.3", Unspecified, nil},
		{"::", Unspecified, nil},
		{"169.254.169.254", LinkLocal, nil}, // cloud metadata
		{"169.254.64.7", LinkLocal, nil},    // the boundary's synthetic pool
		{"fe80::1", LinkLocal, nil},
		{"::ffff:169.254.169.254", LinkLocal, nil},
		{"224.0.0.1", Multicast, nil},
		{"239.255.255.250", Multicast, nil},
		{"ff02::1", Multicast, nil},
		{"255.255.255.255", Broadcast, nil},
		{"240.0.0.1", Reserved, nil},
		{"192.0.0.8", Reserved, nil},
		{"100::1", Reserved, nil},
		{"fec0::1", Reserved, nil},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", Reserved, nil}, // Teredo
		{"10.1.2.3", Private, nil},
		{"172.16.0.1", Private, nil},
		{"172.31.255.255", Private, nil},
		{"172.32.0.1", Public, nil},
		{"192.168.1.1", Private, nil},
		{"100.100.100.200", Private, nil}, // RFC 6598 shared space (a cloud metadata address)
		{"fc00::1", Private, nil},
		{"fd12:3456::1", Private, nil},
		{"::ffff:10.1.2.3", Private, nil},
		{"10.20.1.1", PrivateAllowed, optIn},
		{"10.21.1.1", Private, optIn},
		{"fd00:1::5", PrivateAllowed, optIn},
		{"10.213.0.1", SandboxNet, nil},
		{"10.213.7.6", SandboxNet, optIn},
		{"::ffff:10.213.0.1", SandboxNet, nil},
		// IPv6 forms carrying an IPv4 address are judged by that address.
		{"64:ff9b::7f00:1", Loopback, nil},
		{"64:ff9b::a9fe:a9fe", LinkLocal, nil},
		{"64:ff9b::a00:1", Private, nil},
		{"64:ff9b::808:808", Public, nil},
		{"64:ff9b:1:7f00:0:100::", Loopback, nil}, // RFC 8215 /48: 127.0.0.1 split around octet u
		{"2002:7f00:1::1", Loopback, nil},         // 6to4 relay 127.0.0.1
		{"2002:808:808::1", Public, nil},
		{"::127.0.0.1", Loopback, nil},      // IPv4-compatible
		{"::8.8.8.8", Reserved, nil},        // IPv4-compatible, deprecated
		{"::ffff:0:8.8.8.8", Reserved, nil}, // IPv4-translated
		{"::ffff:0:127.0.0.1", Loopback, nil},
		{"fe80::1%eth0", Invalid, nil},
	} {
		a, err := netip.ParseAddr(c.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := Classify(a, c.private, testSandboxNets); got != c.want {
			t.Errorf("Classify(%s) = %s, want %s", c.addr, got, c.want)
		}
	}
	if Classify(netip.Addr{}, nil, nil) != Invalid {
		t.Error("the zero Addr is not Invalid")
	}
}

func TestDecideRoutes(t *testing.T) {
	pub := netip.MustParseAddr("198.51.100.10")
	for _, c := range []struct {
		r    Route
		want Class
	}{
		{Route{Type: RouteUnicast, Oif: "eth0", Gateway: true}, Public},
		{Route{Type: RouteUnicast, Oif: "eth0"}, LocalNetwork}, // on-link: the node's own LAN
		{Route{Type: RouteLocal, Oif: "lo"}, NodeAddress},
		{Route{Type: RouteBroadcast, Oif: "eth0"}, Broadcast},
		{Route{Type: RouteMulticast}, Multicast},
		{Route{Type: RouteUnroutable}, Reserved},
		{Route{Type: RouteUnicast, Oif: "ssv0123abcd", Gateway: true}, SandboxNet}, // another daemon's subnet, routed into a sandbox
		{Route{}, Invalid}, // a route type we do not know: fail closed
	} {
		if got := Decide(pub, c.r, nil, testSandboxNets, "ssv"); got != c.want {
			t.Errorf("Decide(%s, %+v) = %s, want %s", pub, c.r, got, c.want)
		}
	}
	// A static refusal wins over whatever the route says.
	if got := Decide(netip.MustParseAddr("127.0.0.1"), Route{Type: RouteUnicast, Oif: "eth0"}, nil, nil, "ssv"); got != Loopback {
		t.Errorf("loopback with a unicast route: %s", got)
	}
	// Opted-in private space routed normally is allowed; routed into a
	// sandbox it is not.
	priv := netip.MustParseAddr("10.20.0.9")
	if got := Decide(priv, Route{Type: RouteUnicast, Oif: "eth1"}, optIn, testSandboxNets, "ssv"); got != PrivateAllowed {
		t.Errorf("opted-in private, on-link: %s", got)
	}
	if got := Decide(pub, Route{Type: RouteUnicast, Oif: "eth1"}, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, testSandboxNets, "ssv"); got != Public {
		t.Errorf("opted-in on-link public network: %s", got)
	}
	if got := Decide(priv, Route{Type: RouteUnicast, Oif: "ssvdeadbeef"}, optIn, testSandboxNets, "ssv"); got != SandboxNet {
		t.Errorf("opted-in private into a sandbox veth: %s", got)
	}
}

func TestNeverReachable(t *testing.T) {
	for _, s := range []string{"127.0.0.1", "169.254.169.254", "::1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::ffff:127.0.0.1"} {
		if _, never := NeverReachable(netip.MustParseAddr(s)); !never {
			t.Errorf("%s: not reported as never reachable", s)
		}
	}
	for _, s := range []string{"10.0.0.1", "8.8.8.8", "fd00::1", "198.51.100.1"} {
		if c, never := NeverReachable(netip.MustParseAddr(s)); never {
			t.Errorf("%s: reported never reachable (%s)", s, c)
		}
	}
}

func TestClassNames(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Classes() {
		n := c.String()
		if n == "" || seen[n] {
			t.Errorf("class %d: name %q empty or repeated", c, n)
		}
		seen[n] = true
		if describe[c] == "" {
			t.Errorf("class %s has no description", n)
		}
	}
	if Class(-1).String() != "invalid" || Class(99).String() != "invalid" {
		t.Error("out-of-range classes must be invalid")
	}
}

// FuzzClassify checks the classifier against the standard library's own
// predicates and against itself across the IPv6 forms of an IPv4 address:
// nothing the stdlib calls loopback, link-local, multicast, unspecified or
// private may ever be dialled without an opt-in, whatever form it comes in.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::1", "169.254.169.254", "10.0.0.1", "8.8.8.8", "fe80::1", "64:ff9b::7f00:1", "2002:7f00:1::1", "::ffff:0:7f00:1", "ff02::1"} {
		a := netip.MustParseAddr(s).As16()
		f.Add(a[:], uint8(0))
	}
	f.Fuzz(func(t *testing.T, raw []byte, rt uint8) {
		if len(raw) != 4 && len(raw) != 16 {
			return
		}
		a, _ := netip.AddrFromSlice(raw)
		c := Classify(a, nil, testSandboxNets)
		u := a.Unmap()
		if (u.IsLoopback() || u.IsLinkLocalUnicast() || u.IsLinkLocalMulticast() || u.IsMulticast() ||
			u.IsUnspecified() || u.IsInterfaceLocalMulticast() || u.IsPrivate()) && c.Allowed() {
			t.Fatalf("%s (%s) allowed, but the stdlib says it is special", a, c)
		}
		if c == PrivateAllowed {
			t.Fatalf("%s is PrivateAllowed with no opt-in", a)
		}
		if u.Is4() {
			b := u.As4()
			for _, form := range []netip.Addr{
				netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff, 12: b[0], 13: b[1], 14: b[2], 15: b[3]}),                 // mapped
				netip.AddrFrom16([16]byte{0: 0x00, 1: 0x64, 2: 0xff, 3: 0x9b, 12: b[0], 13: b[1], 14: b[2], 15: b[3]}), // NAT64
				netip.AddrFrom16([16]byte{0: 0x20, 1: 0x02, 2: b[0], 3: b[1], 4: b[2], 5: b[3], 15: 1}),                // 6to4
			} {
				if fc := Classify(form, nil, testSandboxNets); !c.Allowed() && fc.Allowed() {
					t.Fatalf("%s is %s, but its form %s is %s", u, c, form, fc)
				}
			}
		}
		// A route the kernel calls local, broadcast, multicast or
		// unroutable is never allowed, whatever the address.
		r := Route{Type: RouteType(rt % 7), Oif: "eth0", Gateway: rt&0x80 != 0}
		d := Decide(a, r, nil, testSandboxNets, "ssv")
		if d.Allowed() && (r.Type != RouteUnicast || !r.Gateway) {
			t.Fatalf("%s with route %+v allowed as %s", a, r, d)
		}
		if d.Allowed() && !c.Allowed() {
			t.Fatalf("%s: Decide allowed what Classify refused (%s)", a, c)
		}
	})
}
