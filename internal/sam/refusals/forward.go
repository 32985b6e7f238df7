package refusals

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
)

// Intervals and deadlines of the hops. A refusal reaches sam-one's
// console within about BoundaryEvery + NodeEvery + the console's 2 s
// poll.
const (
	// BoundaryEvery: the boundaries of a machine to its sam-node.
	BoundaryEvery = 2 * time.Second
	// NodeEvery: a sam-node to the control plane.
	NodeEvery = 5 * time.Second
	// SendTimeout bounds every report's call: a receiver that stops
	// answering costs a report, never a stuck sender.
	SendTimeout = 10 * time.Second
)

// Send delivers a report; its context carries the call's deadline.
type Send func(ctx context.Context, rep api.RefusalReport) error

// Forward sends t's refusals every interval until ctx ends, each call
// bounded by SendTimeout; an interval with nothing to report sends
// nothing. What a failed call carried is merged back into t — still
// bounded by t's size, the overflow counted as dropped — and goes with
// the next report. A failure is logged once, and again when reports get
// through again. what names the receiver in the log ("sam-node", "the
// control plane").
func Forward(ctx context.Context, t *Table, every time.Duration, send Send, what string, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rep := t.Take()
		if Empty(rep) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, SendTimeout)
		err := send(sctx, rep)
		cancel()
		if errors.Is(err, errdefs.ErrBadInput) || errors.Is(err, errdefs.ErrTooLarge) {
			// Refused as it is: sending it again would be refused again,
			// and hold back every report after it. A table's reports
			// always pass Check (FuzzTableReportPassesCheck), so this is
			// a bug worth a line at error level, not a retry.
			log.Error("agents' refusals refused as malformed; dropped", "to", what, "rows", len(rep.Rows), "err", err)
			continue
		}
		if err != nil {
			t.Merge(rep)
			if !failing && ctx.Err() == nil {
				log.Warn("cannot report agents' refusals; keeping them (bounded) for the next try", "to", what, "err", err)
			}
			failing = true
			continue
		}
		if failing {
			log.Info("agents' refusals reported again", "to", what)
		}
		failing = false
	}
}

// UnixClient is an HTTP client for sam-node's agent socket at sock.
func UnixClient(sock string) *http.Client {
	return DialClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

// DialClient is an HTTP client whose every connection is dial's (sam-box's
// --mesh): no proxy from the environment, sam-node is the only place it
// talks to.
func DialClient(dial func(ctx context.Context) (net.Conn, error)) *http.Client {
	return &http.Client{Timeout: SendTimeout, Transport: &http.Transport{Proxy: nil, MaxIdleConns: 1, IdleConnTimeout: 30 * time.Second,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }}}
}

// ToSAMNode sends reports to the sam-node behind hc (UnixClient, or a
// client of its TCP agent listener at base, e.g. "http://127.0.0.1:9"),
// POST api.SAMRefusalsPath in a request naming no principal: the
// boundaries' own channel to their node.
func ToSAMNode(hc *http.Client, base string) Send {
	u := strings.TrimRight(base, "/") + api.SAMRefusalsPath
	return func(ctx context.Context, rep api.RefusalReport) error {
		resp, err := httpjson.Send(ctx, hc, http.MethodPost, u, rep)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			err := fmt.Errorf("sam-node: %s: %s", resp.Status, strings.TrimSpace(string(b)))
			switch resp.StatusCode {
			case http.StatusBadRequest:
				return errdefs.Mark(errdefs.ErrBadInput, err)
			case http.StatusRequestEntityTooLarge:
				return errdefs.Mark(errdefs.ErrTooLarge, err)
			}
			return err
		}
		return nil
	}
}
