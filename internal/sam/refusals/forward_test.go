package refusals

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// TestForward: reports go to sam-node's path as POSTs naming no
// principal; a receiver that fails keeps nothing from being counted — the
// report is merged back and its refusals arrive, once, with the next;
// one that hangs costs a call its deadline, not the sender; an interval
// with no refusal sends nothing.
func TestForward(t *testing.T) {
	var mu sync.Mutex
	var got []api.RefusalReport
	var calls, fail atomic.Int64
	fail.Store(2) // the first two calls fail
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != api.SAMRefusalsPath || r.Header.Get("X-Sam-Principal") != "" {
			t.Errorf("%s %s principal %q", r.Method, r.URL.Path, r.Header.Get("X-Sam-Principal"))
		}
		if fail.Add(-1) >= 0 {
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		var rep api.RefusalReport
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil || Check(rep) != nil {
			t.Errorf("report: %v / %v", err, Check(rep))
		}
		mu.Lock()
		got = append(got, rep)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	tb := NewTable(8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Forward(ctx, tb, 20*time.Millisecond, ToSAMNode(srv.Client(), srv.URL), "sam-node", nil)
	}()
	for i := 0; i < 5; i++ {
		tb.Add(name("agent-a", "example.com"))
	}
	testenv.WaitFor(t, 10*time.Second, "the refusals arrive after two failed calls", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	tb.Add(name("agent-a", "example.com"))
	testenv.WaitFor(t, 10*time.Second, "the next one arrives", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 1
	})
	n := calls.Load()
	// Quiet intervals send nothing: wait past several and count calls.
	quiet := time.Now().Add(200 * time.Millisecond)
	testenv.WaitFor(t, 5*time.Second, "200 ms pass", func() bool { return time.Now().After(quiet) })
	if c := calls.Load(); c != n {
		t.Errorf("%d calls while nothing was refused", c-n)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].Rows[0].Count != 5 || got[1].Rows[0].Count != 1 {
		t.Errorf("received %+v; want 5 refusals once, then 1", got)
	}
}

// TestForwardDeadline: a receiver that never answers costs each call
// SendTimeout at most; the sender's loop goes on and stops with its
// context.
func TestForwardDeadline(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hang)
	var seen atomic.Int64
	send := func(ctx context.Context, rep api.RefusalReport) error {
		seen.Add(1)
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) > SendTimeout {
			t.Errorf("a call without the deadline (%v, %v)", dl, ok)
		}
		return ToSAMNode(srv.Client(), srv.URL)(ctx, rep)
	}
	tb := NewTable(8)
	tb.Add(name("agent-a", "example.com"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Forward(ctx, tb, 10*time.Millisecond, send, "sam-node", nil)
	}()
	testenv.WaitFor(t, 5*time.Second, "a call is under way", func() bool { return seen.Load() > 0 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Forward did not stop with its context while a call hung")
	}
	if tb.Len() != 1 {
		t.Errorf("the unsent refusal is not kept: %d rows", tb.Len())
	}
}
