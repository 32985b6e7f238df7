// Package handshake is a boundary's side of a connection while a proxy
// handshake (SOCKS5, HTTP CONNECT) is read from it: buffered reads,
// writes held until the client must be answered.
package handshake

import (
	"io"
	"net"
)

// New is c's side for a handshake.
func New(c net.Conn) *Conn { return &Conn{c: c} }

// Conn is the sandbox's side during a handshake: reads are
// buffered (a SOCKS5 greeting and request arrive in one read when the
// client sends them together, instead of a read(2) per field), and writes
// are held until the handshake must wait for the client, or Flush, so a
// method selection and the reply that follows it leave in one write(2)
// when the client did not wait for the first (strace of sam-box: six reads
// and two writes per refused flow before). What is buffered past the
// handshake is the flow's first bytes (rest), passed on, never dropped.
type Conn struct {
	c       net.Conn
	buf     [512]byte
	r, w    int
	pending []byte
	werr    error
}

// Peek is the next byte, not consumed.
func (h *Conn) Peek() (byte, error) {
	if h.r == h.w {
		if err := h.fill(); err != nil {
			return 0, err
		}
	}
	return h.buf[h.r], nil
}

// fill waits for more from the client, sending what it has been written
// first: the client may be waiting for it.
func (h *Conn) fill() error {
	if err := h.Flush(); err != nil {
		return err
	}
	if h.r == h.w {
		h.r, h.w = 0, 0
	}
	n, err := h.c.Read(h.buf[h.w:])
	h.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// Read reads what is buffered, or waits for more.
func (h *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if h.r == h.w {
		if err := h.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, h.buf[h.r:h.w])
	h.r += n
	return n, nil
}

// Write holds p until Flush or the next wait for the client.
func (h *Conn) Write(p []byte) (int, error) {
	if h.werr != nil {
		return 0, h.werr
	}
	h.pending = append(h.pending, p...)
	return len(p), nil
}

// Flush sends what was written.
func (h *Conn) Flush() error {
	if h.werr != nil || len(h.pending) == 0 {
		return h.werr
	}
	_, h.werr = h.c.Write(h.pending)
	h.pending = h.pending[:0]
	return h.werr
}

// Rest is what the client sent past the handshake, already read.
func (h *Conn) Rest() []byte {
	if h.r == h.w {
		return nil
	}
	return append([]byte(nil), h.buf[h.r:h.w]...)
}
