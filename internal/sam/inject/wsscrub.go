package inject

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// A WebSocket from a secret's host is scrubbed as an answer's body is
// (scrub.go): the server's frames are read, each message's data streamed
// through the same replacer (a value cut across frames is still found),
// and sent on re-framed, since a marker and its value differ in length.
// The boundary asks for no extension (permessage-deflate would hide the
// data), and a frame it cannot read — compressed or with any reserved
// bit, masked, a control frame too long — ends the connection (fail
// closed). What the sandbox sends is passed as it is. An upgrade to
// anything but a WebSocket is refused: it could not be read.
//
// Framing: RFC 6455 §5.2; a message may be cut into any fragments
// (§5.4), and control frames come between them.

const (
	wsFin        = 0x80
	wsReserved   = 0x70
	wsOpcode     = 0x0f
	wsMasked     = 0x80
	wsContinue   = 0x0
	wsControl    = 0x8 // opcodes from here on: close, ping, pong
	wsMaxControl = 125
)

// isWebSocket says whether req asks for a WebSocket.
func isWebSocket(req *http.Request) bool {
	return strings.EqualFold(req.Header.Get("Upgrade"), "websocket")
}

// wsFrame is one frame's head.
type wsFrame struct {
	fin bool
	op  byte
	n   uint64
}

func readWSHead(r *bufio.Reader) (wsFrame, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return wsFrame{}, err
	}
	f := wsFrame{fin: h[0]&wsFin != 0, op: h[0] & wsOpcode, n: uint64(h[1] &^ wsMasked)}
	switch {
	case h[0]&wsReserved != 0:
		return f, errors.New("the server sent a frame with a reserved bit set (compressed or extended), which the boundary cannot read to keep the secret out")
	case h[1]&wsMasked != 0:
		return f, errors.New("the server sent a masked frame (RFC 6455 §5.1 forbids it)")
	}
	var ext []byte
	switch f.n {
	case 126:
		ext = make([]byte, 2)
	case 127:
		ext = make([]byte, 8)
	}
	if ext != nil {
		if _, err := io.ReadFull(r, ext); err != nil {
			return f, unexpected(err)
		}
		f.n = binary.BigEndian.Uint64(append(make([]byte, 8-len(ext)), ext...))
	}
	if f.op >= wsControl && (f.n > wsMaxControl || !f.fin) {
		return f, fmt.Errorf("the server sent a control frame of %d bytes, or fragmented (RFC 6455 §5.5)", f.n)
	}
	return f, nil
}

func writeWSFrame(w io.Writer, fin bool, op byte, p []byte) error {
	head := make([]byte, 2, 10+len(p))
	head[0] = op
	if fin {
		head[0] |= wsFin
	}
	switch {
	case len(p) < 126:
		head[1] = byte(len(p))
	case len(p) <= 0xffff:
		head[1] = 126
		head = binary.BigEndian.AppendUint16(head, uint16(len(p)))
	default:
		head[1] = 127
		head = binary.BigEndian.AppendUint64(head, uint64(len(p)))
	}
	_, err := w.Write(append(head, p...))
	return err
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// scrubWS copies the server's frames from r to w with sc's values as
// their markers (sc: scrubs' answer); u hears of each. It returns at the
// server's end (nil at a frame's edge) or at the first frame it cannot
// read.
func scrubWS(w io.Writer, r *bufio.Reader, sc []Binding, u *usage) error {
	// One buffer for the connection's life: a chatty socket's small
	// messages would otherwise cost 32 KiB each.
	buf := make([]byte, 32<<10)
	for {
		f, err := readWSHead(r)
		switch {
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		case f.op >= wsControl:
			err = scrubControl(w, r, f, sc, u)
		case f.op == wsContinue:
			err = errors.New("the server continued a message it had not begun")
		default:
			err = scrubMessage(w, r, f, sc, u, buf)
		}
		if err != nil {
			return err
		}
	}
}

// scrubControl passes a control frame (a close's reason, a ping's data
// may quote the secret too).
func scrubControl(w io.Writer, r *bufio.Reader, f wsFrame, sc []Binding, u *usage) error {
	p := make([]byte, f.n)
	if _, err := io.ReadFull(r, p); err != nil {
		return unexpected(err)
	}
	p = []byte(scrubString(string(p), sc, u))
	if len(p) > wsMaxControl {
		return errors.New("a control frame of the server's is too long once scrubbed")
	}
	return writeWSFrame(w, true, f.op, p)
}

// scrubMessage passes one message, whose first frame's head is f, as
// fragments of what the replacer gives (read through buf), the last one
// final.
func scrubMessage(w io.Writer, r *bufio.Reader, f wsFrame, sc []Binding, u *usage, buf []byte) error {
	m := &wsMessage{r: r, w: w, sc: sc, u: u, left: f.n, fin: f.fin}
	rep := &replacer{src: io.NopCloser(m), bound: sc, used: u}
	op := f.op
	for {
		n, err := rep.Read(buf)
		switch {
		case err == io.EOF:
			return writeWSFrame(w, true, op, nil)
		case err != nil:
			return err
		}
		// The message's last data: sent as its final fragment.
		last := m.fin && m.left == 0 && len(rep.pending) == 0 && len(rep.out) == 0
		if err := writeWSFrame(w, last, op, buf[:n]); err != nil || last {
			return err
		}
		op = wsContinue
	}
}

// wsMessage reads one message's data across its fragments, passing the
// control frames between them on at once.
type wsMessage struct {
	r    *bufio.Reader
	w    io.Writer
	sc   []Binding
	u    *usage
	left uint64 // of the current frame's data
	fin  bool   // the current frame is the message's last
}

func (m *wsMessage) Read(p []byte) (int, error) {
	for m.left == 0 {
		if m.fin {
			return 0, io.EOF
		}
		f, err := readWSHead(m.r)
		switch {
		case err != nil:
			return 0, unexpected(err)
		case f.op >= wsControl:
			if err := scrubControl(m.w, m.r, f, m.sc, m.u); err != nil {
				return 0, err
			}
			continue
		case f.op != wsContinue:
			return 0, errors.New("the server began a message before it ended the last")
		}
		m.left, m.fin = f.n, f.fin
	}
	if uint64(len(p)) > m.left {
		p = p[:m.left]
	}
	n, err := m.r.Read(p)
	m.left -= uint64(n)
	return n, unexpected(err)
}
