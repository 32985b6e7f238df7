package agents

import (
	"compress/gzip"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/proxy"

	"sandstorm/internal/bench/sambench"
)

// pushAgent is one agent of a push: its principal's name and an HTTP
// client that reaches the node its own way, with at most inFlight
// connections, kept alive between requests as an agent's HTTP client keeps
// them.
type pushAgent struct {
	name   string
	url    string
	header http.Header
	client *http.Client
	tr     *http.Transport
}

func agentTransport(inFlight int, dial func(ctx context.Context, addr string) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		Proxy:               nil, // never one from the environment: the route is the one asked
		MaxConnsPerHost:     inFlight,
		MaxIdleConnsPerHost: inFlight,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
	}
}

// boundaryAgent reaches http://mesh.sam.alt/v1/models through its own
// boundary's SOCKS5 Unix socket, the name handed on unresolved (as
// sam-bench run --socket does): the boundary decides on the name for its
// principal and passes the request to sam-node.
func boundaryAgent(name, socket string, inFlight int) (*pushAgent, error) {
	pd, err := proxy.SOCKS5("unix", socket, nil, nil)
	if err != nil {
		return nil, err
	}
	cd := pd.(proxy.ContextDialer)
	tr := agentTransport(inFlight, func(ctx context.Context, addr string) (net.Conn, error) { return cd.DialContext(ctx, "tcp", addr) })
	return &pushAgent{name: name, url: "http://mesh.sam.alt/v1/models", tr: tr, client: &http.Client{Transport: tr}}, nil
}

// baselineAgent sends the same request straight to sam-node's agent
// socket, naming the principal itself as a boundary would (as sam-bench
// run --target-unix --header X-Sam-Principal=… does): the path with no
// boundary in it.
func baselineAgent(name, nodeSocket string, inFlight int) *pushAgent {
	var d net.Dialer
	tr := agentTransport(inFlight, func(ctx context.Context, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", nodeSocket) })
	return &pushAgent{name: name, url: "http://localhost/v1/models", header: http.Header{"X-Sam-Principal": {name}},
		tr: tr, client: &http.Client{Transport: tr}}
}

// call issues one request and times it from just before it is handed to
// the client: to its first response byte and to the end of its body.
// gotConn, if set, is called once the request has its connection, before
// it is sent.
func (a *pushAgent) call(ctx context.Context, agent, seq int, start time.Time, timeout time.Duration, gotConn func(context.Context)) Call {
	c := Call{Agent: agent, Seq: seq}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var t0 time.Time
	var ttfb atomic.Int64
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { ttfb.Store(int64(time.Since(t0))) }}
	if gotConn != nil {
		trace.GotConn = func(httptrace.GotConnInfo) { gotConn(ctx) }
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, a.url, nil)
	if err != nil {
		c.Kind = "error"
		return c
	}
	for k, v := range a.header {
		req.Header[k] = v
	}
	t0 = time.Now()
	c.StartUs = t0.Sub(start).Microseconds()
	resp, err := a.client.Do(req)
	if err != nil {
		c.TotalUs = time.Since(t0).Microseconds()
		c.Kind = sambench.Classify(err)
		return c
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.TotalUs = time.Since(t0).Microseconds()
	c.TTFBUs = time.Duration(ttfb.Load()).Microseconds()
	c.Status = resp.StatusCode
	switch {
	case err != nil:
		c.Kind = "body: " + sambench.Classify(err)
	case resp.StatusCode == http.StatusOK:
		c.Kind = sambench.KindOK
	default:
		c.Kind = "http " + strconv.Itoa(resp.StatusCode)
	}
	return c
}

// push has every agent issue perAgent requests, inFlight at a time on its
// own kept-alive connections, all agents let go at once. First each agent
// issues inFlight requests at once (the warmup, returned apart), each
// holding its connection until all of them have one, so that each agent
// has exactly inFlight connections open — its flows through its boundary
// — before the push (without the hold, one request could be served on
// another's connection while its own dial finished later, in the push:
// TestPushThroughABoundary saw it). Then ready is called (the counters
// are read there) and the push starts.
func push(ctx context.Context, agents []*pushAgent, perAgent, inFlight int, timeout time.Duration, ready func()) (calls, warm [][]Call) {
	calls, warm = make([][]Call, len(agents)), make([][]Call, len(agents))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, a := range agents {
		warm[i] = make([]Call, inFlight)
		var held atomic.Int64
		all := make(chan struct{})
		hold := func(ctx context.Context) {
			if held.Add(1) == int64(inFlight) {
				close(all)
			}
			select { // a warmup request that failed before its connection must not hold the rest for ever
			case <-all:
			case <-ctx.Done():
			}
		}
		for j := range inFlight {
			wg.Go(func() { warm[i][j] = a.call(ctx, i, j, t0, timeout, hold) })
		}
	}
	wg.Wait()
	ready()
	release := make(chan struct{})
	var start time.Time
	for i, a := range agents {
		calls[i] = make([]Call, perAgent)
		var next atomic.Int64
		for range inFlight {
			wg.Go(func() {
				<-release
				for ctx.Err() == nil {
					j := int(next.Add(1) - 1)
					if j >= perAgent {
						return
					}
					calls[i][j] = a.call(ctx, i, j, start, timeout, nil)
				}
			})
		}
	}
	start = time.Now()
	close(release)
	wg.Wait()
	for i := range calls {
		// Requests never issued (the run was interrupted) are not calls.
		n := 0
		for _, c := range calls[i] {
			if c.Kind != "" {
				calls[i][n] = c
				n++
			}
		}
		calls[i] = calls[i][:n]
	}
	for _, a := range agents {
		a.tr.CloseIdleConnections()
	}
	return calls, warm
}

// writeCalls writes every call of a push as gzip'd CSV: the raw samples
// the push's figures are computed from.
func writeCalls(path string, names []string, calls [][]Call) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	w := csv.NewWriter(zw)
	w.Write([]string{"agent", "i", "start_us", "ttfb_us", "total_us", "status", "kind"})
	for a, cs := range calls {
		for _, c := range cs {
			w.Write([]string{names[a], strconv.Itoa(c.Seq), strconv.FormatInt(c.StartUs, 10), strconv.FormatInt(c.TTFBUs, 10),
				strconv.FormatInt(c.TotalUs, 10), strconv.Itoa(c.Status), c.Kind})
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}
