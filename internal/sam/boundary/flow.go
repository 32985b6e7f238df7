package boundary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/handshake"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/sam/tcpsock"
)

var noDeadline time.Time

// serveProxy takes a connection on the socket or the proxy port and sniffs
// its first byte: 0x05 is SOCKS5, anything else HTTP.
func (b *Boundary) serveProxy(c net.Conn) {
	f := b.track(c, true)
	if f == nil {
		return
	}
	defer b.untrack(f)
	c.SetDeadline(time.Now().Add(b.cfg.HandshakeTimeout))
	hs := handshake.New(c)
	first, err := hs.Peek()
	if err != nil {
		if err != io.EOF { // connected and left without a byte: a probe
			b.handshakeError(c, err)
		}
		f.abort()
		return
	}
	if first == socksVersion {
		b.serveSOCKS(f, hs)
	} else {
		b.serveHTTP(f, hs)
	}
}

// admission is the verdict on a flow and, when allowed, its open upstream.
type admission struct {
	dest           policy.Dest
	route          route
	out            outcome
	err            error
	far            net.Conn // the upstream (the mesh for mesh names)
	timeout        bool
	netUnreachable bool
	// private: the private prefixes the principal's policy opts into,
	// from the same policy the verdict came from.
	private []netip.Prefix
	// egress: the sandbox's own rules when the flow was admitted, and
	// whether its allowOut names the flow's destination.
	egress *egress.Rules
	byName bool
	// ingress: carried to its node's own ingress (Config.Ingress).
	ingress bool
	// What the egress log says of it: when it was decided, and the
	// destination as the sandbox named it.
	start time.Time
	host  string
	port  uint16
	// secrets: the names of the secrets put in its requests.
	secrets []string
}

var (
	errMeshUnreachable = errors.New("mesh unreachable: no sam-node configured")
	errFlowClosed      = errors.New("flow closed")
)

// admit classifies host, decides it for the principal under the policy in
// force and, only if allowed, opens the upstream: the mesh for mesh names,
// the resolved destination for external ones. The time from classification
// to an open upstream (or a verdict) is the admission time.
func (b *Boundary) admit(f *flow, host string, port uint16) admission {
	start := time.Now()
	a := b.decide(host)
	a.start, a.host, a.port = start, host, port
	if a.out == outAllowed {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DialTimeout)
		switch {
		case a.dest.Kind == policy.KindExternal && !a.dest.IsIP && b.cfg.Ingress.Match(a.dest.Host, port):
			b.dialIngress(ctx, &a)
		case a.dest.Kind == policy.KindExternal:
			b.dialExternal(ctx, &a, port)
		default:
			b.dialMesh(ctx, &a)
		}
		cancel()
		if a.far != nil && !f.addFar(a.far) {
			a.far = nil
			a.out, a.err = outError, errFlowClosed
		}
	}
	d := time.Since(start)
	if a.out == outAllowed {
		b.touch()
	}
	b.st.admissions.Add(1)
	b.st.admissionNanos.Add(int64(d))
	b.m.observeAdmission(d)
	b.countFlow(a.route, a.out)
	if a.out == outDenied {
		// An address the guard refused is itemised where it was refused
		// (addressRefused), with its class.
		var gr *dialguard.Refusal
		if !errors.As(a.err, &gr) {
			b.refused(api.RefusedName, host, a.err.Error())
		}
		// A person asking why a program got "not allowed" finds the
		// answer here: who, what, and the rule that refused it.
		b.logRefusal.Do(func() {
			b.log.Info("boundary refused a flow", "principal", b.cfg.Principal, "route", routeNames[a.route], "host", host, "port", port, "reason", a.err)
		})
	} else if a.out != outAllowed {
		b.log.Debug("boundary flow not admitted", "principal", b.cfg.Principal, "route", routeNames[a.route], "outcome", outcomeNames[a.out], "host", host, "port", port, "err", a.err)
	}
	if a.out != outAllowed {
		b.logFlow(&a, 0, 0)
	}
	return a
}

