// Package fullduplex makes a proxy's full-duplex forwarding safe to end:
// with http.ResponseController.EnableFullDuplex, a ReverseProxy's
// transport goes on reading the request's body in a goroutine of its own
// when the upstream answered before it read all of it (a sandbox's
// server that answers early), and net/http's server reads the same
// connection for the next request once the handler returns: two reads at
// once panic ("invalid concurrent Body.Read call") in the transport's
// goroutine, where nothing recovers it, and the whole daemon died of one
// client's chunked body (fullduplex_test.go). And a full-duplex handler
// that returns before its body was read to the end (the upstream failed
// first) makes the server read the rest after it, which starts a read in
// the background, and then read the next request over that one: the
// same panic, recovered by net/http this time (golang/go#68560). Such an
// answer closes its connection.
package fullduplex

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// Body is a request's body as a proxy forwards it.
type Body struct {
	w       http.ResponseWriter
	r       *http.Request
	rc      io.ReadCloser
	mu      sync.Mutex
	stopped bool
	eof     bool
	left    int64 // of a Content-Length body, the bytes not read yet (-1: unknown)
	reading int
	wg      sync.WaitGroup
	closing bool // Guard set "Connection: close" on the answer
}

// Guard makes w full duplex and replaces r's body with one that Stop
// ends. Give Respond to the proxy as its ModifyResponse (or call it from
// there), and defer Stop.
func Guard(w http.ResponseWriter, r *http.Request) *Body {
	// HTTP/2 is full duplex already: the error is ignored.
	http.NewResponseController(w).EnableFullDuplex()
	// HTTP/2 reads each stream's body apart from the connection: only
	// HTTP/1 has the hazard. A body of length 0 is never read (the proxy
	// sends none), and may be a wrapper of http.NoBody: taken for unread,
	// every such request (a GET, a unary call with an empty message)
	// closed its connection, and the next paid a new TCP and TLS
	// handshake (bench/fleet --part envd: 22 connections for 24 calls).
	b := &Body{w: w, r: r, rc: r.Body, eof: r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 || r.ProtoMajor != 1, left: r.ContentLength}
	if !b.eof {
		r.Body = b
		// Until the body is known read whole, any answer, an error the
		// caller writes included, closes the connection; Respond and
		// Stop take it back once it is.
		w.Header().Set("Connection", "close")
		b.closing = true
	}
	return b
}

// Respond keeps the connection for the next request when the body was
// read to its end by the time the answer starts. An answer that comes
// before keeps Guard's "Connection: close": the server then reads no
// further request from it while the transport may still be reading this
// body.
func (b *Body) Respond(*http.Response) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keepAliveIfRead()
	return nil
}

// keepAliveIfRead takes back Guard's "Connection: close" once the body
// was read whole: the connection is then safe to serve the next request.
// The caller holds b.mu.
func (b *Body) keepAliveIfRead() {
	if b.eof && b.closing {
		b.w.Header().Del("Connection")
		b.closing = false
	}
}

// Stop refuses further reads, cuts one under way (a read deadline in
// the past on the connection) and waits for it, and gives the request
// its own body back (a caller may send a body nobody read again). Call
// it before the handler returns.
func (b *Body) Stop() {
	b.mu.Lock()
	b.stopped = true
	reading := b.reading
	b.mu.Unlock()
	if reading > 0 {
		http.NewResponseController(b.w).SetReadDeadline(time.Unix(1, 0))
	}
	b.wg.Wait()
	b.mu.Lock()
	b.keepAliveIfRead()
	b.mu.Unlock()
	if b.r.Body == b {
		b.r.Body = b.rc
	}
}

// Read implements io.Reader.
func (b *Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return 0, io.ErrUnexpectedEOF
	}
	b.reading++
	b.wg.Add(1)
	b.mu.Unlock()
	n, err := b.rc.Read(p)
	b.mu.Lock()
	b.reading--
	if b.left > 0 {
		b.left -= int64(n)
	}
	// A body of known length is whole once that many bytes are read,
	// whether or not the transport has asked for its EOF yet.
	b.eof = b.eof || errors.Is(err, io.EOF) || b.left == 0
	b.mu.Unlock()
	b.wg.Done()
	return n, err
}

// Close is the transport's: the server closes the body itself.
func (b *Body) Close() error { return nil }
