package nodeapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
)

// A node reports to its master as it commits (issue 9: "each node keeps
// its own actual state … and reports changes to the master as it commits
// them, so that a GET or a list never waits on a node"). The master opens
// one long request to each node (over the node's tunnel, for one that
// dials in: the calls all go the master's way) and the node streams
// Reports on it: first all it has, then each change, and a heartbeat
// with its status every HeartbeatEvery. A master that hears nothing for
// SilenceLimit takes the node for lost; a node that falls behind its own
// changes sends all it has again rather than miss one.

// HeartbeatEvery is how often a node sends its status when nothing else
// happens.
const HeartbeatEvery = time.Second

// SilenceLimit is how long a master waits for a report before it takes
// the node for lost: three heartbeats.
const SilenceLimit = 3 * HeartbeatEvery

// Report is one message of a node's report stream.
type Report struct {
	// Full, when set, says Sandboxes is every sandbox the node has: what
	// the master knew of the node is replaced by it.
	Full      bool          `json:"full,omitempty"`
	Sandboxes []api.Sandbox `json:"sandboxes,omitempty"`
	// Event is what just happened on the node; Sandbox is the sandbox
	// it concerns as it is after it, or Gone its ID if it no longer is.
	Event   *events.Event `json:"event,omitempty"`
	Sandbox *api.Sandbox  `json:"sandbox,omitempty"`
	Gone    string        `json:"gone,omitempty"`
	// Status is the node's headroom and tier counts (every report
	// with Full, and every heartbeat).
	Status *api.NodeStatus `json:"status,omitempty"`
}

// serveWatch is the node's end of Watch over the network: one JSON
// Report per line, flushed as it is written.
func serveWatch(n Node, w http.ResponseWriter, r *http.Request) error {
	fl, ok := w.(http.Flusher)
	if !ok {
		return errors.New("watch: the connection cannot stream")
	}
	started := false
	enc := json.NewEncoder(w)
	err := n.Watch(r.Context(), func(rep Report) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		if err := enc.Encode(rep); err != nil {
			return err
		}
		fl.Flush()
		return nil
	})
	if err != nil && !started {
		return err
	}
	return nil
}

// Watch implements Node over the network. It returns when ctx ends, the
// stream breaks, or the node is silent for SilenceLimit (a partition
// leaves a TCP connection open with nothing on it), with why.
func (c *Client) Watch(ctx context.Context, send func(Report) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/node/v1/watch", nil)
	if err != nil {
		return err
	}
	limit := c.Silence
	if limit <= 0 {
		limit = SilenceLimit
	}
	silent := time.AfterFunc(limit, func() {
		cancel(fmt.Errorf("no report for %v", limit))
	})
	defer silent.Stop()
	resp, err := c.stream().Do(req)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = cause
		}
		return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	// A full report of thousands of sandboxes is one line.
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	for sc.Scan() {
		silent.Reset(limit)
		var rep Report
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			return fmt.Errorf("node %s: a report that is not JSON: %w", c.NodeName, err)
		}
		if err := send(rep); err != nil {
			return err
		}
	}
	err = sc.Err()
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		err = cause
	}
	if err == nil {
		err = errors.New("the node ended its reports")
	}
	return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, err))
}

// stream is c's HTTP client for a request that lasts as long as it is
// wanted (reports, followed logs): the same connections, no time limit.
func (c *Client) stream() *http.Client {
	return &http.Client{Transport: c.HTTP.Transport}
}