// logFlow hands a flow to the sandbox's egress log (Config.Flows): where
// it went, what it carried, and what decided it.
func (b *Boundary) logFlow(a *admission, out, in int64) {
	if b.cfg.Flows == nil {
		return
	}
	name := a.host
	if a.dest.Host != "" {
		name = a.dest.Host // a synthetic address stands for its name
	}
	e := api.EgressFlow{Time: a.start, Name: name, Port: int(a.port), Route: routeNames[a.route], Outcome: outcomeNames[a.out],
		Rule: "policy", BytesOut: out, BytesIn: in, Secrets: a.secrets}
	switch {
	case a.out != outAllowed && a.err != nil:
		e.Rule = a.err.Error()
	case a.out != outAllowed:
		e.Rule = outcomeNames[a.out]
	case a.byName:
		e.Rule = "policy, and allow_out names it"
	case a.egress != nil:
		e.Rule = "policy, and its address passes deny_out"
	}
	if a.far != nil {
		e.Addr = a.far.RemoteAddr().String()
	}
	b.cfg.Flows(e)
}

// decide is the verdict alone: no I/O.
func (b *Boundary) decide(host string) admission {
	a := admission{route: routeExternal}
	d, err := policy.Classify(host)
	if err == nil && d.IsIP {
		// A synthetic address the agent resolved through this boundary
		// (a SOCKS client resolving locally) stands for its name.
		if ip, perr := netip.ParseAddr(d.Host); perr == nil {
			if name, ok := b.synth.Lookup(ip); ok {
				d, err = policy.Classify(name)
			}
		}
	}
	if err != nil {
		a.out, a.err = outDenied, err
		return a
	}
	a.dest = d
	a.route = routeOf(d.Kind)
	p := b.policy()
	if ok, reason := p.Decide(b.cfg.Principal, d); !ok {
		a.out, a.err = outDenied, errors.New(reason)
		return a
	}
	a.out = outAllowed
	a.private = p.For(b.cfg.Principal).PrivateNets()
	if r := b.egress.Load(); !r.Empty() && a.route == routeExternal {
		a.egress, a.byName = r, !d.IsIP && r.AllowsName(d.Host)
		if !d.IsIP {
			// Refused here, not after a lookup (egress.DeniesName).
			if err := r.DeniesName(d.Host); err != nil {
				a.out, a.err = outDenied, err
			}
		}
	}
	return a
}

func routeOf(k policy.Kind) route {
	switch k {
	case policy.KindMesh:
		return routeMesh
	case policy.KindService:
		return routeService
	default:
		return routeExternal
	}
}

// dialMesh opens the mesh for an allowed flow: nothing to dial while the
// boundary's pool holds an open connection to the node (a keep-alive one
// its transport will reuse, or one in use), else a new connection, which
// also tells a flow at once that the node is down (SOCKS5 0x04, 502). A
// node that goes away while a connection looks open fails the flow's
// request instead (502), as a node dying mid-flow always did.
func (b *Boundary) dialMesh(ctx context.Context, a *admission) {
	if b.pool == nil {
		a.out, a.err = outUnreachable, errMeshUnreachable
		return
	}
	if b.pool.live.Load() > 0 {
		return
	}
	c, err := b.pool.open(ctx)
	if err != nil {
		a.out, a.err = outUnreachable, fmt.Errorf("mesh unreachable: %w", err)
		a.timeout = errors.Is(err, context.DeadlineExceeded)
		return
	}
	a.far = c
}

