// Package events carries what happens to sandboxes — creates, wakes,
// transitions, refusals, deletes — from the node that does it to whoever
// watches: the console's live view (server-sent events). Publishing never
// blocks the node: a watcher that falls behind loses events (and is told
// how many), the node never waits for it.
package events

import (
	"sync"
	"time"

	"sandstorm/api"
)

// Kinds of event.
const (
	Create     = "create"
	Wake       = "wake"
	Transition = "transition"
	Refusal    = "refusal"
	Delete     = "delete"
	// Update: a sandbox's details changed without a tier change (its
	// note); a watcher reads it again.
	Update = "update"
)

// Event is one thing that happened to a sandbox (api.Event, the wire
// type: the console's event stream and the node's reports carry it).
type Event = api.Event

// Hub keeps the last Keep events and fans new ones out to subscribers.
// The zero Hub is not usable; use New. A nil *Hub drops everything, so a
// node without watchers publishes at no cost.
type Hub struct {
	mu     sync.Mutex
	seq    uint64
	recent []Event // ring of the last keep, oldest first once full
	next   int
	keep   int
	subs   map[chan Event]*sub
}

type sub struct{ dropped uint64 }

// DefaultKeep is how many recent events a hub keeps for a new watcher.
const DefaultKeep = 500

// New makes a hub that keeps the last keep events (DefaultKeep if ≤ 0).
func New(keep int) *Hub {
	if keep <= 0 {
		keep = DefaultKeep
	}
	return &Hub{keep: keep, subs: map[chan Event]*sub{}}
}

// Publish records e (numbering and timing it) and offers it to every
// subscriber without waiting.
func (h *Hub) Publish(e Event) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	e.Seq = h.seq
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	if len(h.recent) < h.keep {
		h.recent = append(h.recent, e)
	} else {
		h.recent[h.next] = e
		h.next = (h.next + 1) % h.keep
	}
	for c, s := range h.subs {
		select {
		case c <- e:
		default:
			s.dropped++
		}
	}
}

// Seq is the number of the last event published (0: none yet).
func (h *Hub) Seq() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// Recent returns the kept events, oldest first.
func (h *Hub) Recent() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Event, 0, len(h.recent))
	out = append(out, h.recent[h.next:]...)
	return append(out, h.recent[:h.next]...)
}

// Subscribe returns the kept events and a channel of every later one
// (buffered by buf), and a cancel that ends the subscription and reports
// how many events the subscriber missed because it was too slow.
func (h *Hub) Subscribe(buf int) ([]Event, <-chan Event, func() uint64) {
	c := make(chan Event, buf)
	s := &sub{}
	h.mu.Lock()
	recent := make([]Event, 0, len(h.recent))
	recent = append(recent, h.recent[h.next:]...)
	recent = append(recent, h.recent[:h.next]...)
	h.subs[c] = s
	h.mu.Unlock()
	var once sync.Once
	var dropped uint64
	return recent, c, func() uint64 {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs, c)
			dropped = s.dropped
			h.mu.Unlock()
		})
		return dropped
	}
}
