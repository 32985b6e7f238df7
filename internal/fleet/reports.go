package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/store"
)

// The master hears each node's reports (nodeapi.Report: all it
// has when the stream opens, then every change as the node commits it,
// and a heartbeat a second) and keeps them in its store (the reported
// table). A GET, a list and GET /v1/nodes read there and from the links
// below; none waits on a node. Only what must happen on the node — a
// create, a transition, a delete, logs — calls it.

// link is what the master knows of its report stream from one node.
type link struct {
	cancel context.CancelFunc
	added  time.Time     // when the master began to hear it (its start, or the pairing)
	kick   chan struct{} // try the stream again now (its tunnel came up)
	up     bool          // a stream is open
	full   bool          // the stream's full report is in the store
	heard  time.Time     // the last report
	status api.NodeStatus
	why    string // why the last stream ended
	// upCtx lives while the stream is up: calls to the node end with it
	// (bound), so a node that goes lost fails the calls in flight at once.
	upCtx    context.Context
	upCancel context.CancelCauseFunc
}

// lost reports whether the node is lost: no open stream, or nothing
// heard from it for nodeapi.SilenceLimit.
func (l *link) lost(now time.Time) bool {
	return !l.up || now.Sub(l.heard) > nodeapi.SilenceLimit
}

// startWatch starts hearing node name's reports, once, if the fleet runs.
func (f *Fleet) startWatch(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runCtx == nil || f.links[name] != nil {
		return
	}
	ctx, cancel := context.WithCancel(f.runCtx)
	l := &link{cancel: cancel, added: time.Now(), kick: make(chan struct{}, 1)}
	f.links[name] = l
	go f.watch(ctx, name, l)
}

// stopWatch stops hearing node name (it is forgotten).
func (f *Fleet) stopWatch(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.links[name]; l != nil {
		l.cancel()
		delete(f.links, name)
	}
}

