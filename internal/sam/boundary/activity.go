package boundary

import (
	"context"
	"io"
	"net"
	"time"
)

// Activity is the node's side of a sandbox's use of its way out. The
// gateway tells the node of every byte coming in (gateway.Waker), and the
// idle timers and the memory guard rank sandboxes by it; an agent at work
// mostly calls out — a model, a tool, a package index — with nothing
// coming in, and without this it looked idle while it worked: frozen under
// its own call, or pushed to disk by the memory guard in the middle of its
// traffic (sam-bench agents, bench/results/agents-2026-12-03-86aff15: two
// agents checkpointed mid-push, 702 requests cut). So the boundary tells
// the node what the gateway would:
//   - Touch when a flow is admitted and whenever bytes move either way on
//     it, so a sandbox calling out is as active as one being called;
//   - Busy(+1) while a mesh request is in flight and Busy(-1) once it is
//     answered: an agent waiting on a model's answer is waiting, not idle,
//     and a sandbox is never tiered under a request it waits on (as an
//     envd command keeps it hot). An opaque flow (a TLS connection to an
//     allowed name) is not busy for being open — an idle keep-alive or an
//     event stream would keep a sandbox hot for ever — only active while
//     bytes move;
//   - Thaw before bytes from the far side go into the sandbox: one frozen
//     while an answer was on its way is resumed first, as the gateway
//     thaws one for bytes coming in. Thaw does not restore: a sandbox that
//     went to disk had its flows reset (CloseFlows), so nothing waits.
type Activity interface {
	Touch()
	Busy(delta int)
	Thaw(ctx context.Context) error
}

// thawTimeout bounds a Thaw: a resume takes ~10 ms (README, "Numbers"),
// and a wake the node cannot start in 2 s is refused (--wake-admission).
const thawTimeout = 5 * time.Second

func (b *Boundary) touch() {
	if a := b.cfg.Activity; a != nil {
		a.Touch()
	}
}

// busy marks a request in flight until the returned func is called.
func (b *Boundary) busy() func() {
	a := b.cfg.Activity
	if a == nil {
		return func() {}
	}
	a.Touch()
	a.Busy(1)
	return func() { a.Busy(-1); a.Touch() }
}

// intoSandbox is a writer to the sandbox's side of a flow that touches,
// and thaws the sandbox, before every write.
type intoSandbox struct {
	b *Boundary
	c net.Conn
}

func (w intoSandbox) Write(p []byte) (int, error) {
	if a := w.b.cfg.Activity; a != nil {
		a.Touch()
		ctx, cancel := context.WithTimeout(context.Background(), thawTimeout)
		err := a.Thaw(ctx)
		cancel()
		if err != nil {
			return 0, err
		}
	}
	return w.c.Write(p)
}

// fromSandbox is the sandbox's side of a flow as a reader that touches
// after every read that moved bytes.
type fromSandbox struct {
	b *Boundary
	c net.Conn
}

func (r fromSandbox) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	if n > 0 {
		r.b.touch()
	}
	return n, err
}

// copyOut and copyIn are splice's two directions. Without an Activity
// they are plain io.Copy (splice(2) where both ends are sockets); with
// one, a user-space copy that tells the node of each chunk.
func (b *Boundary) copyOut(far, sandbox net.Conn) (int64, error) {
	if b.cfg.Activity == nil {
		return io.Copy(far, sandbox)
	}
	return io.CopyBuffer(onlyWriter{far}, fromSandbox{b, sandbox}, make([]byte, 32<<10))
}

func (b *Boundary) copyIn(sandbox, far net.Conn) (int64, error) {
	if b.cfg.Activity == nil {
		return io.Copy(sandbox, far)
	}
	return io.CopyBuffer(intoSandbox{b, sandbox}, onlyReader{far}, make([]byte, 32<<10))
}

// onlyWriter and onlyReader hide ReaderFrom/WriterTo, so io.CopyBuffer
// goes through the wrappers above rather than around them.
type onlyWriter struct{ io.Writer }
type onlyReader struct{ io.Reader }

// activeConn is the sandbox's side of a flow whose bytes the boundary
// reads and writes itself (a secret's flow, inject.Set.Serve): a read
// touches and a write touches and thaws, as splice's copies do, so a long
// answer through it keeps the sandbox awake.
type activeConn struct {
	net.Conn
	b *Boundary
}

func (c activeConn) Read(p []byte) (int, error)  { return fromSandbox{c.b, c.Conn}.Read(p) }
func (c activeConn) Write(p []byte) (int, error) { return intoSandbox{c.b, c.Conn}.Write(p) }
