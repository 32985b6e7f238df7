package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/refusals"
)

func refusalRow(principal, target string, at time.Time) api.RefusalRow {
	return api.RefusalRow{Principal: principal, By: api.RefusedBySAMNode, What: api.RefusedModel, Target: target, Reason: "not granted", Count: 3, First: at, Last: at}
}

// TestRefusalReports: a member's report of its agents' refusals, sent
// with its credential, reaches the Reported hook under the member's own
// name (whatever the report says); no credential, a made-up one, a
// revoked member's, a bad report and an oversized one are refused and
// reach nothing; a member flooding reports is held to its rate (503 with
// Retry-After) while another member's still go through.
func TestRefusalReports(t *testing.T) {
	type got struct {
		member string
		rep    api.RefusalReport
	}
	var mu sync.Mutex
	var reports []got
	var refused []Refusal
	p := newPlane(t, filepath.Join(t.TempDir(), "cp.db"), func(c *Config) {
		c.Reported = func(m string, rep api.RefusalReport) {
			mu.Lock()
			reports = append(reports, got{m, rep})
			mu.Unlock()
		}
		c.Refused = func(r Refusal) {
			mu.Lock()
			refused = append(refused, r)
			mu.Unlock()
		}
	})
	ctx := context.Background()
	c := p.member()
	tok := token(t, p, 3, time.Hour)
	credA, err := c.Enrol(ctx, tok, "node-a", key(t))
	if err != nil {
		t.Fatal(err)
	}
	credB, err := c.Enrol(ctx, tok, "node-b", key(t))
	if err != nil {
		t.Fatal(err)
	}
	at := *p.now.Load()
	good := api.RefusalReport{Rows: []api.RefusalRow{refusalRow("agent-a", "gpt-big", at)}, Dropped: 4}
	if err := c.ReportRefusals(ctx, credA.Credential, good); err != nil {
		t.Fatalf("a member's report: %v", err)
	}
	mu.Lock()
	if len(reports) != 1 || reports[0].member != "node-a" || reports[0].rep.Rows[0].Target != "gpt-big" || reports[0].rep.Dropped != 4 {
		t.Errorf("the hook got %+v", reports)
	}
	mu.Unlock()

	for what, cred := range map[string]string{"no credential": "", "a made-up credential": "eyJhbGciOiJFZERTQSJ9.e30.c2ln"} {
		if err := c.ReportRefusals(ctx, cred, good); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("%s: %v, want unauthorized", what, err)
		}
	}
	bad := good
	bad.Rows = []api.RefusalRow{refusalRow("agent a", "gpt-big", at)}
	if err := c.ReportRefusals(ctx, credB.Credential, bad); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a row with a spaced principal: %v, want bad input", err)
	}
	if err := c.raw2(ctx, credB.Credential, `{"rows": [], "extra": true}`); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("an unknown field: %v, want bad input", err)
	}
	if err := c.raw2(ctx, credB.Credential, `{"rows": [], "dropped": 1`+strings.Repeat(" ", refusals.MaxBodyBytes)+`}`); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("a report over 1 MiB: %v, want too large", err)
	}

	// A flood from node-b: its burst goes through, then it waits; node-a
	// is not held up by it.
	p.add(time.Minute) // both members' buckets full
	var passed, held int
	for i := 0; i < 50; i++ {
		err := c.ReportRefusals(ctx, credB.Credential, api.RefusalReport{Rows: []api.RefusalRow{refusalRow("attacker", fmt.Sprintf("m%d", i), at)}})
		switch {
		case err == nil:
			passed++
		case errors.Is(err, errdefs.ErrNoRoom):
			held++
		default:
			t.Fatalf("report %d: %v", i, err)
		}
	}
	if passed != reportBurst || held != 50-reportBurst {
		t.Errorf("a flood of 50 reports at one instant: %d passed, %d held; want %d and %d", passed, held, reportBurst, 50-reportBurst)
	}
	if err := c.ReportRefusals(ctx, credA.Credential, good); err != nil {
		t.Errorf("node-a's report while node-b floods: %v", err)
	}
	p.add(reportEvery)
	if err := c.ReportRefusals(ctx, credB.Credential, good); err != nil {
		t.Errorf("node-b's report a second later: %v", err)
	}
	// Held, the answer says when to come back.
	resp := c.post(t, credB.Credential, `{"rows": []}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a report over the rate: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}

	// Revoked, node-b's credential reports nothing more.
	if err := p.admin.Revoke(ctx, "node-b"); err != nil {
		t.Fatal(err)
	}
	p.add(time.Minute)
	if err := c.ReportRefusals(ctx, credB.Credential, good); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("a revoked member's report: %v, want forbidden", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := len(reports); n != 2+reportBurst+1 {
		t.Errorf("the hook got %d reports, want %d", n, 2+reportBurst+1)
	}
	for _, r := range reports {
		if r.rep.Rows[0].Principal == "agent a" {
			t.Error("a refused report reached the hook")
		}
	}
	if len(refused) < 3 {
		t.Errorf("refused credentials told to the Refused hook: %+v", refused)
	}
}

// raw2 posts body as a report with credential.
func (c *Client) raw2(ctx context.Context, credential, body string) error {
	_, err := c.raw(ctx, http.MethodPost, api.RefusalsPath, "application/json", []byte(body), http.Header{"Authorization": {"Bearer " + credential}}, nil)
	return err
}

// post posts body as a report with credential and returns the answer.
func (c *Client) post(t *testing.T, credential, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.Base+api.RefusalsPath, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+credential)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}
