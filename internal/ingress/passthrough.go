package ingress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/pires/go-proxyproto"

	"sandstorm/api"
	"sandstorm/internal/metrics"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/sandboxtraffic"
)

// Passthrough hands a connection whose sandbox another node holds to that
// node's own ingress, unread, and serves the rest here (issue 33's goal:
// through any node ≤ 1.1 × straight to the holder). Forwarding each
// request over the nodes' mutual TLS cost 1.46 × a unary call and 1.87 ×
// 100 MiB down (bench/fleet --part envd, fleet-2026-12-05-ecc4c6b): the
// hop's own TLS and copies, on the cores the client and both nodes share.
// Passed through, the bytes are only copied (relay) and the client's TLS
// ends at the holder only.
//
// What names a connection's sandbox is its TLS ClientHello's server name
// (<port>-<id>.<domain>), or, in plain HTTP, its first request's target
// (sandboxtraffic.Target: that name as Host, or E2B's E2b-Sandbox-Id),
// read by crypto/tls's and net/http's own parsers from a recording of the
// connection's first bytes, which are then replayed to wherever it goes.
// The holder's ingress is a whole ingress: it checks each request's
// tokens as this one would, and sends a later request on the connection
// that is for another sandbox (keep-alive, a browser's coalesced h2) on
// by the route as before; a move mid-connection is followed the same way.
//
// A passed connection starts with a PROXY protocol header (HAProxy's,
// go-proxyproto), and a connection that starts with one is never passed
// again: a move can leave two nodes' tables naming each other for a
// moment, and a loop must not spin. A client that sends one itself only
// gets the request-by-request path; its claimed address is not believed.
type Passthrough struct {
	Self, Domain string
	Table        *Table
	// TLS is the ingress's own (nil: it serves plain HTTP). A connection
	// is passed only to an ingress that speaks the same.
	TLS *tls.Config
	// IngressOf asks node name (its seam at address) where its ingress
	// listens (nodeapi.Node.Ingress, over the nodes' mutual TLS).
	IngressOf func(ctx context.Context, name, address string) (nodeapi.IngressInfo, error)
	Log       *slog.Logger
	Metrics   *metrics.Ingress

	cache ingressCache
	port  string // the listener's (Listen)
}

const (
	// peekTimeout bounds how long a connection may take to say which
	// sandbox it is for, as the server's ReadHeaderTimeout does.
	peekTimeout = 10 * time.Second
	// peekMax bounds what is read to find it: net/http's own limit on a
	// request's head, so that nothing the server would take is refused
	// here (past it the connection is served here, which answers 431).
	peekMax = http.DefaultMaxHeaderBytes
	// ingressDial bounds the dial of a peer's ingress, and ingressAsk
	// the question of where it listens: cross-machine calls.
	ingressDial = 3 * time.Second
	ingressAsk  = 2 * time.Second
)

// Listen accepts ln's connections: each is passed to its holder's ingress
// or comes out of the listener returned, to be served here (as *tls.Conn
// if p.TLS is set). Closing that listener closes ln; connections already
// passed run on until either end closes them.
func (p *Passthrough) Listen(ln net.Listener) net.Listener {
	if _, port, err := net.SplitHostPort(ln.Addr().String()); err == nil {
		p.port = port
	}
	l := &handoff{ln: ln, conns: make(chan net.Conn), done: make(chan struct{})}
	go p.accept(l)
	return l
}

func (p *Passthrough) accept(l *handoff) {
	var backoff time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.stop(err)
				return
			}
			// EMFILE and the like: wait and go on, as http.Server does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.Log.Warn("ingress accept", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-l.done:
				return
			}
			continue
		}
		backoff = 0
		go p.route(l, c)
	}
}

// route passes c to its holder's ingress, or hands it to l.
func (p *Passthrough) route(l *handoff, c net.Conn) {
	c.SetReadDeadline(time.Now().Add(peekTimeout))
	rec := &recorder{c: c, max: peekMax}
	br := bufio.NewReader(rec)
	// A connection a peer passed: served here, whatever its name says.
	_, perr := proxyproto.Read(br)
	skip := 0
	if perr == nil {
		skip = len(rec.buf) - br.Buffered()
	}
	var id string
	if perr != nil {
		id = p.sniff(c, br)
	}
	if errors.Is(rec.err, os.ErrDeadlineExceeded) {
		c.Close() // said nothing in time: as ReadHeaderTimeout would
		return
	}
	c.SetReadDeadline(time.Time{})
	if id != "" {
		if to, ok := p.holder(id); ok && p.pass(c, rec.buf, to) {
			return
		}
	}
	var local net.Conn = &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(rec.buf[skip:]), c)}
	rec.buf = nil
	if p.TLS != nil {
		local = tls.Server(local, p.TLS)
	}
	l.hand(local)
}

