package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// One listener for every sandbox, routing by Host: http://<port>-<sandbox>.<domain>/
// reaches port <port> of the sandbox named (or with the ID) <sandbox>. It
// is there beside the per-sandbox-port listeners for what they cannot do:
// a node with more sandboxes than its gateway port range, or a client
// that can only reach one port of the node (behind a load balancer, say).
// It is HTTP only: the sandbox is known from the first request's Host,
// and every later request on the connection must name the same one.
// With a domain under .localhost (RFC 6761 §6.3), curl and browsers
// resolve every such name to loopback with no DNS at all.

// hostHeaderWait bounds how long a connection to the Host-routed listener
// may take to send its first request's header block.
const hostHeaderWait = 30 * time.Second

// ServeHosts accepts connections on ln until it is closed, routing each by
// the Host of its first request (see above). resolve maps the <sandbox>
// part to a sandbox ID of this gateway's (false: none). It returns when ln
// is closed.
func (g *Gateway) ServeHosts(ln net.Listener, domain string, resolve func(ref string) (string, bool)) error {
	domain = strings.ToLower(strings.Trim(domain, "."))
	g.accept(ln, g.log, "gateway host listener accept", func(c net.Conn) { g.serveHost(c, domain, resolve) })
	return nil
}

func (g *Gateway) serveHost(c net.Conn, domain string, resolve func(string) (string, bool)) {
	src := &budget{r: c}
	cr := bufio.NewReaderSize(src, 32<<10)
	c.SetReadDeadline(time.Now().Add(hostHeaderWait))
	req, err := readRequest(src, cr)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		switch {
		case errors.Is(err, errHeaderTooLarge):
			writeStatus(c, http.StatusRequestHeaderFieldsTooLarge, "request header over 1 MiB")
		case !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF):
			writeStatus(c, http.StatusBadRequest, "not an HTTP/1.x request: this listener routes by Host (http://<port>-<sandbox>."+domain+"/)")
		}
		c.Close()
		return
	}
	port, ref, ok := ParseHost(req.Host, domain)
	var sg *sandboxGate
	var target netip.AddrPort
	if ok {
		if id, found := resolve(ref); found {
			g.mu.Lock()
			sg = g.sands[id]
			g.mu.Unlock()
		}
		if sg != nil {
			target, ok = sg.targets[port]
		}
	}
	if !ok || sg == nil {
		writeStatus(c, http.StatusNotFound, fmt.Sprintf("no sandbox port for Host %q on this node: use http://<port>-<sandbox name or ID>.%s/", req.Host, domain))
		c.Close()
		return
	}
	p := &pair{client: c}
	up, ok := g.open(sg, p, target, func(why error) {
		g.log.Info("gateway refused", "sandbox", sg.id, "err", why)
		writeUnavailable(c, why, g.cfg.RetryAfter)
	})
	if !ok {
		return
	}
	sg.mu.Lock()
	p.http = true
	sg.mu.Unlock()
	if !sg.setUpstream(p, up) {
		c.Close()
		return
	}
	defer sg.closePair(p)
	g.httpLoop(sg, p, target, src, cr, req, req.Host)
}

// ParseHost splits a Host of the Host-routed listener,
// "<port>-<sandbox>.<domain>[:listener port]", into the sandbox's port and
// name or ID. domain is lower case, without dots at its ends.
func ParseHost(host, domain string) (port int, ref string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, found := strings.CutSuffix(strings.ToLower(strings.TrimSuffix(host, ".")), "."+domain)
	if !found || label == "" || strings.Contains(label, ".") {
		return 0, "", false
	}
	p, ref, found := strings.Cut(label, "-")
	if !found || ref == "" {
		return 0, "", false
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
		return 0, "", false
	}
	return n, ref, true
}

// HostListener is a node's one Host-routed listener: opened when the node
// starts, served from its start-up repair on (Serve, once), so that a
// connection that comes before waits in the listener's backlog (one
// handed over by a reload included) instead of finding no such sandbox.
type HostListener struct {
	ln     net.Listener
	domain string
	once   sync.Once
}

// OpenHostListener opens the Host-routed listener on addr for names under
// domain (default sandbox.localhost); listen, if set, opens it (and may
// return one handed over by the process this one replaced).
func OpenHostListener(addr, domain string, listen func(network, address string, open func() (net.Listener, error)) (net.Listener, error)) (*HostListener, error) {
	if domain == "" {
		domain = "sandbox.localhost"
	}
	open := func() (net.Listener, error) { return net.Listen("tcp", addr) }
	var ln net.Listener
	var err error
	if listen != nil {
		ln, err = listen("tcp", addr, open)
	} else {
		ln, err = open()
	}
	if err != nil {
		return nil, fmt.Errorf("gateway host listener: %w", err)
	}
	return &HostListener{ln: ln, domain: domain}, nil
}

// Serve starts the listener's accept loop on g, once; resolve is
// ServeHosts's.
func (h *HostListener) Serve(g *Gateway, resolve func(ref string) (string, bool)) {
	if h == nil {
		return
	}
	h.once.Do(func() { go g.ServeHosts(h.ln, h.domain, resolve) })
}

// Endpoints maps each of ports to its URL on the listener:
// http://<port>-<name>.<domain>:<listener's port>/ (nil without one).
func (h *HostListener) Endpoints(name string, ports map[int]int) map[string]string {
	if h == nil {
		return nil
	}
	_, lport, _ := net.SplitHostPort(h.ln.Addr().String())
	out := map[string]string{}
	for sport := range ports {
		out[strconv.Itoa(sport)] = "http://" + strconv.Itoa(sport) + "-" + name + "." + h.domain + ":" + lport
	}
	return out
}

// Close closes the listener; its accept loop ends.
func (h *HostListener) Close() {
	if h != nil {
		h.ln.Close()
	}
}
