package controlplane

import (
	"context"
	"net/http"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
)

// MaxGrace bounds a rotation's grace: a key that verifies for more than a
// day after it was replaced is not rotated in any useful sense.
const MaxGrace = 24 * time.Hour

// rotate makes a new signing key (operator). The key it replaces still
// verifies for the grace — by default twice a credential's life, so no
// credential signed before the rotation is refused early — and members
// see the new set from their next GET /v1/keys (2 s). A grace of 0
// retires the old key at once: for a key that leaked, at the price of
// every member renewing (each does on its next refresh; until then the
// others refuse its credential).
func (s *Server) rotate(w http.ResponseWriter, r *http.Request) {
	var req api.KeyRotateRequest
	if r.ContentLength != 0 {
		if err := httpjson.Decode(w, r, &req, maxBody); err != nil {
			errdefs.WriteHTTP(w, err)
			return
		}
	}
	grace := s.cfg.DefaultGrace
	if req.GraceSeconds != nil {
		grace = time.Duration(*req.GraceSeconds) * time.Second
		if grace < 0 || grace > MaxGrace {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "grace_s 0 to %d, please", int(MaxGrace/time.Second)))
			return
		}
	}
	s.rotating.Lock()
	defer s.rotating.Unlock()
	old := s.iss.Load()
	now := s.cfg.Now()
	next, err := old.Rotated(grace, now)
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	if s.cfg.SaveKeys != nil {
		b, err := next.MarshalKeys()
		if err == nil {
			err = s.cfg.SaveKeys(b)
		}
		if err != nil {
			s.cfg.Log.Error("key rotation not saved; the old key still signs", "err", err)
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnavailable, "the rotated keys could not be saved, so the old key still signs: %v", err))
			return
		}
	}
	s.iss.Store(next)
	keys, err := s.meshKeys(r)
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	s.cfg.Log.Info("signing key rotated", "current", next.CurrentKeyID(), "retired", old.CurrentKeyID(), "verifies_until", now.Add(grace))
	httpjson.Write(w, http.StatusOK, api.KeyRotation{Current: next.CurrentKeyID(), RetiredKey: old.CurrentKeyID(), RetiresAt: now.Add(grace).UTC(), Keys: keys})
}

// RotateKeys rotates the control plane's signing key (operator); grace
// nil is the control plane's default.
func (c *Client) RotateKeys(ctx context.Context, grace *time.Duration) (api.KeyRotation, error) {
	var req api.KeyRotateRequest
	if grace != nil {
		g := int(*grace / time.Second)
		req.GraceSeconds = &g
	}
	var out api.KeyRotation
	err := c.do(ctx, http.MethodPost, "/v1/keys/rotate", req, &out)
	return out, err
}
