package ingress

import (
	"net/netip"
	"sync"
	"time"
)

// DNSLimit is response rate limiting for the fleet's DNS over UDP, after
// BIND's RRL (ARM, "Response Rate Limiting"): a UDP question's source can
// be forged, so an authoritative server open to the internet can be made
// to send its answers at a victim. Each client network (an IPv4 /24, an
// IPv6 /56, BIND's defaults) gets Rate answers a second of each kind: the
// same name and type, or any error (NXDOMAIN, REFUSED, …) together, so a
// flood of made-up names shares one allowance. Past it, every Slip-th
// answer goes as an empty truncated one, which a real client retries over
// TCP (where the source cannot be forged, so TCP is never limited), and
// the rest are dropped. A busy resolver asking for many names is not
// slowed: each name has its own allowance.
type DNSLimit struct {
	// Rate is the answers a second per client network and kind; Burst is
	// how many may come at once (the bucket's size).
	Rate, Burst float64
	// Slip: every Slip-th answer over the rate is sent truncated (0:
	// none; 1: all).
	Slip int
	// Max bounds the allowances kept; past it, clients not already known
	// share one, so a flood of forged sources cannot grow memory.
	Max int

	mu       sync.Mutex
	buckets  map[limitKey]*limitBucket
	overflow limitBucket
	swept    time.Time // when full allowances were last forgotten
}

// limitKey is an allowance: a client network and the kind of answer.
type limitKey struct {
	net  netip.Prefix
	kind string
}

type limitBucket struct {
	tokens float64
	at     time.Time
	over   int // answers over the rate since it was last within it
}

// limitVerdict is what becomes of an answer.
type limitVerdict int

const (
	limitSend limitVerdict = iota
	limitSlip              // send an empty truncated answer instead
	limitDrop
)

// limitPrefix is the client network of addr (BIND's default lengths).
func limitPrefix(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	bits := 56
	if addr.Is4() {
		bits = 24
	}
	p, _ := addr.Prefix(bits)
	return p
}

// decide spends from the allowance of (client's network, kind) at now.
func (l *DNSLimit) decide(client netip.Addr, kind string, now time.Time) limitVerdict {
	if l == nil || l.Rate <= 0 {
		return limitSend
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(limitKey{limitPrefix(client), kind}, now)
	if b.at.IsZero() {
		b.tokens, b.at = l.Burst, now
	}
	b.tokens = min(l.Burst, b.tokens+now.Sub(b.at).Seconds()*l.Rate)
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		b.over = 0
		return limitSend
	}
	b.over++
	if l.Slip > 0 && b.over%l.Slip == 0 {
		return limitSlip
	}
	return limitDrop
}

// bucket is key's allowance, made if there is room; else, after
// forgetting allowances full again (idle long enough to have refilled:
// forgetting them changes nothing), the shared one. Called with l.mu.
func (l *DNSLimit) bucket(key limitKey, now time.Time) *limitBucket {
	if b, ok := l.buckets[key]; ok {
		return b
	}
	if l.buckets == nil {
		l.buckets = map[limitKey]*limitBucket{}
	}
	if len(l.buckets) >= max(l.Max, 1) {
		// At most once a refill: a flood of new sources against a full
		// table must not cost a sweep each.
		refill := time.Duration(l.Burst / l.Rate * float64(time.Second))
		if now.Sub(l.swept) >= refill {
			l.swept = now
			for k, b := range l.buckets {
				if now.Sub(b.at) >= refill {
					delete(l.buckets, k)
				}
			}
		}
		if len(l.buckets) >= max(l.Max, 1) {
			return &l.overflow
		}
	}
	b := &limitBucket{}
	l.buckets[key] = b
	return b
}
