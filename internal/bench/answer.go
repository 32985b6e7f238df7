package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"sandstorm/internal/gateway"
)

// FirstAnswer GETs url until it answers 200 or the deadline passes (then
// the last error, naming url), polling on the gateway's dial schedule: a
// refused connect costs a starting sandbox CPU (gateway.DialInterval), so
// a tighter poll would slow what it measures.
func FirstAnswer(ctx context.Context, hc *http.Client, url string, deadline time.Time) error {
	return PollAnswer(ctx, hc, url, deadline, gateway.DialInterval)
}

// PollAnswer is FirstAnswer on another schedule: every wait(elapsed)
// (bench/baselines also polls every 50 ms, as the seed's harness did).
func PollAnswer(ctx context.Context, hc *http.Client, url string, deadline time.Time, wait func(elapsed time.Duration) time.Duration) error {
	start := time.Now()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer from %s: %w", url, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait(time.Since(start))):
		}
	}
}