// kickWatch makes node name's watcher try again now.
func (f *Fleet) kickWatch(name string) {
	f.mu.RLock()
	l := f.links[name]
	f.mu.RUnlock()
	if l != nil {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// watchRetry is how long a watcher waits before it opens a stream again.
const watchRetry = time.Second

func (f *Fleet) watch(ctx context.Context, name string, l *link) {
	for ctx.Err() == nil {
		f.mu.RLock()
		c := f.nodes[name]
		f.mu.RUnlock()
		if c == nil {
			return
		}
		err := c.Watch(ctx, func(r nodeapi.Report) error { return f.apply(ctx, name, l, r) })
		if ctx.Err() != nil {
			// Stopped (the fleet ends, or the node was forgotten): the
			// calls riding this stream end too.
			f.mu.Lock()
			if l.upCancel != nil {
				l.upCancel(errors.New("the master stopped hearing node " + name))
				l.upCancel = nil
			}
			f.mu.Unlock()
			return
		}
		if err == nil {
			err = errors.New("its report stream ended")
		}
		f.mu.Lock()
		was := l.up
		l.up, l.full, l.why = false, false, err.Error()
		if l.upCancel != nil {
			l.upCancel(err)
			l.upCancel = nil
		}
		f.mu.Unlock()
		if was {
			f.cfg.Log.Warn("node lost: its reports stopped", "node", name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		case <-time.After(watchRetry):
		}
	}
}

// apply takes one report of node name into the store and the link.
func (f *Fleet) apply(ctx context.Context, name string, l *link, r nodeapi.Report) error {
	st := f.cfg.Store
	switch {
	// What a node says of its sandboxes is taken as its own: the node
	// named is the one reporting, and the store keeps another node's
	// sandbox that node's whatever this one claims.
	// Nor is a sandbox the master placed on another node.
	case r.Full:
		ps, err := st.ListAllPlacements(ctx)
		if err != nil {
			return err
		}
		elsewhere := map[string]bool{}
		for _, p := range ps {
			elsewhere[p.ID] = p.Node != name
		}
		own := r.Sandboxes[:0]
		for _, sb := range r.Sandboxes {
			if !elsewhere[sb.ID] {
				sb.Node = name
				own = append(own, sb)
				if sb.Moving == api.MovingOut {
					go f.unstick(ctx, name, sb.ID, sb.MoveGeneration)
				}
			}
		}
		if err := st.ReplaceReported(ctx, name, own); err != nil {
			return err
		}
	case r.Sandbox != nil:
		if p, err := st.GetPlacement(ctx, r.Sandbox.ID); err == nil && p.Node != name && p.ID == r.Sandbox.ID {
			if p.MoveNode != name {
				// (The other end of a move has its copy of it: not news.)
				f.cfg.Log.Warn("a node reported a sandbox placed on another node; ignored", "node", name, "id", r.Sandbox.ID, "placed_on", p.Node)
			}
			break
		}
		r.Sandbox.Node = name
		if err := st.PutReported(ctx, name, *r.Sandbox); err != nil {
			return err
		}
		if r.Sandbox.Moving == api.MovingOut {
			go f.unstick(ctx, name, r.Sandbox.ID, r.Sandbox.MoveGeneration)
		}
	case r.Gone != "":
		if err := st.DeleteReported(ctx, name, r.Gone); err != nil {
			return err
		}
	}
	if r.Resume != "" && f.cfg.Resume != nil {
		go f.cfg.Resume(name, r.Resume) // the stream goes on being read
	}
	if r.Event != nil && f.cfg.Events != nil && r.Event.Kind != events.Update {
		e := *r.Event
		e.Seq, e.Node = 0, name // numbered again by the master's hub
		f.cfg.Events.Publish(e)
	}
	f.mu.Lock()
	was := l.up
	l.up, l.heard = true, time.Now()
	if !was {
		l.upCtx, l.upCancel = context.WithCancelCause(context.Background())
	}
	if r.Full {
		l.full = true
		// What the node has is in: settle the master's attempts and
		// deletes against it, and fence it (place.go). Not on this
		// goroutine: the stream goes on being read meanwhile.
		go f.resolve(ctx, name)
	}
	if r.Status != nil {
		l.status = *r.Status
	}
	f.mu.Unlock()
	if !was {
		if f.cfg.Reconnected != nil {
			f.cfg.Reconnected(name)
		}
		f.cfg.Log.Info("node reporting", "node", name, "sandboxes", len(r.Sandboxes))
	}
	return nil
}

// linkOf is a copy of node name's link (ok false: the fleet does not
// hear it, e.g. it is not running).
func (f *Fleet) linkOf(name string) (link, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	l := f.links[name]
	if l == nil {
		return link{}, false
	}
	return *l, true
}

// young reports whether the node has not reported yet but may still be
// about to (within SilenceLimit of the master starting to hear it): then
// it is asked rather than taken for lost.
func (l *link) young(now time.Time) bool {
	return l.heard.IsZero() && now.Sub(l.added) < nodeapi.SilenceLimit
}

// lostNote says why node's sandboxes are shown as lost.
func lostNote(node string, l link) string {
	why := l.why
	if why == "" {
		why = "no report from it yet"
	}
	return "its node " + node + " does not answer (" + why + "); it is shown again as it is once the node is back"
}

// view is a reported sandbox as the master shows it: as reported while
// its node reports, lost (with its last known details) when not.
func (f *Fleet) view(node string, sb api.Sandbox, now time.Time) api.Sandbox {
	// A node the master has only just begun to hear (it started, or
	// paired it) is shown as it last reported until it has had time to
	// report again.
	if l, ok := f.linkOf(node); ok && l.lost(now) && !l.young(now) {
		sb.Tier, sb.Transition, sb.Note = api.TierLost, "", lostNote(node, l)
	}
	return sb
}

// unreported is a placed sandbox its node has not reported.
func (f *Fleet) unreported(p store.Placement, now time.Time) api.Sandbox {
	sb := api.Sandbox{ID: p.ID, Name: p.Name, Node: p.Node, Template: p.Template, Principal: p.Principal, MemoryMiB: p.MemoryMiB, Tier: api.TierLost}
	l, ok := f.linkOf(p.Node)
	switch {
	case !ok || l.lost(now) && !l.young(now):
		sb.Note = lostNote(p.Node, l)
	case !l.full:
		sb.Note = "its node " + p.Node + " has not reported it yet"
	default:
		sb.Note = "its node " + p.Node + " reports no such sandbox: it was lost there (delete it, or move it: POST /v1/sandboxes/" + p.ID + "/move)"
	}
	return sb
}

// record keeps what a call to node answered, at once: the caller's next
// GET sees its own change. A report the node read before its answer may
// still arrive after it, over another stream: it carries a lower
// Revision and is dropped (store.PutReported). The node's report of the
// change, and any later one, replace it.
func (f *Fleet) record(ctx context.Context, node string, sbs ...api.Sandbox) {
	for _, sb := range sbs {
		if sb.ID == "" {
			continue
		}
		sb.Node = node
		if err := f.cfg.Store.PutReported(context.WithoutCancel(ctx), node, sb); err != nil {
			f.cfg.Log.Warn("cannot record a node's answer (its next report will)", "node", node, "id", sb.ID, "err", err)
		}
	}
}

// recorder is a node as the master's handlers call it: every call
// has a deadline of its kind (nodeapi.*Deadline) and ends at once if the
// node goes lost meanwhile (bound); what it answers is recorded
// (Fleet.record).
type recorder struct {
	nodeapi.Node
	f *Fleet
}

// bound is ctx for a call to node: ended after d (0: no deadline of its
// own) or as soon as the node is taken for lost. A node already lost is
// not called at all: its error is marked ErrNotSent, which tells a create
// it may try another node.
func (f *Fleet) bound(ctx context.Context, node string, d time.Duration) (context.Context, func(error) error, error) {
	f.mu.RLock()
	l := f.links[node]
	var up context.Context
	lost, why := false, ""
	if l != nil {
		switch {
		case l.up:
			up = l.upCtx
		case l.young(time.Now()):
		default:
			lost, why = true, lostNote(node, *l)
		}
	}
	f.mu.RUnlock()
	if lost {
		return nil, nil, errdefs.Mark(nodeapi.ErrNotSent, errdefs.Mark(errdefs.ErrUnavailable, errors.New(why)))
	}
	// A deadline the node sees too (remote.DeadlineHeader): a call held
	// up on the way is not done after the master gave up on it.
	cctx, cancelDeadline := ctx, context.CancelFunc(func() {})
	if d > 0 {
		cctx, cancelDeadline = context.WithDeadlineCause(ctx, time.Now().Add(d), fmt.Errorf("node %s did not answer within %v", node, d))
	}
	cctx, cancel := context.WithCancelCause(cctx)
	stop := func() bool { return false }
	if up != nil {
		stop = context.AfterFunc(up, func() {
			cancel(fmt.Errorf("node %s was lost during the call (%v)", node, context.Cause(up)))
		})
	}
	done := func(err error) error {
		stop()
		cause := context.Cause(cctx)
		cancel(nil)
		cancelDeadline()
		if err != nil && cause != nil && ctx.Err() == nil {
			// Ended by the deadline or the loss, not by the caller.
			return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("%v: what it did meanwhile shows once it reports again", cause))
		}
		return err
	}
	return cctx, done, nil
}

// memOf is what the master knows of sandbox id's memory limit, for its
// calls' deadlines (0: not known, the longest is assumed).
func (f *Fleet) memOf(ctx context.Context, id string) int {
	if rs, err := f.cfg.Store.FindReported(ctx, id); err == nil && len(rs) > 0 {
		return rs[0].Sandbox.MemoryMiB
	}
	return 0
}

func (r recorder) Create(ctx context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	mem := req.MemoryMiB
	if mem == 0 {
		mem = req.Template.MemoryMiB
	}
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.CreateDeadline(mem))
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := r.Node.Create(cctx, req)
	if err = done(err); err == nil {
		r.f.record(ctx, r.Name(), sb)
	}
	return sb, err
}

func (r recorder) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.ReadDeadline)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := r.Node.Get(cctx, ref)
	return sb, done(err)
}

