package ingress

import (
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"sandstorm/api"
)

// DNS is a node's answer to where a sandbox's names are (serve
// --ingress-dns): an authoritative server for the fleet's zone (the
// gateway domain), which the operator delegates to the nodes. A name
// <port>-<id>.<zone> of a sandbox another node holds is answered with
// that node's public address, so a client that resolves it reaches the
// holder straight, with no hop through another node (issue 33 item 7:
// a passed connection's copy costs 1.3 × 100 MiB down on this machine,
// bench/README.md); every other sandbox name, its route not pushed yet
// included, with this node's own, which passes the connection on or
// serves it. A stale answer (a move within the TTL) only costs that hop.
//
// It answers its zone only, never recursively (a resolver open to the
// internet is an amplifier), and nothing for a name it does not know
// but NXDOMAIN. An answer is about as large as its question.
type DNS struct {
	// Zone is the gateway domain (no trailing dot).
	Zone string
	// Self is this node's public address: the answer for a sandbox it
	// holds, or one it cannot steer.
	Self netip.Addr
	// Records are fixed names in the zone (--ingress-dns-record), by
	// their label under it ("api"; "" the zone itself).
	Records map[string][]netip.Addr
	// NS are the zone's name servers as its parent delegates it
	// (--ingress-dns-ns; host names, no trailing dot): answered for NS at
	// the apex, the first as the SOA's primary. One under the zone has
	// its address among Records, given with the answer (RFC 1034 4.3.2's
	// additional section). None: NS is answered with no records.
	NS []string
	// Steer is where another node's sandbox is reached (Passthrough.Steer).
	Steer func(id string) (netip.Addr, bool)
	// Serial is the zone's SOA serial (the routes' version).
	Serial func() uint32
	// Limit rate-limits answers over UDP (nil: none).
	Limit *DNSLimit
	// Counted, if set, is told what became of each answer: "sent",
	// "slipped" (sent empty and truncated by Limit) or "dropped".
	Counted func(outcome string)
	Log     *slog.Logger
}

const (
	// sandboxTTL is short: a move is followed within it.
	sandboxTTL = 5
	// recordTTL is a fixed record's.
	recordTTL = 60
	// negativeTTL bounds how long a resolver keeps an NXDOMAIN (the SOA's
	// minimum, RFC 2308).
	negativeTTL = 5
	// ednsSize is the largest answer sent over UDP (the DNS flag day's
	// 1232 bytes, which no path fragments).
	ednsSize = 1232
	// dnsTimeout bounds a TCP client's exchange.
	dnsTimeout = 5 * time.Second
)

// Serve answers on pc (UDP) and ln (TCP) until both are closed.
func (d *DNS) Serve(pc net.PacketConn, ln net.Listener) {
	h := dns.HandlerFunc(d.serveDNS)
	go (&dns.Server{PacketConn: pc, Handler: h}).ActivateAndServe()
	go (&dns.Server{Listener: ln, Handler: h, ReadTimeout: dnsTimeout, WriteTimeout: dnsTimeout}).ActivateAndServe()
}

func (d *DNS) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := d.answer(req)
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(size, int(opt.UDPSize()))
		m.SetEdns0(ednsSize, false) // RFC 6891: an EDNS question gets an EDNS answer
	}
	outcome := "sent"
	if w.RemoteAddr().Network() == "udp" {
		switch d.limited(w.RemoteAddr(), req, m) {
		case limitDrop:
			d.count("dropped")
			return
		case limitSlip:
			outcome = "slipped"
			m.Answer, m.Ns, m.Extra = nil, nil, nil
			m.Truncated = true // RFC 1035: ask again over TCP
		}
		m.Truncate(min(size, ednsSize)) // many fixed addresses: the client retries over TCP
	}
	if err := w.WriteMsg(m); err != nil && d.Log != nil {
		d.Log.Debug("ingress dns: answer not sent", "to", w.RemoteAddr(), "err", err)
	}
	d.count(outcome)
}

func (d *DNS) count(outcome string) {
	if d.Counted != nil {
		d.Counted(outcome)
	}
}

