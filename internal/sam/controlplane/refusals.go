package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/sam/refusals"
)

// Members' reports of their agents' refusals (issue 17, item 7;
// internal/sam/refusals): each sam-node sends what it and the boundaries of
// its machine refused, aggregated and bounded, every few seconds (POST
// api.RefusalsPath with its member credential, as for the policy). The
// control plane hands each report to Config.Reported — sam-one's console
// keeps them — and keeps nothing itself: sam-control-plane alone has no
// console to show them, and its store holds the mesh's desired state
// (tokens, members, policy), which every enrolment and every member's
// policy poll share; refusals, which an attacker in a sandbox drives,
// must not become writes there. Each member already logs its own
// refusals (sandstormd's "boundary refused a flow", sam-node's lines),
// so without a hook a report is logged at debug level and dropped.
//
// What a report costs the control plane is bounded per member: a
// credential checked, then at most reportBurst reports at once and one
// a second after (a member sends one every refusals.NodeEvery, more only
// to catch up after a failure), each at most refusals.MaxBodyBytes and
// refusals.MaxRows rows, checked whole before the hook sees it.
const (
	reportEvery = time.Second
	reportBurst = 5
)

// reportLimits are the members' rate limiters, one per member that
// presented a valid credential (so at most one per enrolled member).
type reportLimits struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (l *reportLimits) allow(member string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*rate.Limiter{}
	}
	lim := l.m[member]
	if lim == nil {
		lim = rate.NewLimiter(rate.Every(reportEvery), reportBurst)
		l.m[member] = lim
	}
	return lim.AllowN(now, 1)
}

func (s *Server) postRefusals(w http.ResponseWriter, r *http.Request) {
	c, err := s.credentialOf(r)
	if err != nil {
		if errors.Is(err, errdefs.ErrUnauthorized) || errors.Is(err, errdefs.ErrForbidden) {
			s.refuse(w, "credential", c.Member, err)
			return
		}
		errdefs.WriteHTTP(w, err)
		return
	}
	if !s.reports.allow(c.Member, s.cfg.Now()) {
		// Not read: a report over the rate costs no parse.
		errdefs.WriteHTTP(w, errdefs.NoRoom(fmt.Errorf("member %s: at most one report of refusals a second", c.Member), reportEvery))
		return
	}
	var rep api.RefusalReport
	if err := httpjson.Decode(w, r, &rep, refusals.MaxBodyBytes); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			err = errdefs.New(errdefs.ErrTooLarge, "a report of at most %d bytes, please", refusals.MaxBodyBytes)
		}
		errdefs.WriteHTTP(w, err)
		return
	}
	if err := refusals.Check(rep); err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	if s.cfg.Reported != nil {
		s.cfg.Reported(c.Member, rep)
	} else {
		s.cfg.Log.Debug("member reported its agents' refusals (no console here: not kept)", "member", c.Member, "rows", len(rep.Rows), "dropped", rep.Dropped)
	}
	w.WriteHeader(http.StatusNoContent)
}

// ReportRefusals sends a member's report of its agents' refusals with
// its credential; ctx bounds the call.
func (c *Client) ReportRefusals(ctx context.Context, credential string, rep api.RefusalReport) error {
	body, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	h := http.Header{"Authorization": {"Bearer " + credential}}
	_, err = c.raw(ctx, http.MethodPost, api.RefusalsPath, "application/json", body, h, nil)
	return err
}
