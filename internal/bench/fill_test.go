package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
)

// fakeMaster answers creates: the first refuse of each name get 503 with
// Retry-After retry, then 201.
func fakeMaster(t *testing.T, refuse int, retry string) (*client.Client, func(name string) []time.Time) {
	t.Helper()
	var mu sync.Mutex
	seen := map[string][]time.Time{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req api.SandboxRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		seen[req.Name] = append(seen[req.Name], time.Now())
		n := len(seen[req.Name])
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n <= refuse {
			if retry != "" {
				w.Header().Set("Retry-After", retry)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"code": "unavailable", "message": "node short on memory"}`))
			return
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Sandbox{ID: "id-" + req.Name, Name: req.Name})
	}))
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "tok")
	c.HTTP = srv.Client()
	return c, func(name string) []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time{}, seen[name]...)
	}
}

// TestFillerRetriesAsTold: each create refused with 503 is tried again
// after the answer's Retry-After (not sooner), every 503 is reported, and
// every create ends made; Done sees each once.
func TestFillerRetriesAsTold(t *testing.T) {
	c, tries := fakeMaster(t, 2, "1")
	done := map[int]Answer{}
	refusals := 0
	f := &Filler{Client: c, Parallel: 3, Count: 3,
		Request: func(i int) api.SandboxRequest {
			return api.SandboxRequest{Template: "web", Name: fmt.Sprintf("s%d", i)}
		},
		Refused: func(int, time.Duration) { refusals++ },
		Done:    func(i int, a Answer) bool { done[i] = a; return false }}
	f.Run(context.Background())
	if len(done) != 3 || refusals != 6 {
		t.Fatalf("done %v, %d refusals (want 3 made after 2 refusals each)", done, refusals)
	}
	for i, a := range done {
		if a.Err != nil || a.Refusals != 2 || a.Sandbox.Name != fmt.Sprintf("s%d", i) {
			t.Errorf("create %d: %+v", i, a)
		}
		ts := tries(fmt.Sprintf("s%d", i))
		for k := 1; k < len(ts); k++ {
			if gap := ts[k].Sub(ts[k-1]); gap < time.Second {
				t.Errorf("create %d tried again %v after a 503 that said Retry-After: 1", i, gap)
			}
		}
	}
}

// TestFillerGivesUp: a create refused more than MaxRefusals times gives
// up (GaveUp, the 503 its error), and Done can stop the fill.
func TestFillerGivesUp(t *testing.T) {
	c, _ := fakeMaster(t, 100, "0")
	var answers []Answer
	f := &Filler{Client: c, Parallel: 1, Count: 10, MaxRefusals: 3,
		Request: func(i int) api.SandboxRequest {
			return api.SandboxRequest{Template: "web", Name: fmt.Sprintf("g%d", i)}
		},
		Done: func(i int, a Answer) bool {
			answers = append(answers, a)
			return len(answers) == 2 // stop after two
		}}
	f.Run(context.Background())
	if len(answers) != 2 {
		t.Fatalf("%d answers after Done said stop at 2", len(answers))
	}
	for _, a := range answers {
		if !a.GaveUp || a.Refusals != 4 || client.StatusOf(a.Err) != http.StatusServiceUnavailable {
			t.Errorf("a create refused every time: %+v", a)
		}
	}
}

// TestFillerAgainDecides: Again is asked after each 503 and its false
// gives the create up at once, before MaxRefusals; its true tries again.
func TestFillerAgainDecides(t *testing.T) {
	c, tries := fakeMaster(t, 100, "0")
	asked := 0
	var got Answer
	f := &Filler{Client: c, Parallel: 1, Count: 1, MaxRefusals: 50,
		Request: func(i int) api.SandboxRequest { return api.SandboxRequest{Template: "web", Name: "a"} },
		Again: func(_ int, a Answer) bool {
			asked++
			return a.Refusals < 3 // something still starting twice, then not
		},
		Done: func(_ int, a Answer) bool { got = a; return false }}
	f.Run(context.Background())
	if !got.GaveUp || got.Refusals != 3 || asked != 3 || len(tries("a")) != 3 {
		t.Errorf("given up after %d refusals, Again asked %d times, %d tries: %+v", got.Refusals, asked, len(tries("a")), got)
	}
}
