package boundary

import (
	"cmp"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"

	"sandstorm/api"
	"sandstorm/internal/sam/policy"
)

// The sandbox's DNS. The boundary is the only resolver a sandbox has, and it
// resolves nothing upstream: a name the principal may reach (mesh.sam.alt, a
// granted service, an allowed external name) gets a synthetic address from
// the link-local pool, stable for the name; any other name is NXDOMAIN,
// whether or not it exists, so DNS cannot be used to probe the mesh.

const (
	dnsTTL         = 30
	dnsTCPIdle     = 10 * time.Second
	dnsTCPMaxQuery = 64
	dnsUDPBuf      = 2048
)

// serveDNSUDP answers queries on pc until it is closed. Answering is pure
// and fast, so it happens in this goroutine: no goroutine per query.
func (b *Boundary) serveDNSUDP(pc *net.UDPConn) {
	defer b.loops.Done()
	buf := make([]byte, dnsUDPBuf)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if from.Addr().Unmap() != b.cfg.Peer {
			b.foreign(net.UDPAddrFromAddrPort(from))
			continue
		}
		if out := b.answerDNSBytes(buf[:n], false); out != nil {
			pc.WriteToUDPAddrPort(out, from)
		}
	}
}

// serveDNSTCP answers length-prefixed queries (RFC 7766) on one connection.
func (b *Boundary) serveDNSTCP(c net.Conn) {
	f := b.track(c, false)
	if f == nil {
		return
	}
	defer b.untrack(f)
	defer f.end()
	var lb [2]byte
	for i := 0; i < dnsTCPMaxQuery; i++ {
		c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint16(lb[:])
		if n < 12 {
			return
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		out := b.answerDNSBytes(msg, true)
		if out == nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
			return
		}
	}
}

// answerDNSBytes answers one wire-format query; nil means no answer (not a
// query at all).
func (b *Boundary) answerDNSBytes(msg []byte, tcp bool) []byte {
	if len(msg) < 12 || msg[2]&0x80 != 0 { // too short, or a response
		return nil
	}
	req := new(dns.Msg)
	if err := req.Unpack(msg); err != nil {
		m := new(dns.Msg)
		m.Id = binary.BigEndian.Uint16(msg)
		m.Response = true
		m.Rcode = dns.RcodeFormatError
		b.countDNS(dnsRefused)
		out, _ := m.Pack()
		return out
	}
	resp := b.answerDNS(req)
	if !tcp {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil && int(o.UDPSize()) > size {
			size = int(o.UDPSize())
		}
		resp.Truncate(size)
	}
	out, err := resp.Pack()
	if err != nil {
		return nil
	}
	return out
}

func (b *Boundary) countDNS(a dnsAnswer) {
	b.st.dns[a].Add(1)
	b.m.dnsAnswer(a)
}

// answerDNS answers a parsed query.
func (b *Boundary) answerDNS(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = true // the only resolver the sandbox has
	if req.IsEdns0() != nil {
		m.SetEdns0(1232, false)
	}
	if req.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		b.countDNS(dnsRefused)
		return m
	}
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		b.countDNS(dnsRefused)
		return m
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		m.Rcode = dns.RcodeRefused
		b.countDNS(dnsRefused)
		return m
	}
	name, why := b.granted(q.Name)
	if why != "" {
		m.Rcode = dns.RcodeNameError
		b.countDNS(dnsNXDomain)
		b.refused(api.RefusedDNS, strings.TrimSuffix(q.Name, "."), why)
		if b.cfg.Flows != nil { // so "could not resolve" has its reason in the egress log
			b.cfg.Flows(api.EgressFlow{Time: time.Now(), Name: strings.ToLower(strings.TrimSuffix(q.Name, ".")), Route: api.EgressRouteDNS, Outcome: outcomeNames[outDenied], Rule: why})
		}
		return m
	}
	if q.Qtype == dns.TypeA {
		addr, ok := b.synth.Assign(name)
		if !ok {
			m.Rcode = dns.RcodeServerFailure // the pool is full
			b.countDNS(dnsRefused)
			return m
		}
		m.Answer = []dns.RR{&dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
			A:   addr.AsSlice(),
		}}
	}
	// AAAA and every other type of a granted name: NOERROR, no records.
	b.countDNS(dnsSynthetic)
	return m
}

// granted returns the normalised name if the principal may reach it,
// else why not. IP literals are never names here.
func (b *Boundary) granted(qname string) (name, why string) {
	d, err := policy.Classify(qname)
	switch {
	case err != nil:
		return "", err.Error()
	case d.IsIP:
		return "", "an address is not a name to resolve"
	}
	if ok, reason := b.policy().Decide(b.cfg.Principal, d); !ok {
		return "", cmp.Or(reason, "not granted")
	}
	if routeOf(d.Kind) == routeExternal {
		// The sandbox's own rules may refuse the name outright: then it
		// does not exist for the sandbox either (its rules only narrow).
		if err := b.egress.Load().DeniesName(d.Host); err != nil {
			return "", err.Error()
		}
	}
	return d.Host, ""
}