func (r recorder) SetEgress(ctx context.Context, id string, e api.Egress) (api.Sandbox, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.ReadDeadline)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := r.Node.SetEgress(cctx, id, e)
	if err = done(err); err == nil {
		r.f.record(ctx, r.Name(), sb)
	}
	return sb, err
}

func (r recorder) Usage(ctx context.Context, id string) (api.Usage, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.ReadDeadline)
	if err != nil {
		return api.Usage{}, err
	}
	u, err := r.Node.Usage(cctx, id)
	return u, done(err)
}

// Layer has no deadline of its own (a layer is as large as what a build
// step wrote): the caller's ctx bounds it, and a lost node ends it.
func (r recorder) Layer(ctx context.Context, id string, w io.Writer) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), 0)
	if err != nil {
		return err
	}
	return done(r.Node.Layer(cctx, id, w))
}

func (r recorder) Transition(ctx context.Context, id string, op nodeapi.Op) (api.Sandbox, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.TransitionDeadline(r.f.memOf(ctx, id)))
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := r.Node.Transition(cctx, id, op)
	if err = done(err); err == nil {
		r.f.record(ctx, r.Name(), sb)
	} else if !errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrNotFound) {
		// A transition that failed may still have changed the sandbox (a
		// failed checkpoint re-creates it cold, with a note saying so):
		// what the node has now is recorded too, not left to its next
		// report.
		r.refresh(ctx, id)
	}
	return sb, err
}

// refresh records what the node has of sandbox id now, if it answers
// within nodeapi.ReadDeadline.
func (r recorder) refresh(ctx context.Context, id string) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nodeapi.ReadDeadline)
	defer cancel()
	if sb, err := r.Node.Get(gctx, id); err == nil {
		r.f.record(ctx, r.Name(), sb)
	}
}

func (r recorder) Clone(ctx context.Context, id string, req nodeapi.CloneRequest) (api.CloneResult, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.CloneDeadline(r.f.memOf(ctx, id), req.Count))
	if err != nil {
		return api.CloneResult{}, err
	}
	res, err := r.Node.Clone(cctx, id, req)
	err = done(err)
	r.f.record(ctx, r.Name(), append([]api.Sandbox{res.Parent}, res.Children...)...)
	return res, err
}