// dialExternal resolves an allowed name (an IP literal is its own address)
// and dials its addresses in turn — only those the guard allows. This is the
// one place every external flow goes through (SOCKS5, CONNECT, transparent),
// so the address check cannot be missed by one of them. The check runs
// twice: here, on each resolved address, so a refusal is known and counted
// before anything is dialled; and on the socket itself (the dialer's
// Control hook), on the address it is about to connect to, so a Dial that
// resolves again cannot connect somewhere this check did not see.
func (b *Boundary) dialExternal(ctx context.Context, a *admission, port uint16) {
	var addrs []netip.Addr
	if a.dest.IsIP {
		ip, err := netip.ParseAddr(a.dest.Host)
		if err != nil {
			a.out, a.err = outError, err
			return
		}
		addrs = []netip.Addr{ip}
	} else {
		var err error
		addrs, err = b.cfg.Resolve(ctx, a.dest.Host)
		if err != nil || len(addrs) == 0 {
			if err == nil {
				err = fmt.Errorf("%s has no address", a.dest.Host)
			}
			a.out, a.err = outUnreachable, err
			a.timeout = errors.Is(err, context.DeadlineExceeded)
			return
		}
	}
	if port == 0 {
		a.out, a.err = outUnreachable, errors.New("port 0")
		return
	}
	dial := b.cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{Control: dialguard.Control(b.cfg.Guard, a.private)}).DialContext
	}
	var last, refused error
	tried := 0
	for _, ip := range addrs {
		if tried == 4 {
			break
		}
		ip = ip.Unmap()
		if err := a.egress.Check(ip, a.byName); err != nil {
			// The sandbox's own rule: a refusal as a denied name is.
			b.log.Info("egress rule refused an address", "principal", b.cfg.Principal, "host", a.dest.Host, "err", err)
			refused = err
			continue
		}
		if err := b.cfg.Guard.Check(ip, a.private); err != nil {
			var r *dialguard.Refusal
			if errors.As(err, &r) {
				b.addressRefused(a.dest.Host, r)
				refused = err
				continue
			}
			last = err // the route lookup failed: not dialled either
			continue
		}
		tried++
		c, err := dial(ctx, "tcp", netip.AddrPortFrom(ip, port).String())
		if err == nil {
			a.far = c
			return
		}
		var r *dialguard.Refusal
		if errors.As(err, &r) {
			// The socket's own check refused what the first one allowed:
			// the route changed in between.
			b.addressRefused(a.dest.Host, r)
			refused = err
			continue
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	if last == nil && refused != nil {
		// Every address the name had is one a sandbox may never reach: a
		// policy refusal, exactly like a denied name.
		a.out, a.err = outDenied, refused
		return
	}
	a.err = last
	switch {
	case errors.Is(last, syscall.ECONNREFUSED):
		a.out = outRefused
	case errors.Is(last, syscall.ENETUNREACH):
		a.out, a.netUnreachable = outUnreachable, true
	case errors.Is(last, syscall.EHOSTUNREACH):
		a.out = outUnreachable
	case errors.Is(last, context.DeadlineExceeded) || isTimeout(last):
		a.out, a.timeout = outUnreachable, true
	default:
		a.out = outError
	}
}

// dialIngress opens an allowed flow to another sandbox's public URL on
// its node's own ingress. The sandbox's own rules still apply, to that
// address as to any (allowInternetAccess: false refuses it, unless its
// allowOut names the name).
func (b *Boundary) dialIngress(ctx context.Context, a *admission) {
	a.ingress = true
	if err := a.egress.Check(b.cfg.Ingress.Addr.Addr(), a.byName); err != nil {
		a.out, a.err = outDenied, err
		return
	}
	c, err := b.cfg.Ingress.Dial(ctx)
	if err != nil {
		a.out, a.err = outUnreachable, fmt.Errorf("this node's ingress: %w", err)
		a.timeout = errors.Is(err, context.DeadlineExceeded) || isTimeout(err)
		return
	}
	a.far = c
}

// addressRefused counts and logs an address the guard would not dial. It
// is logged at warning level: an allowed name that resolves into the node
// is DNS rebinding or a policy mistake, and someone should look.
func (b *Boundary) addressRefused(host string, r *dialguard.Refusal) {
	if r.Class >= 0 && r.Class < dialguard.NumClasses {
		b.st.addrRefusals[r.Class].Add(1)
	}
	b.m.addrRefusal(r.Class)
	b.refused(api.RefusedAddress, host, r.Error())
	b.logRefusal.Do(func() {
		b.log.Warn("boundary refused an address", "principal", b.cfg.Principal, "name", host, "addr", r.Addr, "class", r.Class.String(), "reason", r.Error())
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// run carries an admitted flow: mesh names are served as HTTP by the
// boundary, external destinations are spliced. prefix holds bytes the
// agent sent after its handshake that were already read.
func (b *Boundary) run(f *flow, a *admission, prefix []byte) {
	if a.dest.Kind == policy.KindExternal {
		var first []byte // the server's, when it spoke first
		if !a.dest.IsIP && len(b.cfg.Secrets.For(a.dest.Host)) > 0 {
			var ok bool
			if ok, prefix, first = b.inject(f, a, prefix); ok {
				return
			}
		}
		out, in := b.splice(f, a.far, prefix, first)
		b.logFlow(a, out, in)
		return
	}
	b.logFlow(a, 0, 0) // before: a mesh connection serves requests until the sandbox closes it
	b.serveMesh(f, a, prefix)
}

// inject carries a TLS flow to a name its sandbox's secrets may go to
// (inject.Set.Serve): the secrets are put in its requests, and the egress
// log names those used. It says false, with the bytes each side sent, for
// a flow that is not TLS: that one is spliced, its markers untouched (a
// secret never goes out in clear text). A server that speaks first (SMTP,
// SSH) is answered at once, not after the handshake timeout.
func (b *Boundary) inject(f *flow, a *admission, prefix []byte) (bool, []byte, []byte) {
	sc := f.c
	if b.cfg.Activity != nil {
		sc = activeConn{f.c, b}
	}
	op, err := inject.Open(sc, a.far, prefix, b.cfg.HandshakeTimeout)
	if err != nil {
		f.abort()
		b.logFlow(a, 0, 0)
		return true, nil, nil
	}
	if !op.TLS {
		return false, op.Sandbox, op.Server
	}
	set := b.cfg.Secrets
	if a.ingress {
		set = set.WithRoots(b.cfg.Ingress.Roots) // the ingress's certificate is the fleet's
	}
	r := set.Serve(sc, op.Sandbox, a.far, a.dest.Host, b.cfg.HandshakeTimeout, b.touch)
	if r.Err != nil {
		// Never the request: it may hold a secret.
		b.log.Info("boundary: a flow to a secret's host ended early", "principal", b.cfg.Principal, "host", a.dest.Host, "err", r.Err)
	}
	if len(r.Scrubbed) > 0 {
		// Names only: the answer held the value, which the sandbox was
		// not given (inject's scrub.go).
		b.log.Warn("boundary: a secret's host sent a secret back; the sandbox was given its marker", "principal", b.cfg.Principal, "host", a.dest.Host, "secrets", r.Scrubbed)
	}
	f.end()
	a.secrets = r.Used
	b.logFlow(a, r.Out, r.In)
	return true, nil, nil
}

// splice copies both ways until the far side is done, then resets the
// sandbox's side once it has everything. A half-close from the sandbox is
// passed on to the far side; a half-close from the far side is not passed
// to the sandbox (that would be a FIN). prefix is what the sandbox sent
// already, first what the far side did.
func (b *Boundary) splice(f *flow, far net.Conn, prefix, first []byte) (out, in int64) {
	if len(prefix) > 0 {
		if _, err := far.Write(prefix); err != nil {
			f.abort()
			return 0, 0
		}
	}
	if len(first) > 0 {
		if _, err := f.c.Write(first); err != nil {
			f.abort()
			return int64(len(prefix)), 0
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := b.copyOut(far, f.c) // sandbox → far
		out = int64(len(prefix)) + n
		if err != nil {
			f.abort()
			return
		}
		if cw, ok := far.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	in, _ = b.copyIn(f.c, far) // far → sandbox
	in += int64(len(first))
	f.end()
	<-done
	return out, in
}

// serveTransparent takes a connection the node redirected: one to a
// synthetic address, which names the destination, or one made to an
// address itself (the node's firewall sends every TCP connection leaving
// a sandbox here), decided on that address as a SOCKS5 CONNECT to it is:
// an exact-IP grant of the policy, the sandbox's own rules, the address
// guard. So an address a program dials is a flow in its egress log, not
// a packet dropped unseen.
func (b *Boundary) serveTransparent(c net.Conn) {
	f := b.track(c, true)
	if f == nil {
		return
	}
	defer b.untrack(f)
	dst, err := tcpsock.OriginalDst(c)
	name, ok := "", false
	switch {
	case err != nil:
	case b.synth.Contains(dst.Addr()):
		name, ok = b.synth.Lookup(dst.Addr())
	case !tcpsock.Redirected(c, dst):
		// Not redirected: this port addressed itself, which names nothing.
	default:
		name, ok = dst.Addr().Unmap().String(), true
	}
	if !ok {
		b.countFlow(routeTransparentUnknown, outRefused)
		if err == nil {
			b.refused(api.RefusedUnknownAddress, dst.Addr().String(), "no name was answered with this address")
		}
		b.log.Debug("boundary transparent flow to an unknown address refused", "principal", b.cfg.Principal, "dst", dst, "err", err)
		b.logFlow(&admission{route: routeTransparentUnknown, out: outRefused, start: time.Now(), host: dst.Addr().String(), port: dst.Port(),
			err: errors.New("no name was answered with this address")}, 0, 0)
		f.abort()
		return
	}
	a := b.admit(f, name, dst.Port())
	if a.out != outAllowed {
		f.abort()
		return
	}
	b.run(f, &a, nil)
}
