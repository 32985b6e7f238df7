package e2e

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"sandstorm/api"
)

// TestE2BPauseKilled: sandstormd killed with -9 at a random moment of an
// E2B pause leaves the sandbox running or paused — never both, never
// neither (issue 31): after the restart, E2B's state and its traffic
// agree (paused: envd answers 502 until a connect; running: envd
// answers), and a connect brings it back either way.
func TestE2BPauseKilled(t *testing.T) {
	d := startDaemon(t)
	d.registerBase(t)
	ctx := context.Background()
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := d.C.Do(ctx, http.MethodPost, "/e2b/sandboxes", map[string]any{"templateID": "base", "timeout": 600}, &sb); err != nil {
		t.Fatal(err)
	}
	health := func() int {
		req, _ := http.NewRequest(http.MethodGet, d.API+"/health", nil)
		req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(api.EnvdPort))
		req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
		resp, err := d.C.HTTP.Do(req)
		if err != nil {
			t.Fatalf("envd's /health: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := health(); st != http.StatusNoContent {
		t.Fatalf("envd's /health before: %d", st)
	}
	for round := 1; round <= 6; round++ {
		// A pause takes about 60 ms here: the kill falls before, in or
		// after it.
		delay := time.Duration(rand.IntN(81)) * time.Millisecond
		done := make(chan error, 1)
		go func() { done <- d.C.Do(ctx, http.MethodPost, "/e2b/sandboxes/"+sb.SandboxID+"/pause", nil, nil) }()
		time.Sleep(delay) // the moment of the kill, not a wait for anything
		d.Kill(t)
		callErr := <-done
		d.Start(t)
		var info struct {
			State string `json:"state"`
		}
		if err := d.C.Do(ctx, http.MethodGet, "/e2b/sandboxes/"+sb.SandboxID, nil, &info); err != nil {
			t.Fatalf("round %d: get after the restart: %v", round, err)
		}
		st := health()
		t.Logf("round %d: killed %v into the pause (call: %v); after the restart: %s, envd's /health %d", round, delay, callErr, info.State, st)
		switch {
		case info.State == "paused" && st != http.StatusBadGateway:
			t.Errorf("round %d: paused, but its envd answers %d (want 502 until a connect)", round, st)
		case info.State == "running" && st != http.StatusNoContent:
			t.Errorf("round %d: running, but its envd answers %d", round, st)
		case info.State != "paused" && info.State != "running":
			t.Errorf("round %d: state %q", round, info.State)
		}
		if err := d.C.Do(ctx, http.MethodPost, "/e2b/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil); err != nil {
			t.Fatalf("round %d: connect: %v", round, err)
		}
		if st := health(); st != http.StatusNoContent {
			t.Fatalf("round %d: after connect, envd's /health %d", round, st)
		}
	}
}
