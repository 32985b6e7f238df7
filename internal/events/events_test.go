package events

import (
	"testing"
)

// TestRingAndFanOut: a hub keeps only the last events, in order, hands
// them to a new subscriber, and offers later ones to every subscriber; a
// subscriber that does not read loses events (counted) and never blocks
// the publisher.
func TestRingAndFanOut(t *testing.T) {
	h := New(3)
	for i := 0; i < 5; i++ {
		h.Publish(Event{Kind: Wake, ID: string(rune('a' + i))})
	}
	r := h.Recent()
	if len(r) != 3 || r[0].ID != "c" || r[2].ID != "e" || r[2].Seq != 5 {
		t.Fatalf("recent = %+v", r)
	}
	past, live, cancel := h.Subscribe(1)
	if len(past) != 3 || past[0].ID != "c" {
		t.Fatalf("a new subscriber got %+v", past)
	}
	_, slow, cancelSlow := h.Subscribe(1)
	_ = slow
	h.Publish(Event{Kind: Create, ID: "f"})
	h.Publish(Event{Kind: Create, ID: "g"}) // slow's buffer is full: dropped there
	if e := <-live; e.ID != "f" || e.At.IsZero() {
		t.Errorf("live got %+v", e)
	}
	if d := cancelSlow(); d != 1 {
		t.Errorf("the slow subscriber missed %d, want 1", d)
	}
	cancel()
	h.Publish(Event{Kind: Delete}) // no subscriber left; must not block
	var nilHub *Hub
	nilHub.Publish(Event{Kind: Wake}) // a node without watchers
}
