package ingress

import (
	"net"
	"sync"
	"sync/atomic"
)

// relay copies a to b and b to a until both directions have ended, each
// end's close passed on as a half close, then closes both.
//
// By read and write through buffers, not the splice(2) io.Copy would use
// between two TCP connections: on this machine (Linux 6.18 guest), 100
// MiB through a relay on loopback took 115–121 ms by splice and 63–83 ms
// by copy, against 60–73 ms straight (p50 of 21, three runs).
func relay(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		copyConn(b, a)
		closeWrite(b)
	}()
	copyConn(a, b)
	closeWrite(a)
	wg.Wait()
	a.Close()
	b.Close()
}

const (
	// relayBuffer is what each direction of a passed connection reads
	// into at first, and while its reads come back short of it.
	relayBuffer = 64 << 10
	// relayBulkBuffer is what a direction reads into while a read fills
	// relayBuffer (a transfer in bulk): fewer, larger reads and writes
	// cost the relay less per byte. In bench/nshop's A/B runs (12-07,
	// both sizes in the same rounds, six runs of 24 rounds with the
	// relays' links swapped halfway) 1 MiB took about 0.07 × off 100 MiB
	// down and 0.045 × off up, and 7 % of the relay's CPU, against 64
	// KiB; 256 KiB did a little less, 4 MiB little more.
	relayBulkBuffer = 1 << 20
)

// bulkBuffers are the relayBulkBuffer buffers, shared by every passed
// connection: one is held only while its direction moves data in bulk,
// so a thousand idle connections hold a thousand small buffers, not a
// gigabyte.
var bulkBuffers = sync.Pool{New: func() any { b := make([]byte, relayBulkBuffer); return &b }}

// bulkHeld counts the bulk buffers held now (for tests).
var bulkHeld atomic.Int64

// copyConn copies src to dst until src ends or either fails: through a
// buffer of relayBuffer bytes, or of relayBulkBuffer from the pool from
// a read that filled the small one until a read comes back shorter than
// the small one again. The wrappers of io.Copy are not used: they would
// splice.
func copyConn(dst, src net.Conn) {
	small := make([]byte, relayBuffer)
	buf := small
	var bulk *[]byte
	defer func() {
		if bulk != nil {
			bulkHeld.Add(-1)
			bulkBuffers.Put(bulk)
		}
	}()
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF: the caller passes the close on
		}
		switch {
		case bulk == nil && n == len(small):
			bulk = bulkBuffers.Get().(*[]byte)
			bulkHeld.Add(1)
			buf = *bulk
		case bulk != nil && n < len(small):
			bulkHeld.Add(-1)
			bulkBuffers.Put(bulk)
			bulk, buf = nil, small
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
