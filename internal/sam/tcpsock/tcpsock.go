// Package tcpsock is what the boundary asks of a TCP socket beyond
// net.Conn: where a redirected connection was going (SO_ORIGINAL_DST),
// whether the peer has every byte (SIOCOUTQ), and a close with RST.
package tcpsock

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// ResetClose closes c; a TCP connection with RST (SO_LINGER 0), so the
// sandbox's endpoint goes straight to CLOSED.
func ResetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// WaitSent waits, at most max, until the peer has acknowledged every byte
// written to c (SIOCOUTQ is 0), so that a reset does not throw them away.
func WaitSent(c net.Conn, max time.Duration) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	deadline := time.Now().Add(max)
	pause := 200 * time.Microsecond
	for {
		n, ierr := 0, error(nil)
		if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
			return
		}
		if ierr != nil || n == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(pause)
		if pause < 20*time.Millisecond {
			pause *= 2
		}
	}
}

// soOriginalDst is SO_ORIGINAL_DST from <linux/netfilter_ipv4.h>.
const soOriginalDst = 80

// OriginalDst returns where a redirected connection was addressed before
// nftables redirected it to the transparent listener.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var m *unix.IPv6Mreq
	var gerr error
	// The usual trick: IPv6Mreq is large enough to hold the sockaddr_in
	// the kernel writes.
	if err := rc.Control(func(fd uintptr) { m, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, soOriginalDst) }); err != nil {
		return netip.AddrPort{}, err
	}
	if gerr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", gerr)
	}
	raw := m.Multiaddr
	port := uint16(raw[2])<<8 | uint16(raw[3])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{raw[4], raw[5], raw[6], raw[7]}), port), nil
}

// Redirected reports whether dst, c's original destination, differs from
// the address c was accepted on: a connection made to the transparent
// listener itself was not redirected, and names no destination. An IPv4
// address and its IPv4-mapped IPv6 form are the same here (a dual-stack
// listener's local address is the mapped form).
func Redirected(c net.Conn, dst netip.AddrPort) bool {
	l, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return true
	}
	local := l.AddrPort()
	return dst.Addr().Unmap() != local.Addr().Unmap() || dst.Port() != local.Port()
}
