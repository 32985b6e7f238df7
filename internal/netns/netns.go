// Package netns gives each sandbox its own network namespace and a veth pair
// into it, with addresses from a private subnet split into /30 slots. Nothing
// is forwarded or NATed out of a sandbox's namespace: the host side of the
// veth is the only peer it can reach, and the firewall (firewall.go) drops
// anything it starts towards the host. Its only way out will be its boundary.
package netns

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
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

// EnsureUnreachable routes the whole pool nowhere in the host's main table
// (an "unreachable" route, answered at once with EHOSTUNREACH): each live
// sandbox's /30 route through its veth is more specific and wins, and an
// address of a sandbox whose veth is gone (snapshot, detached, being torn
// down) goes nowhere instead of out of the default route. Seen before this
// route existed: a request let through between a checkpoint and the tier
// it records was dialled to the sandbox's address and left the machine.
// It is never removed: it only ever makes the node refuse.
func (p Pool) EnsureUnreachable() error {
	dst := &net.IPNet{IP: p.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(p.Prefix.Bits(), 32)}
	if err := netlink.RouteReplace(&netlink.Route{Dst: dst, Type: unix.RTN_UNREACHABLE}); err != nil {
		return fmt.Errorf("route %s unreachable: %w", p.Prefix, err)
	}
	return nil
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
	addrs, err := addrDump(netlink.Handle{})
	if err != nil {
		return fmt.Errorf("check that sandbox network %s is free: %w", n.Name, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || !n.Host.Masked().Contains(ip) {
			continue
		}
		l, err := netlink.LinkByIndex(a.LinkIndex)
		var gone netlink.LinkNotFoundError
		switch {
		case errors.As(err, &gone):
			// The link went away since the dump, and its address with it.
			continue
		case err != nil:
			return fmt.Errorf("check that sandbox network %s is free: link %d holding %s: %w", n.Name, a.LinkIndex, ip, err)
		}
		if l.Attrs().Name != n.HostIf {
			return fmt.Errorf("address %s of sandbox network %s is already on host link %s: another sandstormd or network uses this subnet; pick another --subnet", ip, n.Name, l.Attrs().Name)
		}
	}
	return nil
}

// Netlink dumps and concurrency. A dump (NLM_F_DUMP, e.g. RTM_GETADDR) is
// answered in several parts, and when the table changes between two of
// them the kernel sets NLM_F_DUMP_INTR on the answer: it may have missed
// or repeated entries (netlink(7); <linux/netlink.h>: "Dump was
// inconsistent due to sequence change"). Every Create and Delete of another sandbox
// changes the host's links and addresses, so under concurrent creates this
// is common (5-9 % of 200 concurrent creates failed with it).
// vishvananda/netlink returns such a dump's partial result together with
// ErrDumpInterrupted. So: no dump where a plain request does the job
// (ensureAddr adds and takes EEXIST as "already there"; links are looked up
// by name or index, single requests rather than dumps: LinkByName falls
// back to a dump only on kernels too old to look a name up), and where a dump
// is needed (checkFree: which link holds an address), it is retried until
// the kernel says it is consistent, and never acted on otherwise: a partial
// dump could miss the very address that makes the subnet taken.
const (
	dumpAttempts = 20
	dumpBackoff  = time.Millisecond      // first wait; doubles each attempt
	dumpMaxWait  = 50 * time.Millisecond // cap of one wait
)

// addrDump returns every IPv4 address in h's namespace from one consistent
// dump, retrying interrupted ones (see above); after dumpAttempts
// interrupted dumps it fails rather than return a partial list.
func addrDump(h netlink.Handle) ([]netlink.Addr, error) {
	wait := dumpBackoff
	for i := 1; ; i++ {
		addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
		if err == nil {
			return addrs, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("list addresses: %w", err)
		}
		if i == dumpAttempts {
			return nil, fmt.Errorf("list addresses: no consistent dump in %d attempts, the address table kept changing (NLM_F_DUMP_INTR): %w", dumpAttempts, err)
		}
		// Jittered, so dumps interrupted by the same change do not all
		// retry at the same moment.
		time.Sleep(wait/2 + rand.N(wait/2+1))
		wait = min(2*wait, dumpMaxWait)
	}
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

// ensureAddr puts p on link unless it is there already. It adds without
// listing first (a dump could come back interrupted, see addrDump): the
// kernel refuses an address already on the link with EEXIST.
func ensureAddr(h netlink.Handle, link netlink.Link, p netip.Prefix) error {
	ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipn}); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// openOrCreate returns a handle on the named namespace, creating it if
// needed. netns.NewNamed switches the calling thread into the new
// namespace, so the thread is locked and switched back before it is freed.
func openOrCreate(name string) (netns.NsHandle, error) {
	if ns, err := netns.GetFromName(name); err == nil {
		return ns, nil
	}
	if err := prepareDir(); err != nil {
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

var (
	dirMu    sync.Mutex
	dirReady bool
)

// prepareDir makes Dir a mount point of its own before the first namespace
// is mounted in it, the way `ip netns add` does the first time it runs (a
// recursive bind of Dir onto itself, made shared). If Dir is still a plain
// directory when `ip netns add` first runs on the machine (an operator,
// `sandstormd doctor`, another test) while sandbox namespaces are mounted
// in it, that recursive bind mounts each of them a second time and hides
// the first: Delete then unmounts only the visible copy, removing the file
// fails with EBUSY, and the hidden mount keeps the namespace alive. A Dir
// that is a mount point already is left as it is, and so is one that has
// namespaces mounted in it but is not a mount point (binding it now would
// hide those the same way).
func prepareDir() error {
	dirMu.Lock()
	defer dirMu.Unlock()
	if dirReady {
		return nil
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.EvalSymlinks(Dir) // /var/run is /run; mountinfo says /run
	if err != nil {
		return err
	}
	mounted, below, err := mountsAt(dir)
	if err != nil && !errors.Is(err, errMountUnknown) {
		return err
	}
	// On a kernel that cannot say (before 5.8), Dir is left as it is.
	if err == nil && !mounted && !below {
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", dir, err)
		}
		if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("make %s shared: %w", dir, err)
		}
	}
	dirReady = true
	return nil
}

var errMountUnknown = errors.New("the kernel does not say whether a path is a mount point")

// mountsAt reports whether dir is the root of a mount, and whether
// anything is mounted below it in the mount that holds it (mounts hidden
// under another one do not count: they are not where dir leads).
func mountsAt(dir string) (mounted, below bool, err error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_MNT_ID, &st); err != nil {
		return false, false, fmt.Errorf("statx %s: %w", dir, err)
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 || st.Mask&unix.STATX_MNT_ID == 0 {
		return false, false, errMountUnknown
	}
	if st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return true, false, nil
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, false, err
	}
	parent := strconv.FormatUint(st.Mnt_id, 10)
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	for _, line := range strings.Split(string(b), "\n") {
		// "36 35 98:0 /mnt1 /mnt2 …": mount ID, parent ID, …, mount point.
		f := strings.Fields(line)
		if len(f) >= 5 && f[1] == parent && strings.HasPrefix(unescape.Replace(f[4]), dir+"/") {
			return false, true, nil
		}
	}
	return false, false, nil
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
	err := netns.DeleteNamed(n.Name)
	if errors.Is(err, unix.EINVAL) {
		// A delete cut short (the daemon killed between DeleteNamed's
		// unmount and its remove) leaves the file with nothing mounted
		// on it, and the unmount then fails with EINVAL ("not mounted",
		// umount(2)): the file is all that is left to remove. Seen in
		// TestCrashRestart/mid_snapshot.
		err = os.Remove(n.Path())
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("delete netns %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}
