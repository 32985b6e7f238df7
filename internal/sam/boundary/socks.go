package boundary

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"

	"sandstorm/internal/sam/handshake"
)

// SOCKS5 (RFC 1928) and its username/password authentication (RFC 1929).
const (
	socksVersion = 0x05

	socksMethodNoAuth       = 0x00
	socksMethodUserPass     = 0x02
	socksMethodNoAcceptable = 0xFF
	socksUserPassVersion    = 0x01

	socksCmdConnect = 0x01

	socksAtypIPv4   = 0x01
	socksAtypDomain = 0x03
	socksAtypIPv6   = 0x04

	socksSucceeded          = 0x00
	socksGeneralFailure     = 0x01
	socksNotAllowed         = 0x02
	socksNetworkUnreachable = 0x03
	socksHostUnreachable    = 0x04
	socksConnRefused        = 0x05
	socksCmdNotSupported    = 0x07
	socksAtypNotSupported   = 0x08
)

// socksRequest is a parsed CONNECT request.
type socksRequest struct {
	host string // a name as given, or an IP literal
	port uint16
}

func (r socksRequest) String() string { return net.JoinHostPort(r.host, strconv.Itoa(int(r.port))) }

var (
	errSOCKSVersion = errors.New("socks: not version 5")
	errSOCKSMethod  = errors.New("socks: no acceptable authentication method")
	errSOCKSAuth    = errors.New("socks: authentication failed")
)

// socksHandshake reads a SOCKS5 greeting, the optional RFC 1929
// authentication and the request from r, writing the method selection and
// authentication replies to w. It never asks r for more than the protocol
// says (r may buffer: serveSOCKS passes what it read past the request on to
// the flow), and every length is bounded by a byte. On an error, rep is the reply
// code to send before closing (0 for none: the peer is not speaking SOCKS5
// or already got its answer).
func socksHandshake(r io.Reader, w io.Writer, users map[string]string) (req socksRequest, rep byte, err error) {
	var buf [512]byte // the longest read is a 255-byte name and its port
	// Greeting: VER NMETHODS METHODS...
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return req, 0, err
	}
	if buf[0] != socksVersion {
		return req, 0, errSOCKSVersion
	}
	n := int(buf[1])
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return req, 0, err
	}
	want := byte(socksMethodNoAuth)
	if len(users) > 0 {
		want = socksMethodUserPass
	}
	offered := false
	for _, m := range buf[:n] {
		if m == want {
			offered = true
			break
		}
	}
	if !offered {
		w.Write([]byte{socksVersion, socksMethodNoAcceptable})
		return req, 0, errSOCKSMethod
	}
	if _, err := w.Write([]byte{socksVersion, want}); err != nil {
		return req, 0, err
	}
	if want == socksMethodUserPass {
		if err := socksUserPass(r, w, users, &buf); err != nil {
			return req, 0, err
		}
	}
	// Request: VER CMD RSV ATYP DST.ADDR DST.PORT
	if _, err := io.ReadFull(r, buf[:4]); err != nil {
		return req, 0, err
	}
	if buf[0] != socksVersion {
		return req, socksGeneralFailure, errSOCKSVersion
	}
	cmd, atyp := buf[1], buf[3]
	switch atyp {
	case socksAtypIPv4:
		if _, err := io.ReadFull(r, buf[:4+2]); err != nil {
			return req, 0, err
		}
		req.host = netip.AddrFrom4([4]byte(buf[:4])).String()
		req.port = uint16(buf[4])<<8 | uint16(buf[5])
	case socksAtypIPv6:
		if _, err := io.ReadFull(r, buf[:16+2]); err != nil {
			return req, 0, err
		}
		req.host = netip.AddrFrom16([16]byte(buf[:16])).Unmap().String()
		req.port = uint16(buf[16])<<8 | uint16(buf[17])
	case socksAtypDomain:
		if _, err := io.ReadFull(r, buf[:1]); err != nil {
			return req, 0, err
		}
		l := int(buf[0])
		if _, err := io.ReadFull(r, buf[:l+2]); err != nil {
			return req, 0, err
		}
		// An invalid name is decided (and denied) like any other: the
		// classifier, not this parser, says what a name is.
		req.host = string(buf[:l])
		req.port = uint16(buf[l])<<8 | uint16(buf[l+1])
	default:
		return req, socksAtypNotSupported, fmt.Errorf("socks: address type %#x not supported", atyp)
	}
	if cmd != socksCmdConnect {
		return req, socksCmdNotSupported, fmt.Errorf("socks: command %#x not supported (CONNECT only)", cmd)
	}
	return req, 0, nil
}