// sniff reads which sandbox c is for from its first bytes, br ("": none
// named, or not in time).
func (p *Passthrough) sniff(c net.Conn, br *bufio.Reader) string {
	if p.TLS == nil {
		req, err := http.ReadRequest(br)
		if err != nil {
			return ""
		}
		id, _, err := sandboxtraffic.Target(req, p.Domain)
		if err != nil {
			return ""
		}
		return id
	}
	var name string
	// The handshake stops once the ClientHello is read; what it would
	// answer (an alert) goes nowhere.
	tls.Server(&peekConn{Conn: c, r: br}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name = h.ServerName
		return nil, errPeeked
	}}).Handshake()
	_, id, _ := api.SandboxHost(name, p.Domain)
	return id
}

var errPeeked = errors.New("ingress: client hello read")

// holder is where to pass a connection for sandbox id: the ingress of
// the node holding it, if that is another node that serves one like
// ours. A sandbox here, unknown, paused (its resume is asked from here),
// or on a node no peer reaches is served here.
func (p *Passthrough) holder(id string) (string, bool) {
	at, ok := p.peer(id)
	return at.to, ok
}

// peer is what is known of the ingress of the node holding sandbox id,
// if that is another node that serves one like ours.
func (p *Passthrough) peer(id string) (peerAt, bool) {
	rt, ok := p.Table.Get(id)
	if !ok || rt.Node == p.Self || rt.Address == "" || rt.Paused {
		return peerAt{}, false
	}
	return p.cache.get(rt.Node, rt.Address, p.TLS != nil, p.ask)
}

// Steer is the address the fleet's DNS gives for sandbox id's names
// (DNS.Steer) when another node holds it: that node's public address, if
// it gives one and its ingress listens on the port ours does (a client
// reaches every node on one port). False: this node's own, which passes
// the connection on or serves it, as for a name whose route has not come
// yet.
func (p *Passthrough) Steer(id string) (netip.Addr, bool) {
	at, ok := p.peer(id)
	if !ok || at.public == "" {
		return netip.Addr{}, false
	}
	_, port, err := net.SplitHostPort(at.to)
	if err != nil || port != p.port {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(at.public)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// ask is where node name's ingress listens, asked over the seam.
func (p *Passthrough) ask(name, address string) (nodeapi.IngressInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ingressAsk)
	defer cancel()
	return p.IngressOf(ctx, name, address)
}

// pass sends c, with what was read of it first, to the ingress at to,
// and copies both ways until both sides are done. False if the ingress
// could not be dialled (nothing was written to c: it is served here).
func (p *Passthrough) pass(c net.Conn, read []byte, to string) bool {
	up, err := net.DialTimeout("tcp", to, ingressDial)
	if err != nil {
		p.Log.Warn("ingress passthrough: the holder's ingress did not answer; serving here", "to", to, "err", err)
		p.cache.forget(to)
		return false
	}
	p.Metrics.Request("passed")
	hdr := proxyproto.HeaderProxyFromAddrs(2, c.RemoteAddr(), c.LocalAddr())
	head, err := hdr.Format()
	if err == nil {
		bufs := net.Buffers{head, read}
		_, err = bufs.WriteTo(up)
	}
	if err != nil {
		up.Close()
		c.Close()
		return true
	}
	relay(c, up)
	return true
}

// ingressCache remembers where peers' ingresses listen: asked once and
// then every ingressFresh (a peer is asked again only when a connection
// needs it, and meanwhile served by what was known), an answer that it
// has none or did not come remembered for ingressRetry.
type ingressCache struct {
	mu sync.Mutex
	m  map[string]*peerIngress // by name@address
}

type peerIngress struct {
	peerAt
	at     time.Time
	asking bool
}

// peerAt is what is known of a peer's ingress.
type peerAt struct {
	to     string // where a peer dials it; "" none (or not like ours)
	public string // its IngressInfo.Public, on the port of to ("": none)
}

const (
	ingressFresh = 30 * time.Second
	ingressRetry = 5 * time.Second
)

// get is what is known of node name's ingress (its seam at address), if
// it serves one with TLS as wantTLS says; asked with ask when not known,
// refreshed in the background when old.
func (c *ingressCache) get(name, address string, wantTLS bool, ask func(name, address string) (nodeapi.IngressInfo, error)) (peerAt, bool) {
	key := name + "@" + address
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]*peerIngress{}
	}
	e, known := c.m[key]
	if known {
		age := time.Since(e.at)
		if !e.asking && (age > ingressFresh || e.to == "" && age > ingressRetry) {
			e.asking = true
			go c.refresh(key, name, address, wantTLS, ask)
		}
		at := e.peerAt
		c.mu.Unlock()
		return at, at.to != ""
	}
	c.mu.Unlock()
	at := resolve(name, address, wantTLS, ask)
	c.mu.Lock()
	c.m[key] = &peerIngress{peerAt: at, at: time.Now()}
	c.mu.Unlock()
	return at, at.to != ""
}

