// Package ingress is a node's ingress (issue 33, "an ingress that is not
// the master"): it serves E2B's traffic to any sandbox of the fleet —
// envd, the code interpreter, a sandbox's own ports, at
// <port>-<id>.<domain> — by E2B's rules (internal/sandboxtraffic),
// checked here from the node's own table of routes (Table), which the
// master pushes (internal/routes) and no request waits for. A sandbox of
// this node is served by it; another's is forwarded straight to the node
// that holds it, over the nodes' mutual TLS, fenced by its placement's
// generation: the holder serves only the copy the route names, so a route
// left stale by a move finds nothing, and the ingress waits for the new
// one.
package ingress

import (
	"context"
	"sync"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
)

// Table is a node's routes: the fleet's sandboxes as its master last
// pushed them.
type Table struct {
	mu      sync.Mutex
	version int64
	routes  map[string]nodeapi.Route
	peers   map[string]time.Time // name → revoked at (zero: never)
	// changed is closed, and replaced, at each change: Next waits on it.
	changed chan struct{}
	// resumes are the sandboxes whose traffic asks the master for a
	// resume (AskResume), until the node's report stream sends them.
	resumes chan ResumeAsk
	// asked is when each ask queued stops waiting: traffic to the same
	// sandbox meanwhile waits for the same push, not another ask (a
	// burst of requests is one ask to the master, not hundreds).
	asked map[string]time.Time
}

// ResumeAsk is traffic's ask that the master resume a sandbox, good
// until its request stops waiting: one the report stream could not send
// by then (no master hearing) is dropped, not sent late.
type ResumeAsk struct {
	ID    string
	Until time.Time
}

// resumesQueued bounds the resumes waiting for the report stream: past
// it (no master hearing, or a flood) an ask is dropped, and its request
// is answered as it was before asking, unavailable.
const resumesQueued = 256

// NewTable is an empty table (version 0: the master sends it whole).
func NewTable() *Table {
	return &Table{routes: map[string]nodeapi.Route{}, changed: make(chan struct{}), resumes: make(chan ResumeAsk, resumesQueued), asked: map[string]time.Time{}}
}

// AskResume asks the master to resume sandbox id (nodeapi.Report.Resume):
// the node's report stream carries it (nodeside's Watch reads Resumes).
// It says false if the ask was dropped.
func (t *Table) AskResume(id string, until time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if now.Before(t.asked[id]) {
		return true // asked already, and that ask is still waiting
	}
	for k, u := range t.asked {
		if !now.Before(u) {
			delete(t.asked, k)
		}
	}
	select {
	case t.resumes <- ResumeAsk{ID: id, Until: until}:
		t.asked[id] = until
		return true
	default:
		return false
	}
}

// Resumes are the asks AskResume queued, for the report stream (nil
// table: none, ever).
func (t *Table) Resumes() <-chan ResumeAsk {
	if t == nil {
		return nil
	}
	return t.resumes
}

// Apply takes a push from the master (nodeapi.Routes): a change only to
// the version it was made against, or the table whole.
func (t *Table) Apply(u nodeapi.Routes) error {
	if err := u.Check(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !u.Full && u.Base != t.version {
		return errdefs.New(errdefs.ErrPrecondition, "routes: this node's table is at version %d, not %d: send it whole", t.version, u.Base)
	}
	if u.Full {
		t.routes = make(map[string]nodeapi.Route, len(u.Set))
	}
	for _, r := range u.Set {
		t.routes[r.ID] = r
	}
	for _, id := range u.Drop {
		delete(t.routes, id)
	}
	t.peers = make(map[string]time.Time, len(u.Peers))
	for _, p := range u.Peers {
		t.peers[p.Name] = p.RevokedAt
	}
	t.version = u.Version
	close(t.changed)
	t.changed = make(chan struct{})
	return nil
}

// Get is sandbox id's route.
func (t *Table) Get(id string) (nodeapi.Route, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.routes[id]
	return r, ok
}

// AllowPeer says whether node name, whose certificate was issued at
// issued, may forward traffic here: a node its master has paired now,
// with a certificate younger than its revocation if it had one (to the
// second, as the master's own check: fleet.checkCert). Before the
// master's first push, none may.
func (t *Table) AllowPeer(name string, issued time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.peers[name]
	return ok && !issued.Before(at.Truncate(time.Second))
}

// Next waits until sandbox id's route is no longer of generation gen
// (a move's new one, or none) or ctx ends, and returns it.
func (t *Table) Next(ctx context.Context, id string, gen int64) (nodeapi.Route, bool) {
	return t.Until(ctx, id, func(r nodeapi.Route, ok bool) bool { return !ok || r.Generation != gen })
}

// Until waits until id's route (ok: it has one) is as done says, or ctx
// ends, and returns it as it then is.
func (t *Table) Until(ctx context.Context, id string, done func(r nodeapi.Route, ok bool) bool) (nodeapi.Route, bool) {
	for {
		t.mu.Lock()
		r, ok := t.routes[id]
		ch := t.changed
		t.mu.Unlock()
		if done(r, ok) {
			return r, ok
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return r, ok
		}
	}
}

// Stat is the table's version and size.
func (t *Table) Stat() (version int64, routes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.version, len(t.routes)
}
