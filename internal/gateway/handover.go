package gateway

import (
	"net"
	"sync"
	"time"
)

// Handing the gateway to the next process (issue 18 item 3: a reload of
// sandstormd, internal/handoff). The listeners stay open in the kernel
// throughout — the caller has stopped their accept loops without closing
// the sockets — so what the gateway must do is finish with the connections
// it accepted, the way an HTTP server's graceful shutdown does (Go's
// http.Server.Shutdown, nginx's graceful stop): answer every request in
// flight with "Connection: close" and close the connection after it, close
// HTTP connections idle between requests, and reset byte-for-byte ones,
// which cannot be drained (their protocol's message ends are unknown).

// listen opens a listener through cfg.Listen, if set.
func (g *Gateway) listen(network, address string) (net.Listener, error) {
	open := func() (net.Listener, error) { return net.Listen(network, address) }
	if g.cfg.Listen == nil {
		return open()
	}
	return g.cfg.Listen(network, address, open)
}

// HandoverResult says what Handover did.
type HandoverResult struct {
	// Answered is how many connections were busy when it began (being set
	// up, or with an HTTP request in flight); Cut how many of all were
	// closed unfinished when the wait ran out, or were byte-for-byte.
	Answered, Idle, Cut int
	// Took is how long it waited.
	Took time.Duration
}

// Handover prepares the gateway for the process to be replaced. The
// caller must first have kept its listening sockets for the next process
// (handoff.Registry.Pause, which also stops the accept loops; Handover
// closes the gateway's listeners again, and the Host-routed listener is
// the caller's to close) and waits for every accept loop to return, so no
// accepted connection is missed. Then:
// an HTTP connection between requests is closed at once; one with a
// request in flight, or still being set up (woken, dialled, its first
// bytes not yet seen), is waited for, at most wait, and its answer carries
// "Connection: close"; a byte-for-byte connection is reset. What is left
// after wait is reset. The gateway serves nothing afterwards.
func (g *Gateway) Handover(wait time.Duration) HandoverResult {
	start := time.Now()
	g.handover.Store(true)
	var res HandoverResult
	gates := g.gates()
	for _, sg := range gates {
		for _, l := range sg.listeners {
			l.Close() // already closed by the caller's pause; no harm
		}
		sg.mu.Lock()
		var cut []*pair
		for p := range sg.conns {
			switch {
			case p.busy:
				res.Answered++
			case p.http:
				res.Idle++
				cut = append(cut, p)
			default:
				res.Cut++
				cut = append(cut, p)
			}
		}
		sg.mu.Unlock()
		for _, p := range cut {
			sg.closePair(p)
		}
	}
	if !g.active.waitZero(wait) {
		for _, sg := range gates {
			sg.mu.Lock()
			conns := sg.snapshotConns()
			sg.mu.Unlock()
			res.Cut += len(conns)
			for _, p := range conns {
				sg.closePair(p)
			}
		}
		// A connection accepted but not yet admitted to a gate is not in
		// any gate's list; its handler sees the handover and ends.
		g.active.waitZero(time.Second)
	}
	res.Took = time.Since(start)
	return res
}

// activity counts goroutines, with a wait for none.
type activity struct {
	mu   sync.Mutex
	n    int
	zero *sync.Cond
}

func (a *activity) add(d int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.zero == nil {
		a.zero = sync.NewCond(&a.mu)
	}
	a.n += d
	if a.n == 0 {
		a.zero.Broadcast()
	}
}

// waitZero waits until the count is 0, at most limit; it reports whether
// it got there.
func (a *activity) waitZero(limit time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.zero == nil {
		a.zero = sync.NewCond(&a.mu)
	}
	expired := false
	t := time.AfterFunc(limit, func() {
		a.mu.Lock()
		expired = true
		a.zero.Broadcast()
		a.mu.Unlock()
	})
	defer t.Stop()
	for a.n > 0 && !expired {
		a.zero.Wait()
	}
	return a.n == 0
}