// socksUserPass is RFC 1929: VER ULEN UNAME PLEN PASSWD.
func socksUserPass(r io.Reader, w io.Writer, users map[string]string, buf *[512]byte) error {
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return err
	}
	if buf[0] != socksUserPassVersion {
		w.Write([]byte{socksUserPassVersion, 0x01})
		return errSOCKSAuth
	}
	ulen := int(buf[1])
	if _, err := io.ReadFull(r, buf[:ulen+1]); err != nil {
		return err
	}
	user := string(buf[:ulen])
	plen := int(buf[ulen])
	if _, err := io.ReadFull(r, buf[:plen]); err != nil {
		return err
	}
	pass, ok := users[user]
	// Compare even for an unknown user, so timing does not tell which
	// users exist.
	good := subtle.ConstantTimeCompare([]byte(pass), buf[:plen]) == 1 && ok && ulen > 0
	if !good {
		w.Write([]byte{socksUserPassVersion, 0x01})
		return errSOCKSAuth
	}
	_, err := w.Write([]byte{socksUserPassVersion, 0x00})
	return err
}

// writeSOCKSReply writes VER REP RSV ATYP BND.ADDR BND.PORT; bound is the
// upstream's local address when known, else 0.0.0.0:0.
func writeSOCKSReply(w io.Writer, rep byte, bound net.Addr) error {
	var ap netip.AddrPort
	if ta, ok := bound.(*net.TCPAddr); ok && ta != nil {
		ap = ta.AddrPort()
	}
	a := ap.Addr().Unmap()
	var out []byte
	if a.Is6() {
		b16 := a.As16()
		out = append([]byte{socksVersion, rep, 0, socksAtypIPv6}, b16[:]...)
	} else {
		var b4 [4]byte
		if a.Is4() {
			b4 = a.As4()
		}
		out = append([]byte{socksVersion, rep, 0, socksAtypIPv4}, b4[:]...)
	}
	out = append(out, byte(ap.Port()>>8), byte(ap.Port()))
	_, err := w.Write(out)
	return err
}

// socksCode is the reply for an admission that did not succeed.
func socksCode(a *admission) byte {
	switch a.out {
	case outDenied:
		return socksNotAllowed
	case outRefused:
		return socksConnRefused
	case outUnreachable:
		if a.netUnreachable {
			return socksNetworkUnreachable
		}
		return socksHostUnreachable
	default:
		return socksGeneralFailure
	}
}

// serveSOCKS runs a SOCKS5 flow whose first byte (0x05) hs will yield.
func (b *Boundary) serveSOCKS(f *flow, hs *handshake.Conn) {
	req, rep, err := socksHandshake(hs, hs, b.cfg.Users)
	if err != nil {
		b.handshakeError(f.c, err)
		if rep != 0 {
			writeSOCKSReply(hs, rep, nil)
		}
		hs.Flush()
		f.end()
		return
	}
	a := b.admit(f, req.host, req.port)
	if a.out != outAllowed {
		writeSOCKSReply(hs, socksCode(&a), nil)
		hs.Flush()
		f.end()
		return
	}
	// BND.ADDR stays 0.0.0.0:0: the host's own addresses are none of the
	// sandbox's business.
	writeSOCKSReply(hs, socksSucceeded, nil)
	if err := hs.Flush(); err != nil {
		f.abort()
		return
	}
	f.c.SetDeadline(noDeadline)
	b.run(f, &a, hs.Rest())
}
