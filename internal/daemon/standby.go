package daemon

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/store"
)

// errLeaseLost ends a leading master whose lease is gone (store/lease.go):
// it exits rather than go on deciding next to a new leader; started again,
// it stands by.
var errLeaseLost = errors.New("lost the leader lease in PostgreSQL (its session ended: the database restarted, or this master was cut off); another master may lead now. Start this one again to stand by")

// standBy waits until this master holds the store's leader lease. Until
// then (and until the master's API is ready) the API address, already
// served through sw, answers every request, once its token checks, with
// 503 saying who leads — so a client or load balancer pointed at it learns
// at once that it must go elsewhere, and a person sees why. It returns the
// lease, or nil if ctx ended first.
func standBy(ctx context.Context, st *store.Store, o Options, sw *switchHandler, token string, log *slog.Logger) (*store.Lease, error) {
	holder := fmt.Sprintf("%s (pid %d, api %s, node %s)", hostname(), os.Getpid(), o.Listen, o.NodeName)
	// "Starting" until it is known that another master leads: a client
	// must never be told "stand by" by the master that is about to lead.
	sw.set(startingHandler(token))
	lease, err := st.AcquireLease(ctx, holder, func(cur store.Leader) {
		log.Info("standing by: another master leads; this one takes over when its lease ends", "leader", cur.Holder, "since", cur.Since)
		sw.set(standbyHandler(st, token))
	})
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("leader lease: %w", err)
	}
	log.Info("leading: this master holds the leader lease", "holder", holder)
	sw.set(startingHandler(token))
	return lease, nil
}

// startingHandler answers while a master finds out whether it leads, and
// once it does, while it gets its node and API ready (a second or so).
func startingHandler(token string) http.Handler {
	return tokenChecked(token, func(w http.ResponseWriter, r *http.Request) {
		errdefs.WriteHTTP(w, errdefs.NoRoom(errors.New("this master is starting; retry in a moment"), time.Second))
	})
}

// tokenChecked serves h to requests with the API token only.
func tokenChecked(token string, h http.HandlerFunc) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "missing or wrong API token"))
			return
		}
		h(w, r)
	})
}

// switchHandler serves whichever handler was set last: one listener, one
// server, from standby to master without a moment of "connection refused".
type switchHandler struct{ h atomic.Pointer[http.Handler] }

func (s *switchHandler) set(h http.Handler) { s.h.Store(&h) }

func (s *switchHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// standbyHandler is a standby master's whole API.
func standbyHandler(st *store.Store, token string) http.Handler {
	return tokenChecked(token, func(w http.ResponseWriter, r *http.Request) {
		cur, _ := st.CurrentLeader(r.Context())
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrStandby, "this master stands by: %s leads (since %s); send requests there, or retry here once it stops", cur.Holder, cur.Since.Format(time.RFC3339)))
	})
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "?"
	}
	return h
}
