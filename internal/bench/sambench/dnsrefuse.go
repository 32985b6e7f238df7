package sambench

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/ipv4"
)

// The cheapest refusal, and the one an agent meets first: a name its
// principal is not granted is answered NXDOMAIN by its boundary's DNS and
// never dialled (internal/sam/boundary dns.go). A flow refused over SOCKS5 costs
// a connection — accept, read, write, close — and so at least the seven
// syscalls a bare Go server spends on one (bench/results/box-2026-12-02-d397609:
// 25,700–28,600 per CPU-second here, the floor the 100,000 per core
// cannot get under); a refused name costs one datagram in and one out.

// dnsQuery is a standard query (RD set) for name, type A, with ID id.
func dnsQuery(id uint16, name string) []byte {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; QDCOUNT 1
	for len(name) > 0 {
		label := name
		if i := indexByte(name, '.'); i >= 0 {
			label, name = name[:i], name[i+1:]
		} else {
			name = ""
		}
		q = append(append(q, byte(len(label))), label...)
	}
	return append(q, 0, 0, 1, 0, 1) // root; QTYPE A; QCLASS IN
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// nxdomain reports whether b is a response to query id with RCODE 3.
func nxdomain(b []byte, id uint16) bool {
	return len(b) >= 12 && binary.BigEndian.Uint16(b) == id && b[2]&0x80 != 0 && b[3]&0x0f == 3
}

// dnsRefuse asks server (udp ip:port) for a name the policy does not grant
// from socks sockets for d, each keeping window queries in flight and
// sending and reading them in batches (sendmmsg, recvmmsg: x/net/ipv4), so
// that the client spends less per query than the server and the server's
// queue is never empty — its CPU per answer is then its cost, not its cost
// plus a wake-up per datagram. It returns the NXDOMAIN answers, the
// queries that got none within a timeout or a wrong one, and the time
// taken.
func dnsRefuse(ctx context.Context, server string, socks, window int, d time.Duration) (ok, lost int64, took time.Duration) {
	var nOK, nLost atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	for s := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("udp4", server)
			if err != nil {
				nLost.Add(int64(window))
				return
			}
			defer c.Close()
			pc := ipv4.NewPacketConn(c.(*net.UDPConn))
			// Every query of this socket has the same ID and name: an
			// answer is matched by its ID and counted once per datagram.
			id := uint16(0x5300 + s)
			q := dnsQuery(id, "denied.example")
			out := make([]ipv4.Message, window)
			in := make([]ipv4.Message, window)
			for i := range out {
				out[i].Buffers = [][]byte{q}
				in[i].Buffers = [][]byte{make([]byte, 512)}
			}
			send := func(n int) bool {
				for sent := 0; sent < n; {
					k, err := pc.WriteBatch(out[:n-sent], 0)
					if err != nil {
						nLost.Add(int64(n - sent))
						return false
					}
					sent += k
				}
				return true
			}
			inFlight := window
			if !send(window) {
				return
			}
			for {
				select {
				case <-stop:
					return // what is still in flight is neither
				default:
				}
				c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				k, err := pc.ReadBatch(in, 0)
				if err != nil {
					if ne, isNet := err.(net.Error); isNet && ne.Timeout() {
						// The lost are lost (a full socket buffer drops
						// datagrams): count them and fill the window again.
						nLost.Add(int64(inFlight))
						inFlight = 0
						if !send(window) {
							return
						}
						inFlight = window
						continue
					}
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						nLost.Add(int64(inFlight))
						return
					}
				}
				for i := 0; i < k; i++ {
					if nxdomain(in[i].Buffers[0][:in[i].N], id) {
						nOK.Add(1)
					} else {
						nLost.Add(1)
					}
				}
				inFlight -= k
				if !send(k) {
					return
				}
				inFlight += k
			}
		}()
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	close(stop)
	took = time.Since(t0)
	wg.Wait()
	return nOK.Load(), nLost.Load(), took
}
