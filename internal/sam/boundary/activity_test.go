package boundary

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

// fakeActivity records what a boundary tells its node.
type fakeActivity struct {
	touches, thaws, busy atomic.Int64
	thawErr              atomic.Pointer[error]
}

func (a *fakeActivity) Touch()         { a.touches.Add(1) }
func (a *fakeActivity) Busy(delta int) { a.busy.Add(int64(delta)) }
func (a *fakeActivity) Thaw(context.Context) error {
	a.thaws.Add(1)
	if p := a.thawErr.Load(); p != nil {
		return *p
	}
	return nil
}

// TestActivityTellsTheNode: an agent's mesh request is busy to its node
// from the moment it is forwarded until it is answered (a streamed answer
// included), every chunk of the answer is preceded by a thaw and a touch,
// and a sandbox that cannot be thawed gets no bytes (the flow ends) rather
// than bytes it cannot take.
func TestActivityTellsTheNode(t *testing.T) {
	act := &fakeActivity{}
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) { c.Activity = act })
	c := e.httpClient(t)
	resp, err := c.Post("http://mesh.sam.alt/v1/chat/completions?stream=1", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}
	if got := act.busy.Load(); got != 1 {
		t.Errorf("busy while the answer streams: %d, want 1", got)
	}
	if act.thaws.Load() == 0 || act.touches.Load() == 0 {
		t.Errorf("an answer's first bytes went in with %d thaws, %d touches", act.thaws.Load(), act.touches.Load())
	}
	for range 3 {
		e.mesh.release <- struct{}{}
	}
	rest, _ := readAll(br)
	resp.Body.Close()
	if !strings.Contains(rest, "[DONE]") {
		t.Fatalf("the stream ended without [DONE]: %q", rest)
	}
	testenv.WaitFor(t, 5*time.Second, "busy back to 0 once answered", func() bool { return act.busy.Load() == 0 })

	// A sandbox the node cannot thaw takes no bytes: the request fails.
	thawFailed := errors.New("no room to resume")
	act.thawErr.Store(&thawFailed)
	c2 := e.httpClient(t)
	if resp, err := c2.Get("http://mesh.sam.alt/v1/models"); err == nil {
		resp.Body.Close()
		t.Errorf("an answer went into a sandbox that could not be thawed: %s", resp.Status)
	}
	testenv.WaitFor(t, 5*time.Second, "busy back to 0 after the failed answer", func() bool { return act.busy.Load() == 0 })
}

func readAll(br *bufio.Reader) (string, error) {
	var sb strings.Builder
	_, err := br.WriteTo(&sb)
	return sb.String(), err
}

// TestSubscriptionIsNotBusy: a GET that asks for an event stream (an MCP
// client's standalone stream, kept open for a whole session) is not an
// answer its agent waits on: open, it does not keep the sandbox busy,
// though what comes on it still touches and thaws it.
func TestSubscriptionIsNotBusy(t *testing.T) {
	act := &fakeActivity{}
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) { c.Activity = act })
	req, _ := http.NewRequest(http.MethodGet, "http://mesh.sam.alt/v1/chat/completions?stream=1", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := e.httpClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}
	if got := act.busy.Load(); got != 0 {
		t.Errorf("an open subscription is busy: %d", got)
	}
	if act.thaws.Load() == 0 {
		t.Error("an event went into the sandbox without a thaw")
	}
	for range 3 {
		e.mesh.release <- struct{}{}
	}
}