// limited is Limit's verdict on answer m to req from client: its kind is
// the name and type for an answer with records, the name for one without
// (NODATA), and one kind for every error, as BIND's RRL counts them.
func (d *DNS) limited(client net.Addr, req, m *dns.Msg) limitVerdict {
	ua, ok := client.(*net.UDPAddr)
	if d.Limit == nil || !ok {
		return limitSend
	}
	kind := "error"
	if m.Rcode == dns.RcodeSuccess && len(req.Question) == 1 {
		q := req.Question[0]
		kind = "nodata " + strings.ToLower(q.Name)
		if len(m.Answer) > 0 {
			kind = dns.TypeToString[q.Qtype] + " " + strings.ToLower(q.Name)
		}
	}
	return d.Limit.decide(ua.AddrPort().Addr(), kind, time.Now())
}

// answer decides the answer to req, without I/O but Steer's.
func (d *DNS) answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = false
	switch {
	case req.Opcode != dns.OpcodeQuery:
		m.Rcode = dns.RcodeNotImplemented
		return m
	case len(req.Question) != 1:
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := req.Question[0]
	zone := strings.ToLower(strings.TrimSuffix(d.Zone, "."))
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	label, inZone := strings.CutSuffix(name, "."+zone)
	if name == zone {
		label, inZone = "", true
	}
	if !inZone || q.Qclass != dns.ClassINET {
		m.Rcode = dns.RcodeRefused // not ours: no recursion, no opinion
		return m
	}
	m.Authoritative = true
	addrs, ttl, exists := d.lookup(name, label, zone)
	if !exists {
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{d.soa(zone)}
		return m
	}
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: ttl}
		switch {
		case q.Qtype == dns.TypeA && a.Is4():
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		case q.Qtype == dns.TypeAAAA && a.Is6():
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	if label == "" && q.Qtype == dns.TypeSOA {
		m.Answer = append(m.Answer, d.soa(zone))
	}
	if label == "" && q.Qtype == dns.TypeNS {
		m.Answer, m.Extra = d.nameServers(q.Name, zone)
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{d.soa(zone)} // the name is, with no record of that type
	}
	return m
}

// lookup is what name (label under zone) is: a fixed record, the zone
// itself, or a sandbox's name, answered with where it is reached.
func (d *DNS) lookup(name, label, zone string) (addrs []netip.Addr, ttl uint32, exists bool) {
	if a, ok := d.Records[label]; ok {
		return a, recordTTL, true
	}
	if label == "" {
		return nil, recordTTL, true
	}
	_, id, ok := api.SandboxHost(name, zone)
	if !ok {
		return nil, 0, false
	}
	if d.Steer != nil {
		if a, ok := d.Steer(id); ok {
			return []netip.Addr{a}, sandboxTTL, true
		}
	}
	return []netip.Addr{d.Self}, sandboxTTL, true
}

// nameServers are the apex's NS records (named as asked) and the
// addresses of those under the zone.
func (d *DNS) nameServers(asked, zone string) (ns, extra []dns.RR) {
	for _, n := range d.NS {
		ns = append(ns, &dns.NS{Hdr: dns.RR_Header{Name: asked, Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: recordTTL}, Ns: dns.Fqdn(n)})
		label, ok := strings.CutSuffix(strings.ToLower(n), "."+zone)
		if !ok {
			continue
		}
		for _, a := range d.Records[label] {
			hdr := dns.RR_Header{Name: dns.Fqdn(n), Class: dns.ClassINET, Ttl: recordTTL}
			if a.Is4() {
				hdr.Rrtype = dns.TypeA
				extra = append(extra, &dns.A{Hdr: hdr, A: a.AsSlice()})
			} else {
				hdr.Rrtype = dns.TypeAAAA
				extra = append(extra, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
	}
	return ns, extra
}

// soa is the zone's start of authority, whose minimum is how long a
// resolver keeps a negative answer.
func (d *DNS) soa(zone string) dns.RR {
	var serial uint32 = 1
	if d.Serial != nil {
		serial = d.Serial()
	}
	primary := zone
	if len(d.NS) > 0 {
		primary = d.NS[0]
	}
	return &dns.SOA{
		Hdr:     dns.RR_Header{Name: dns.Fqdn(zone), Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: negativeTTL},
		Ns:      dns.Fqdn(primary),
		Mbox:    dns.Fqdn("hostmaster." + zone),
		Serial:  serial,
		Refresh: 3600, Retry: 600, Expire: 86400, Minttl: negativeTTL,
	}
}