func (c *ingressCache) refresh(key, name, address string, wantTLS bool, ask func(name, address string) (nodeapi.IngressInfo, error)) {
	at := resolve(name, address, wantTLS, ask)
	c.mu.Lock()
	c.m[key] = &peerIngress{peerAt: at, at: time.Now()}
	c.mu.Unlock()
}

// forget drops what is known of the ingress at to (its dial failed): the
// next connection for it asks again, after ingressRetry.
func (c *ingressCache) forget(to string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.m {
		if e.to == to {
			e.peerAt, e.at = peerAt{}, time.Now()
		}
	}
}

// resolve asks node name where its ingress is: nothing if it has none,
// one not like ours, or did not say.
func resolve(name, address string, wantTLS bool, ask func(name, address string) (nodeapi.IngressInfo, error)) peerAt {
	in, err := ask(name, address)
	if err != nil || in.TLS != wantTLS {
		return peerAt{}
	}
	to, err := IngressAddress(address, in)
	if err != nil {
		return peerAt{}
	}
	return peerAt{to: to, public: in.Public}
}

// IngressAddress is where a peer dials the ingress in, of the node whose
// seam is at seam: its listener's address, or, where that is every
// address of the node (":8443", "[::]:8443"), its port on the seam's
// host, which the peer reaches already.
func IngressAddress(seam string, in nodeapi.IngressInfo) (string, error) {
	host, port, err := net.SplitHostPort(in.Address)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if host, _, err = net.SplitHostPort(seam); err != nil {
			return "", err
		}
	}
	return net.JoinHostPort(host, port), nil
}

// handoff is the listener of the connections served here.
type handoff struct {
	ln    net.Listener
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	err   error // why it stopped, set before done is closed
}

func (l *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

func (l *handoff) Close() error {
	l.stop(net.ErrClosed)
	return l.ln.Close()
}

func (l *handoff) Addr() net.Addr { return l.ln.Addr() }

func (l *handoff) stop(err error) {
	l.once.Do(func() {
		l.err = err
		close(l.done)
	})
}

// hand gives c to whoever accepts (closed if the listener is).
func (l *handoff) hand(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

// recorder reads c and keeps what it read, up to max.
type recorder struct {
	c   net.Conn
	buf []byte
	max int
	err error // the last read's
}

var errPeekLong = errors.New("ingress: connection's first bytes too long to read a name from")

func (r *recorder) Read(b []byte) (int, error) {
	room := r.max - len(r.buf)
	if room <= 0 {
		return 0, errPeekLong
	}
	n, err := r.c.Read(b[:min(len(b), room)])
	r.buf = append(r.buf, b[:n]...)
	r.err = err
	return n, err
}

// peekConn is a connection read through r, whose writes go nowhere: the
// parser that reads a ClientHello must not answer it.
type peekConn struct {
	net.Conn
	r io.Reader
}

func (p *peekConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *peekConn) Write(b []byte) (int, error) { return len(b), nil }

// replayConn is a connection whose first bytes, read already, are read
// again from r.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error) { return c.r.Read(b) }
