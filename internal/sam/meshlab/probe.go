package meshlab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
)

// MemberStatus is a member's own view (api.MemberStatus).
type MemberStatus = api.MemberStatus

// callTimeout bounds one probe call: a call that hangs is a failure at
// its deadline, not a stall of the probe.
const callTimeout = 5 * time.Second

func newGet(ctx context.Context, u string) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
}

// Call is a cross-node call: a chat completion of to's model through
// from's sam-node, as an agent's boundary sends it (its agent socket,
// X-Sam-Principal), answered by to's provider.
func (l *Lab) Call(ctx context.Context, from, to *Member) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"model": to.Model, "messages": []any{map[string]string{"role": "user", "content": "ping"}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mesh.sam.alt/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sam-Principal", Principal)
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", from.Socket)
		}}}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s → %s: %w", from.Name, to.Name, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte("echo: ping")) {
		return fmt.Errorf("%s → %s: %s %s", from.Name, to.Name, resp.Status, strings.TrimSpace(string(data)))
	}
	return nil
}

// Finds reports (nil) whether from, asking the routers now (past its
// cache: sam-node's admin GET /mesh/providers), finds to among the
// providers of to's model.
func (l *Lab) Finds(ctx context.Context, from, to *Member) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var found []struct {
		Peer string `json:"peer"`
	}
	if err := l.adminGet(ctx, from, "/mesh/providers?name="+url.QueryEscape("inference://"+to.Model), &found); err != nil {
		return err
	}
	if !slices.ContainsFunc(found, func(f struct {
		Peer string `json:"peer"`
	}) bool {
		return f.Peer == to.Peer
	}) {
		return fmt.Errorf("%s does not find %s's %s (found %v)", from.Name, to.Name, to.Model, found)
	}
	return nil
}

// Probe is one probe's outcome.
type Probe struct {
	At  time.Time     `json:"at"`
	OK  bool          `json:"ok"`
	Err string        `json:"err,omitempty"`
	For time.Duration `json:"for_ns"`
}

// Prober probes a lab continuously: a call and a lookup each way between
// every two members, each pair and kind in a loop of its own, until
// stopped. It probes every Sparse, and every Dense for a while after
// Densely — around a fault, where the times that matter are. Its record
// is what Measure reads.
type Prober struct {
	sparse, dense time.Duration

	mu         sync.Mutex
	probes     map[string][]Probe // "call node-a→node-b", "find node-a→node-b"
	denseUntil time.Time
	stop       context.CancelFunc
	wg         sync.WaitGroup
	wake       chan struct{}
}

// Probe starts probing l every sparse (every dense after Densely).
func (l *Lab) Probe(ctx context.Context, sparse, dense time.Duration) *Prober {
	ctx, cancel := context.WithCancel(ctx)
	p := &Prober{sparse: sparse, dense: dense, probes: map[string][]Probe{}, stop: cancel}
	for _, a := range l.Members {
		for _, b := range l.Members {
			if a == b {
				continue
			}
			p.loop(ctx, "call "+a.Name+"→"+b.Name, func(ctx context.Context) error { return l.Call(ctx, a, b) })
			p.loop(ctx, "find "+a.Name+"→"+b.Name, func(ctx context.Context) error { return l.Finds(ctx, a, b) })
		}
	}
	return p
}

// Densely probes every dense for the next d, from each kind's next
// probe on. It wakes no probe: probes that all began at the moment of a
// fault would all meet it in flight (call Densely a sparse interval
// before).
func (p *Prober) Densely(d time.Duration) {
	p.mu.Lock()
	p.denseUntil = time.Now().Add(d)
	p.mu.Unlock()
}

func (p *Prober) next() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Now().Before(p.denseUntil) {
		return p.dense
	}
	return p.sparse
}

func (p *Prober) loop(ctx context.Context, key string, probe func(context.Context) error) {
	p.wg.Go(func() {
		for ctx.Err() == nil {
			at := time.Now()
			err := probe(ctx)
			if ctx.Err() != nil {
				return // cut by Stop: not a result
			}
			pr := Probe{At: at, OK: err == nil, For: time.Since(at)}
			if err != nil {
				pr.Err = err.Error()
			}
			p.mu.Lock()
			p.probes[key] = append(p.probes[key], pr)
			p.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(at.Add(p.next()))):
			}
		}
	})
}

// Stop ends the probes and waits for them.
func (p *Prober) Stop() {
	p.stop()
	p.wg.Wait()
}

// Record is a copy of every probe so far, by key.
func (p *Prober) Record() map[string][]Probe {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]Probe, len(p.probes))
	for k, v := range p.probes {
		out[k] = slices.Clone(v)
	}
	return out
}
