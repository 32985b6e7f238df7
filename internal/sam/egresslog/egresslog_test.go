package egresslog

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"sandstorm/api"
)

// A log numbers its flows, keeps the newest bound of them, pages by seq
// and says how many a page missed to the bound.
func TestPages(t *testing.T) {
	l := New(3)
	if p := l.Page("a", 0, 0); len(p.Items) != 0 || p.Next != 0 {
		t.Errorf("an empty log: %+v", p)
	}
	for _, n := range []string{"one.test", "two.test"} {
		l.Add("a", api.EgressFlow{Name: n})
	}
	l.Add("b", api.EgressFlow{Name: "other.test"})
	p := l.Page("a", 0, 0)
	if len(p.Items) != 2 || p.Items[0].Seq != 1 || p.Items[1].Name != "two.test" || p.Next != 2 || p.Missed != 0 {
		t.Errorf("page of a: %+v", p)
	}
	if p := l.Page("b", 0, 0); len(p.Items) != 1 || p.Items[0].Seq != 1 {
		t.Errorf("b's log is its own: %+v", p)
	}
	for _, n := range []string{"three.test", "four.test", "five.test"} {
		l.Add("a", api.EgressFlow{Name: n})
	}
	p = l.Page("a", 0, 0)
	if len(p.Items) != 3 || p.Items[0].Seq != 3 || p.Items[2].Name != "five.test" || p.Missed != 2 || p.Next != 5 {
		t.Errorf("past the bound: %+v", p)
	}
	p = l.Page("a", 3, 1)
	if len(p.Items) != 1 || p.Items[0].Name != "four.test" || p.Next != 4 || p.Missed != 0 {
		t.Errorf("after 3, limit 1: %+v", p)
	}
	if p := l.Page("a", 5, 0); len(p.Items) != 0 || p.Next != 5 {
		t.Errorf("after the newest: %+v", p)
	}
	l.Drop("a")
	if p := l.Page("a", 0, 0); len(p.Items) != 0 {
		t.Errorf("a dropped log: %+v", p)
	}
}

// Wait returns once a flow after the given seq is there, and with ctx's
// error when none comes.
func TestWait(t *testing.T) {
	l := New(0)
	done := make(chan error, 1)
	go func() { done <- l.Wait(context.Background(), "a", 0) }()
	l.Add("a", api.EgressFlow{Name: "x.test"})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := l.Wait(ctx, "a", 1); err != context.DeadlineExceeded {
		t.Errorf("Wait with nothing new: %v", err)
	}
	go func() { done <- l.Wait(context.Background(), "a", 1) }()
	for waiting := 0; waiting == 0; runtime.Gosched() {
		l.mu.Lock()
		waiting = l.m["a"].waiting
		l.mu.Unlock()
	}
	l.Drop("a")
	if err := <-done; err != ErrDropped {
		t.Errorf("Wait on a log dropped meanwhile: %v, want ErrDropped", err)
	}
	var nilLogs *Logs
	if nilLogs.Recorder("a") != nil {
		t.Error("a nil Logs records")
	}
	nilLogs.Drop("a")
}

// A lookup's several DNS refusals of one name are one entry, and the name
// is logged again after RepeatEvery; flows of that name, other names and
// other sandboxes are not held back.
func TestDNSRefusalsOnce(t *testing.T) {
	l := New(10)
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	dns := func(id, name string, at time.Duration) {
		l.Add(id, api.EgressFlow{Time: t0.Add(at), Name: name, Route: api.EgressRouteDNS, Outcome: "denied"})
	}
	dns("a", "nowhere.test", 0)
	dns("a", "nowhere.test", time.Millisecond)                 // AAAA
	dns("a", "nowhere.test", 2*time.Second)                    // a retry
	l.Add("a", api.EgressFlow{Time: t0, Name: "nowhere.test"}) // a flow, by SOCKS5
	dns("a", "elsewhere.test", 0)
	dns("b", "nowhere.test", 0)
	dns("a", "nowhere.test", RepeatEvery+time.Second)
	var got []string
	for _, f := range l.Page("a", 0, 0).Items {
		got = append(got, f.Route+":"+f.Name)
	}
	want := []string{"dns:nowhere.test", ":nowhere.test", "dns:elsewhere.test", "dns:nowhere.test"}
	if !slices.Equal(got, want) {
		t.Errorf("log a %v, want %v", got, want)
	}
	if n := len(l.Page("b", 0, 0).Items); n != 1 {
		t.Errorf("log b has %d entries, want 1", n)
	}
}
