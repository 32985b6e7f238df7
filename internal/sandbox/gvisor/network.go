package gvisor

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// tookNetwork checks that the sandbox runsc just started took the
// addresses of the network namespace at path: runsc moves every address
// but loopback into its netstack and removes it from the host side. One
// still there means the sandbox came up in another namespace (its spec
// names none: a current runsc then makes a new, empty one) with only lo,
// and runsc says nothing about it. path "" is not checked.
func tookNetwork(path string) error {
	if path == "" {
		return nil
	}
	left, err := addrsIn(path)
	if err != nil {
		return fmt.Errorf("cannot check %s: %w", path, err)
	}
	if len(left) > 0 {
		return fmt.Errorf("%v still on the host side of %s (does the OCI spec name that namespace in linux.namespaces?)", left, path)
	}
	return nil
}

// addrsIn lists the non-loopback addresses in the namespace at path. The
// dump is retried when the kernel says it was interrupted by a change
// (NLM_F_DUMP_INTR): a partial list is never acted on.
func addrsIn(path string) ([]netip.Prefix, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var addrs []netlink.Addr
	for try := 0; ; try++ {
		addrs, err = h.AddrList(nil, netlink.FAMILY_ALL)
		if err == nil || !errors.Is(err, netlink.ErrDumpInterrupted) || try == 4 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out, nil
}
