package placement

import (
	"fmt"
	"slices"
	"testing"
)

func names(cs []Candidate) string {
	s := ""
	for _, c := range cs {
		s += c.Name + " "
	}
	return s
}

// TestOrder: the most headroom goes first, counting what starting
// sandboxes are promised; ties go by name; lost nodes are never tried;
// nodes without headroom are tried last.
func TestOrder(t *testing.T) {
	for _, tc := range []struct {
		in   []Candidate
		want string
	}{
		{nil, ""},
		{[]Candidate{{Name: "a", AvailableMiB: 1000, ReserveMiB: 256}, {Name: "b", AvailableMiB: 2000, ReserveMiB: 256}}, "b a "},
		// b has more free, but a 1 GiB start not yet filled is b's.
		{[]Candidate{{Name: "a", AvailableMiB: 1500, ReserveMiB: 256}, {Name: "b", AvailableMiB: 2000, ReserveMiB: 256, PromisedMiB: 1024}}, "a b "},
		{[]Candidate{{Name: "b", AvailableMiB: 900}, {Name: "a", AvailableMiB: 900}}, "a b "},
		{[]Candidate{{Name: "a", AvailableMiB: 9000, Lost: true}, {Name: "b", AvailableMiB: 10}}, "b "},
		{[]Candidate{{Name: "tight", AvailableMiB: 300, ReserveMiB: 500}, {Name: "roomy", AvailableMiB: 600, ReserveMiB: 500}}, "roomy tight "},
		{[]Candidate{{Name: "x", Lost: true}}, ""},
	} {
		if got := names(Order(tc.in)); got != tc.want {
			t.Errorf("Order(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestOrderExhaustive: over every combination of three nodes' headroom
// (including none) and lost flags, Order keeps exactly the nodes not
// lost, each headroom at least the next's, and never reorders equals
// against their names.
func TestOrderExhaustive(t *testing.T) {
	vals := []int64{-100, 0, 100, 500}
	for _, a := range vals {
		for _, b := range vals {
			for _, c := range vals {
				for lost := 0; lost < 8; lost++ {
					in := []Candidate{
						{Name: "a", AvailableMiB: a, Lost: lost&1 != 0},
						{Name: "b", AvailableMiB: b, Lost: lost&2 != 0},
						{Name: "c", AvailableMiB: c, Lost: lost&4 != 0},
					}
					out := Order(in)
					want := 0
					for _, x := range in {
						if !x.Lost {
							want++
						}
					}
					if len(out) != want {
						t.Fatalf("%v: %d out, want %d", in, len(out), want)
					}
					for i := 1; i < len(out); i++ {
						p, q := out[i-1], out[i]
						if p.Headroom() < q.Headroom() || (p.Headroom() == q.Headroom() && p.Name > q.Name) {
							t.Fatalf("%v: order %s", in, fmt.Sprint(names(out)))
						}
					}
					for _, x := range out {
						if x.Lost {
							t.Fatalf("%v: lost node %s placed", in, x.Name)
						}
					}
				}
			}
		}
	}
}

// TestForMove: a sandbox leaving a node never goes back to it, nor to a
// lost or draining node; the rest by headroom.
func TestForMove(t *testing.T) {
	cs := []Candidate{
		{Name: "a", AvailableMiB: 9000},
		{Name: "b", AvailableMiB: 4000, ReserveMiB: 1000},
		{Name: "c", AvailableMiB: 8000, Draining: true},
		{Name: "d", AvailableMiB: 7000, Lost: true},
		{Name: "e", AvailableMiB: 5000, PromisedMiB: 500},
	}
	var got []string
	for _, c := range ForMove(cs, "a") {
		got = append(got, c.Name)
	}
	if want := []string{"e", "b"}; !slices.Equal(got, want) {
		t.Fatalf("ForMove from a: %v, want %v", got, want)
	}
	if got := ForMove(cs[:1], "a"); len(got) != 0 {
		t.Fatalf("a fleet of one has nowhere to move to: %v", got)
	}
	// Draining is left out of Order too: a drained node takes no creates.
	for _, c := range Order(cs) {
		if c.Name == "c" {
			t.Fatal("Order placed on a draining node")
		}
	}
}
