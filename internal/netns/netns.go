// Package netns gives each sandbox its own network namespace and a veth pair
// into it, with addresses from a private subnet split into /30 slots. Nothing
// is forwarded or NATed out of a sandbox's namespace: the host side of the
// veth is the only peer it can reach, and the firewall (firewall.go) drops
// anything it starts towards the host. Its only way out will be its boundary.
package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Dir is where named namespaces are bind-mounted; the same place `ip netns`
// uses, so `ip netns ls` shows sandboxes to a person debugging the node.
const Dir = "/var/run/netns"

// SandboxIf is the name of the veth end inside every sandbox namespace.
const SandboxIf = "eth0"

// Pool hands out /30 slots of a subnet: slot i owns addresses base+4i …
// base+4i+3; the host end of the veth gets base+4i+1 and the sandbox
// base+4i+2. A /30 per sandbox keeps sandboxes off each other's links.
type Pool struct {
	Prefix netip.Prefix
}

// ParsePool parses a subnet such as "10.213.0.0/16" (IPv4, /8 to /28).
func ParsePool(s string) (Pool, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return Pool{}, fmt.Errorf("sandbox subnet %q: %w", s, err)
	}
	if !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 28 {
		return Pool{}, fmt.Errorf("sandbox subnet %q: want an IPv4 prefix from /8 to /28", s)
	}
	return Pool{Prefix: p.Masked()}, nil
}

// Size is the number of slots.
func (p Pool) Size() int { return 1 << (32 - p.Prefix.Bits() - 2) }

// Addrs returns the host and sandbox addresses of slot i, each as a /30.
func (p Pool) Addrs(slot int) (host, sandbox netip.Prefix, err error) {
	if slot < 0 || slot >= p.Size() {
		return host, sandbox, fmt.Errorf("slot %d outside %s (%d slots)", slot, p.Prefix, p.Size())
	}
	b := p.Prefix.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(slot) * 4
	at := func(off uint32) netip.Prefix {
		x := v + off
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}), 30)
	}
	return at(1), at(2), nil
}

// Net describes one sandbox's network.
type Net struct {
	// Name of the namespace (file under Dir).
	Name string
	// HostIf is the host end of the veth (≤ 15 bytes, a Linux limit).
	HostIf  string
	Host    netip.Prefix
	Sandbox netip.Prefix
}

// Path is the namespace's bind-mount path.
func (n Net) Path() string { return filepath.Join(Dir, n.Name) }

// Exists reports whether the namespace's bind mount is there.
func (n Net) Exists() bool {
	_, err := os.Stat(n.Path())
	return err == nil
}

// Create makes the namespace and the veth pair and addresses both ends. It
// is idempotent: parts already there are kept, missing parts are added, so
// a restart after a crash half-way through finishes the job.
func Create(n Net) error {
	if len(n.HostIf) > 15 {
		return fmt.Errorf("interface name %q longer than 15 bytes", n.HostIf)
	}
	if err := checkFree(n); err != nil {
		return err
	}
	ns, err := openOrCreate(n.Name)
	if err != nil {
		return err
	}
	defer ns.Close()

	host, err := netlink.LinkByName(n.HostIf)
	if err != nil {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: n.HostIf},
			PeerName:      SandboxIf,
			PeerNamespace: netlink.NsFd(int(ns)),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", n.HostIf, err)
		}
		if host, err = netlink.LinkByName(n.HostIf); err != nil {
			return err
		}
	}
	if err := ensureAddr(netlink.Handle{}, host, n.Host); err != nil {
		return fmt.Errorf("address %s on %s: %w", n.Host, n.HostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	return ensureInside(ns, n.Sandbox, n.Host)
}

// checkFree fails when an address of n's /30 is already on another host
// link: two sandboxes (or a sandbox and some other network, or a second
// sandstormd with the same --subnet) would share a route, and traffic
// meant for one would reach the other.
func checkFree(n Net) error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || !n.Host.Masked().Contains(ip) {
			continue
		}
		if l, err := netlink.LinkByIndex(a.LinkIndex); err == nil && l.Attrs().Name != n.HostIf {
			return fmt.Errorf("address %s of sandbox network %s is already on host link %s: another sandstormd or network uses this subnet; pick another --subnet", ip, n.Name, l.Attrs().Name)
		}
	}
	return nil
}

// EnsureSandboxAddr puts the sandbox address back on eth0 inside the
// namespace. runsc moves the address into its own netstack when it starts a
// container (and does not put it back), so this must run before every start
// and restore.
func EnsureSandboxAddr(n Net) error {
	ns, err := netns.GetFromName(n.Name)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.Name, err)
	}
	defer ns.Close()
	return ensureInside(ns, n.Sandbox, n.Host)
}

// ensureInside addresses eth0 and routes everything through the host end of
// the veth: the only way out is the sandbox's boundary there (flow 3), and
// the firewall drops whatever the boundary does not take.
func ensureInside(ns netns.NsHandle, addr, host netip.Prefix) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		_ = h.LinkSetUp(lo)
	}
	eth, err := h.LinkByName(SandboxIf)
	if err != nil {
		return fmt.Errorf("%s in netns: %w", SandboxIf, err)
	}
	if err := ensureAddr(*h, eth, addr); err != nil {
		return err
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	// Replace is idempotent: a restart re-running this changes nothing.
	return h.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: host.Addr().AsSlice()})
}

func ensureAddr(h netlink.Handle, link netlink.Link, p netip.Prefix) error {
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if a.IPNet != nil && a.IPNet.IP.Equal(p.Addr().AsSlice()) {
			return nil
		}
	}
	ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
	return h.AddrAdd(link, &netlink.Addr{IPNet: ipn})
}

// openOrCreate returns a handle on the named namespace, creating it if
// needed. netns.NewNamed switches the calling thread into the new
// namespace, so the thread is locked and switched back before it is freed.
func openOrCreate(name string) (netns.NsHandle, error) {
	if ns, err := netns.GetFromName(name); err == nil {
		return ns, nil
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return 0, err
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return 0, err
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// The thread is stuck in the wrong namespace: keep it locked so the
		// runtime discards it when this goroutine exits.
		if err == nil {
			ns.Close()
		}
		return 0, fmt.Errorf("restore netns after creating %s: %w", name, serr)
	}
	runtime.UnlockOSThread()
	if err != nil {
		return 0, fmt.Errorf("create netns %s: %w", name, err)
	}
	return ns, nil
}

// Delete removes the veth (both ends go together) and the namespace. Parts
// already gone are not an error.
func Delete(n Net) error {
	var errs []error
	if l, err := netlink.LinkByName(n.HostIf); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", n.HostIf, err))
		}
	}
	if err := netns.DeleteNamed(n.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("delete netns %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}