func (r recorder) Delete(ctx context.Context, id string) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.DeleteDeadline(r.f.memOf(ctx, id)))
	if err != nil {
		return err
	}
	err = done(r.Node.Delete(cctx, id))
	if err == nil || errors.Is(err, errdefs.ErrNotFound) {
		r.f.cfg.Store.DeleteReported(context.WithoutCancel(ctx), r.Name(), id)
	}
	return err
}

func (r recorder) Logs(ctx context.Context, id string, opt nodeapi.LogOptions, w io.Writer) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), 0)
	if err != nil {
		return err
	}
	return done(r.Node.Logs(cctx, id, opt, w))
}

func (r recorder) EgressLog(ctx context.Context, id string, opt nodeapi.EgressLogOptions, w io.Writer) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), 0)
	if err != nil {
		return err
	}
	return done(r.Node.EgressLog(cctx, id, opt, w))
}

// ServeEnvd is a stream as Logs is: no deadline of its own (a command
// runs as long as it runs), ended at once if the node is taken for lost,
// and refused before it is sent to a node already lost.
func (r recorder) ServeEnvd(w http.ResponseWriter, req *http.Request, id, path string) error {
	cctx, done, err := r.f.bound(req.Context(), r.Name(), 0)
	if err != nil {
		return err
	}
	return done(r.Node.ServeEnvd(w, req.WithContext(cctx), id, path))
}

// ServePort is a stream as ServeEnvd is.
func (r recorder) ServePort(w http.ResponseWriter, req *http.Request, id string, port int) error {
	cctx, done, err := r.f.bound(req.Context(), r.Name(), 0)
	if err != nil {
		return err
	}
	return done(r.Node.ServePort(w, req.WithContext(cctx), id, port))
}

func (r recorder) PrepareTemplate(ctx context.Context, t api.Template) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.TemplateDeadline)
	if err != nil {
		return err
	}
	return done(r.Node.PrepareTemplate(cctx, t))
}

func (r recorder) PutRootfs(ctx context.Context, digest string, tar io.Reader) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.TemplateDeadline)
	if err != nil {
		return err
	}
	return done(r.Node.PutRootfs(cctx, digest, tar))
}

func (r recorder) Layers(ctx context.Context, digests []string) ([]string, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.ReadDeadline)
	if err != nil {
		return nil, err
	}
	missing, err := r.Node.Layers(cctx, digests)
	return missing, done(err)
}

func (r recorder) PutLayer(ctx context.Context, digest string, tar io.Reader) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.TemplateDeadline)
	if err != nil {
		return err
	}
	return done(r.Node.PutLayer(cctx, digest, tar))
}

func (r recorder) DropTemplate(ctx context.Context, name string) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.ReadDeadline)
	if err != nil {
		return err
	}
	return done(r.Node.DropTemplate(cctx, name))
}

func (r recorder) PutRoutes(ctx context.Context, u nodeapi.Routes) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.ReadDeadline)
	if err != nil {
		return err
	}
	return done(r.Node.PutRoutes(cctx, u))
}

func (r recorder) Fence(ctx context.Context, req nodeapi.FenceRequest) (nodeapi.FenceResult, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.FenceDeadline)
	if err != nil {
		return nodeapi.FenceResult{}, err
	}
	res, err := r.Node.Fence(cctx, req)
	return res, done(err)
}

func (r recorder) MoveOut(ctx context.Context, id string, gen int64, w io.Writer) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.MoveDeadline(r.f.memOf(ctx, id)))
	if err != nil {
		return err
	}
	return done(r.Node.MoveOut(cctx, id, gen, w))
}

// MoveIn is not recorded: the arrived copy is not the sandbox's until
// the master commits the move (move.go), and the reported row of its ID
// is the copy it came from until then.
func (r recorder) MoveIn(ctx context.Context, gen int64, rd io.Reader) (api.Sandbox, error) {
	// The memory is the stream's to say; the deadline is the largest.
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.MoveDeadline(0))
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := r.Node.MoveIn(cctx, gen, rd)
	return sb, done(err)
}

func (r recorder) MoveCommit(ctx context.Context, id string, gen int64) (api.Sandbox, error) {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.TransitionDeadline(r.f.memOf(ctx, id)))
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := r.Node.MoveCommit(cctx, id, gen)
	if err = done(err); err == nil {
		r.f.record(ctx, r.Name(), sb)
	}
	return sb, err
}

func (r recorder) MoveAbort(ctx context.Context, id string, gen int64) error {
	cctx, done, err := r.f.bound(ctx, r.Name(), nodeapi.TransitionDeadline(r.f.memOf(ctx, id)))
	if err != nil {
		return err
	}
	return done(r.Node.MoveAbort(cctx, id, gen))
}
