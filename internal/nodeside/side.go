// Package nodeside is the node's side of the master↔node seam: a node as
// nodeapi.Node (issue 15: the seam on its own, so that what imports the
// interface does not import the node), store rows and node errors inside,
// wire types and errdefs kinds outside, and the node's report stream
// (Watch) from its events hub. The master calls it in its own process
// for the node it runs itself; a node apart from its master serves it
// behind nodeapi/remote.Server.
package nodeside

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/ingress"
	"sandstorm/internal/layercache"
	"sandstorm/internal/logstamp"
	"sandstorm/internal/node"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/egresslog"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/store"
	"sandstorm/internal/tier"
)

// Side is a node's side of the seam. It speaks store rows and node errors
// on its inside and wire types and the seam's errors on its outside.
type Side struct {
	N  *node.Node
	St *store.Store // the node's store
	// OwnTemplates: the node's store is its own (serve --node apart from
	// its master), so templates the master gives it are recorded there
	// and dropped from there. Otherwise the store is the master's, which
	// records them itself.
	OwnTemplates bool
	// Rootfs is where a node with its own templates keeps the trees the
	// master sent it, by digest.
	Rootfs rootfs.Cache
	// Layers is where such a node keeps the image layers the master sent
	// it, by tree digest (layers.go): a template of an image whose layers
	// it has is flattened here, not fetched.
	LayerCache layercache.Cache
	// Log says what the node was sent (nil: slog.Default()).
	Log *slog.Logger
	// Events is the node's own hub, which Watch reports from (its
	// master publishes what it hears into a hub of its own: the node in
	// the master's process has a hub apart from the master's too).
	Events *events.Hub
	// Policy is the policy the node's boundaries decide by: a create's
	// egress rules are checked against it (nil: nothing is granted).
	Policy func() *policy.Policy
	// Flows is the node's egress logs, which its boundaries write
	// (nil: none kept, and every sandbox's log is empty).
	Flows *egresslog.Logs
	// Routes is the node's ingress's table (nil: it has no ingress, and
	// ignores the routes it is pushed).
	Routes *ingress.Table
	// ingressAt is where the node's ingress listens (SetIngress; nil:
	// none).
	ingressAt atomic.Pointer[nodeapi.IngressInfo]

	cpu cpuReadings // usage.go
}

var _ nodeapi.Node = (*Side)(nil)

// Name implements nodeapi.Node.
func (l *Side) Name() string { return l.N.Name() }

// Create implements nodeapi.Node. The template's definition is the node's own
// store's copy of req.Template.Name.
func (l *Side) Create(ctx context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	t, err := l.St.GetTemplate(ctx, req.Template.Name)
	if err != nil {
		return api.Sandbox{}, err
	}
	if _, err := (tier.Timers{}).With(req.Idle); err != nil {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrBadInput, err)
	}
	if err := l.checkEgress(createdPrincipal(t, req), req.Egress); err != nil {
		return api.Sandbox{}, err
	}
	sb, err := l.N.Create(ctx, t, req.Name, req.Principal, req.MemoryMiB, req.Generation, req.Egress, req.Secrets)
	if err == nil && req.Idle != nil {
		if err := l.N.SetIdle(ctx, sb.ID, req.Idle); err != nil {
			// Not as asked: not made (it idles by the node's timers
			// otherwise, which its creator did not want).
			l.N.Delete(context.WithoutCancel(ctx), sb.ID)
			return api.Sandbox{}, err
		}
		sb.Idle = req.Idle
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	if req.Note != "" {
		if s, err := l.St.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error { s.Note = req.Note; return nil }); err == nil {
			sb = s
			l.Events.Publish(events.Event{Kind: events.Update, ID: sb.ID, Name: sb.Name, Node: l.N.Name()})
		}
	}
	return l.wire(sb), nil
}

// Get implements nodeapi.Node.
func (l *Side) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	sb, err := l.N.Get(ctx, ref)
	if err != nil {
		return api.Sandbox{}, err
	}
	return l.wire(sb), nil
}

// List implements nodeapi.Node.
func (l *Side) List(ctx context.Context) ([]api.Sandbox, error) {
	all, err := l.N.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Sandbox, 0, len(all))
	for _, sb := range all {
		out = append(out, l.wire(sb))
	}
	return out, nil
}

// Delete implements nodeapi.Node.
func (l *Side) Delete(ctx context.Context, id string) error {
	return l.N.Delete(ctx, id)
}

// Transition implements nodeapi.Node.
func (l *Side) Transition(ctx context.Context, id string, op nodeapi.Op) (api.Sandbox, error) {
	var (
		sb  store.Sandbox
		err error
	)
	switch op {
	case nodeapi.Freeze:
		sb, err = l.N.Freeze(ctx, id)
	case nodeapi.Snapshot:
		sb, err = l.N.Snapshot(ctx, id)
	case nodeapi.Detach:
		sb, err = l.N.Detach(ctx, id)
	case nodeapi.Wake:
		if err = l.N.Wake(ctx, id); err == nil {
			sb, err = l.N.Get(ctx, id)
		}
	default:
		return api.Sandbox{}, fmt.Errorf("%w: no transition %q: use freeze, snapshot, detach or wake", errdefs.ErrBadInput, op)
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	return l.wire(sb), nil
}

// Clone implements nodeapi.Node.
func (l *Side) Clone(ctx context.Context, id string, req nodeapi.CloneRequest) (api.CloneResult, error) {
	if _, err := (tier.Timers{}).With(req.Idle); err != nil {
		return api.CloneResult{}, errdefs.Mark(errdefs.ErrBadInput, err)
	}
	res, err := l.N.Clone(ctx, id, req.Count, req.Principal, req.Reseed, req.Generation)
	out := api.CloneResult{Children: []api.Sandbox{}, ParentPauseMs: ms(res.ParentPause)}
	if res.Parent.ID != "" {
		out.Parent = l.wire(res.Parent)
	}
	for i, c := range res.Children {
		if req.Idle != nil {
			if ierr := l.N.SetIdle(ctx, c.ID, req.Idle); ierr != nil && err == nil {
				err = fmt.Errorf("child %s: its idle timers: %w", c.ID, ierr)
			}
			c.Idle = req.Idle
		}
		out.Children = append(out.Children, l.wire(c))
		out.ChildMs = append(out.ChildMs, ms(res.ChildTimes[i]))
	}
	return out, err
}

// Status implements nodeapi.Node.
func (l *Side) Status(ctx context.Context) (api.NodeStatus, error) {
	st, err := l.N.Status(ctx)
	if err == nil {
		st.Runsc = l.N.RunscBuilds(ctx)
	}
	return st, err
}

// PrepareTemplate implements nodeapi.Node. A node with its own templates keeps
// each rootfs it is given by digest in Rootfs (rootfs.Cache) and records
// the template with that tree; it answers errdefs.ErrPrecondition for a digest it
// has not got, and the master then sends it. The node in the master's
// process shares the master's store, whose row already names the tree.
// Then it makes a warm template's image.
func (l *Side) PrepareTemplate(ctx context.Context, t api.Template) error {
	if l.OwnTemplates {
		if !rootfs.ValidDigest(t.Digest) {
			return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("template %s: digest %q is not sha256:<64 hex digits>", t.Name, t.Digest))
		}
		dir, err := l.tree(t)
		if err != nil {
			return err
		}
		if old, err := l.St.GetTemplate(ctx, t.Name); err == nil && old.Digest != t.Digest {
			return errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("template %s: node %s has one of that name with another rootfs (%s); delete the template and register it again", t.Name, l.N.Name(), old.Digest))
		} else if errors.Is(err, errdefs.ErrNotFound) {
			rec := store.Template{Name: t.Name, Rootfs: dir, Digest: t.Digest, Layers: t.Layers, Process: t.Process, Ports: t.Ports, MemoryMiB: t.MemoryMiB, Principal: t.Principal, Warm: t.Warm, Serves: t.Serves, CreatedAt: t.CreatedAt}
			if err := l.St.PutTemplate(ctx, rec); err != nil && !errors.Is(err, errdefs.ErrExists) {
				return err
			}
		}
	}
	if t.Warm == nil {
		return nil
	}
	st, err := l.St.GetTemplate(ctx, t.Name)
	if err != nil {
		return err
	}
	return l.N.PrepareWarm(ctx, st)
}

// PutRootfs implements Node: the tree goes into the node's cache if its
// stream hashes to digest (rootfs.Cache.Put, which also refuses what
// could escape the tree).
func (l *Side) PutRootfs(ctx context.Context, digest string, tar io.Reader) error {
	if !l.OwnTemplates {
		// The master's own node reads the master's trees where they are.
		return nil
	}
	if !rootfs.ValidDigest(digest) {
		return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("%q is not a rootfs digest (sha256:<64 hex digits>)", digest))
	}
	if _, err := l.Rootfs.Put(digest, tar, rootfs.Limits{}); err != nil {
		if errors.Is(err, rootfs.ErrDigestMismatch) || errors.Is(err, rootfs.ErrUnsafe) || errors.Is(err, rootfs.ErrTooLarge) {
			return errdefs.Mark(errdefs.ErrBadInput, err)
		}
		return err
	}
	return nil
}

// DropTemplate implements nodeapi.Node. A rootfs no other template of the node
// uses goes with it.
func (l *Side) DropTemplate(ctx context.Context, name string) error {
	l.N.DropWarm(name)
	if !l.OwnTemplates {
		return nil
	}
	t, err := l.St.GetTemplate(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := l.St.DeleteTemplate(ctx, name); err != nil {
		return err
	}
	ts, err := l.St.ListTemplates(ctx)
	if err != nil {
		return err
	}
	l.dropLayers(t.Layers, ts)
	for _, o := range ts {
		if o.Digest == t.Digest {
			return nil
		}
	}
	return l.Rootfs.Remove(t.Digest)
}

// wire is a sandbox row as the API shows it.
func (l *Side) wire(sb store.Sandbox) api.Sandbox {
	return api.Sandbox{
		ID: sb.ID, Name: sb.Name, Template: sb.Template, Node: sb.Node, Backend: sb.Backend,
		Tier: sb.Tier, Transition: sb.Transition, Address: l.N.Address(sb),
		Endpoints: l.N.Endpoints(sb), HostEndpoints: l.N.HostEndpoints(sb), LastActive: sb.LastActive, CreatedAt: sb.CreatedAt,
		LastWakeMs: sb.LastWakeMs, LastWakeFrom: sb.LastWakeFrom, Note: sb.Note,
		Principal: node.PrincipalOf(sb), Boundary: l.N.BoundarySocket(sb.ID),
		MemoryMiB: sb.MemoryMiB, Generation: sb.Generation, Revision: sb.Rev, LeftBehind: sb.LeftBehind, Idle: sb.Idle, Egress: sb.Egress,
		Runsc:  sb.Runsc,
		Moving: moving(sb), MoveGeneration: sb.MoveOut,
	}
}

func moving(sb store.Sandbox) string {
	switch {
	case sb.MoveOut != 0:
		return api.MovingOut
	case sb.MoveIn:
		return api.MovingIn
	}
	return ""
}

// MoveOut implements nodeapi.Node.
func (l *Side) MoveOut(ctx context.Context, id string, gen int64, w io.Writer) error {
	return l.N.MoveOut(ctx, id, gen, w)
}

// MoveIn implements nodeapi.Node.
func (l *Side) MoveIn(ctx context.Context, gen int64, r io.Reader) (api.Sandbox, error) {
	sb, err := l.N.MoveIn(ctx, gen, r)
	if err != nil {
		return api.Sandbox{}, err
	}
	return l.wire(sb), nil
}

// MoveCommit implements nodeapi.Node.
func (l *Side) MoveCommit(ctx context.Context, id string, gen int64) (api.Sandbox, error) {
	sb, err := l.N.MoveCommit(ctx, id, gen)
	if err != nil {
		return api.Sandbox{}, err
	}
	return l.wire(sb), nil
}

// MoveAbort implements nodeapi.Node.
func (l *Side) MoveAbort(ctx context.Context, id string, gen int64) error {
	return l.N.MoveAbort(ctx, id, gen)
}

// ServeEnvd implements nodeapi.Node.
func (l *Side) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	if err := l.fenced(r, id); err != nil {
		return err
	}
	return l.N.Serve(w, r, id, api.EnvdPort, path)
}

// ServePort implements nodeapi.Node.
func (l *Side) ServePort(w http.ResponseWriter, r *http.Request, id string, port int) error {
	if err := l.fenced(r, id); err != nil {
		return err
	}
	return l.N.Serve(w, r, id, port, r.URL.Path)
}

// fenced checks a request an ingress forwarded by a route (it carries
// the route's generation): only the copy of that placement serves it,
// so a route a move left stale reaches nothing (errdefs.ErrNotFound)
// and the ingress waits for the new one. The master's own calls carry
// none: it finds the sandbox itself.
func (l *Side) fenced(r *http.Request, id string) error {
	g := r.Header.Get(nodeapi.RouteGenerationHeader)
	if g == "" {
		return nil
	}
	r.Header.Del(nodeapi.RouteGenerationHeader)
	sb, err := l.N.Get(r.Context(), id)
	if err != nil {
		return err
	}
	if strconv.FormatInt(sb.Generation, 10) != g || sb.MoveIn || sb.LeftBehind {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: no copy of placement %s here (moved)", id, g)
	}
	// Leaving by a move: the master's push of the new route is on its way
	// (or, the move undone, the same route serves here again). Either way
	// the ingress waits for its table, not the caller (a 503 for "being
	// moved" reached E2B's SDK in CI's TestIngress before).
	if sb.MoveOut != 0 {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: placement %s is leaving this node by a move", id, g)
	}
	return nil
}

// PutRoutes implements nodeapi.Node.
func (l *Side) PutRoutes(_ context.Context, u nodeapi.Routes) error {
	if err := u.Check(); err != nil || l.Routes == nil {
		return err
	}
	return l.Routes.Apply(u)
}

// SetIngress records where the node's ingress listens, for its peers
// (Ingress).
func (l *Side) SetIngress(in nodeapi.IngressInfo) { l.ingressAt.Store(&in) }

// Ingress implements nodeapi.Node.
func (l *Side) Ingress(context.Context) (nodeapi.IngressInfo, error) {
	if in := l.ingressAt.Load(); in != nil {
		return *in, nil
	}
	return nodeapi.IngressInfo{}, errdefs.New(errdefs.ErrNotFound, "node serves no ingress (serve --ingress-listen)")
}

// Fence implements nodeapi.Node.
func (l *Side) Fence(ctx context.Context, req nodeapi.FenceRequest) (nodeapi.FenceResult, error) {
	ids, err := l.N.Fence(ctx, req.Generation, req.Keep, req.InFlight)
	return nodeapi.FenceResult{Retired: append([]string{}, ids...)}, err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Logs implements Node: the last 64 KiB of the sandbox's console output
// (its stdout and stderr, with the node's "--- <time> sandstorm: …" lines
// where it was started, restored or stopped), then with Follow what is
// appended, until ctx ends or the sandbox is deleted. w is flushed after
// each write if it can be (http.Flusher).
func (l *Side) Logs(ctx context.Context, id string, opt nodeapi.LogOptions, w io.Writer) error {
	sb, err := l.N.Get(ctx, id)
	if err != nil {
		return err
	}
	path := l.N.Dir(sb.ID).Log()
	gone := func() bool {
		_, err := l.N.Get(ctx, sb.ID)
		return errors.Is(err, errdefs.ErrNotFound)
	}
	fl, _ := w.(interface{ Flush() })
	flush := func() {
		if fl != nil {
			fl.Flush()
		}
	}
	if opt.Timestamps {
		return stampedLogs(ctx, path, opt.Follow, w, flush, gone)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && !opt.Follow {
		return nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if f != nil {
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.Size() > logTail {
			f.Seek(fi.Size()-logTail, io.SeekStart)
		}
		io.Copy(w, f)
	}
	if !opt.Follow {
		return nil
	}
	flush()
	// The console log is a plain file the sandbox writes itself (it must
	// outlive sandstormd), so following it is reading what was appended,
	// a few times a second.
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if f == nil {
			if f, err = os.Open(path); err != nil {
				f = nil
				continue
			}
			defer f.Close()
		}
		if n, _ := io.Copy(w, f); n > 0 {
			flush()
		}
		if gone() {
			return nil
		}
	}
}

// logTail is how much of a console log a request starts with.
const logTail = 64 << 10

// followPoll is how often a followed log is read for what was appended.
const followPoll = 200 * time.Millisecond

// stampedLogs is Logs with every line prefixed by the time it was written
// (internal/logstamp): the last 64 KiB from the start of a line, then, when
// following, each line once it is complete.
func stampedLogs(ctx context.Context, path string, follow bool, w io.Writer, flush func(), gone func() bool) error {
	var from int64
	if fi, err := os.Stat(path); err == nil && fi.Size() > logTail {
		from = lineStart(path, fi.Size()-logTail)
	}
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	for {
		if next, err := logstamp.Annotate(path, from, w); err == nil {
			from = next
			flush()
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if gone() {
			return nil
		}
	}
}

// lineStart is the offset of the first line that starts at or after off.
func lineStart(path string, off int64) int64 {
	f, err := os.Open(path)
	if err != nil {
		return off
	}
	defer f.Close()
	f.Seek(off, io.SeekStart)
	buf := make([]byte, 4096)
	n, _ := f.Read(buf)
	if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
		return off + int64(i) + 1
	}
	return off
}

// Watch implements Node: the node's events hub is what it reports; each
// event is followed by the sandbox it concerns read afresh, so a report
// is never older than the change it follows.
func (l *Side) Watch(ctx context.Context, send func(nodeapi.Report) error) error {
	if l.Events == nil {
		return errdefs.Mark(errdefs.ErrNotSupported, errors.New("this node keeps no event hub to report from"))
	}
	// Subscribe before the full report: a change made while it is read
	// is then also sent after it (and read afresh, so sending it twice
	// is harmless).
	_, live, cancel := l.Events.Subscribe(1024)
	defer cancel()
	last := l.Events.Seq()
	full := func() error {
		sbs, err := l.List(ctx)
		if err != nil {
			return err
		}
		st, err := l.Status(ctx)
		if err != nil {
			return err
		}
		return send(nodeapi.Report{Full: true, Sandboxes: append([]api.Sandbox{}, sbs...), Status: &st})
	}
	if err := full(); err != nil {
		return err
	}
	beat := time.NewTicker(nodeapi.HeartbeatEvery)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-live:
			if e.Seq > last+1 {
				// The hub dropped events for us (we were slow): what
				// they said is lost, so send everything again.
				last = e.Seq
				if err := full(); err != nil {
					return err
				}
				continue
			}
			if e.Seq > last {
				last = e.Seq
			}
			r := nodeapi.Report{Event: &e}
			if e.ID != "" {
				sb, err := l.Get(ctx, e.ID)
				switch {
				case err == nil:
					r.Sandbox = &sb
				case errors.Is(err, errdefs.ErrNotFound):
					r.Gone = e.ID
				default:
					return err
				}
			}
			if err := send(r); err != nil {
				return err
			}
		case ask := <-l.Routes.Resumes():
			// The ingress's ask: the master resumes it and pushes.
			if time.Now().After(ask.Until) {
				continue // its request stopped waiting
			}
			if err := send(nodeapi.Report{Resume: ask.ID}); err != nil {
				return err
			}
		case <-beat.C:
			st, err := l.Status(ctx)
			if err != nil {
				return err
			}
			if err := send(nodeapi.Report{Status: &st}); err != nil {
				return err
			}
		}
	}
}

// createdPrincipal is who a created sandbox's boundary will be (node:
// host.NamesOf, host.PrincipalOf): its principal, its template's, else
// its name.
func createdPrincipal(t store.Template, req nodeapi.CreateRequest) string {
	for _, p := range []string{req.Principal, t.Principal} {
		if p != "" {
			return p
		}
	}
	return req.Name
}

// SetEgress implements nodeapi.Node: the rules are checked as a create's
// are, against the principal the sandbox's boundary is.
func (l *Side) SetEgress(ctx context.Context, id string, e api.Egress) (api.Sandbox, error) {
	sb, err := l.N.Get(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	rules := &e
	if len(e.AllowOut)+len(e.DenyOut) == 0 {
		rules = nil
	}
	if err := l.checkEgress(node.PrincipalOf(sb), rules); err != nil {
		return api.Sandbox{}, err
	}
	if sb, err = l.N.SetEgress(ctx, sb.ID, rules); err != nil {
		return api.Sandbox{}, err
	}
	return l.wire(sb), nil
}

// EgressLog implements nodeapi.Node from the node's egress logs (Flows),
// which its boundaries write. w is flushed after each page if it can be.
func (l *Side) EgressLog(ctx context.Context, id string, opt nodeapi.EgressLogOptions, w io.Writer) error {
	sb, err := l.N.Get(ctx, id)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	fl, _ := w.(interface{ Flush() })
	for after, limit, first := opt.After, opt.Limit, true; ; limit, first = 0, false {
		p := l.Flows.Page(sb.ID, after, limit)
		if len(p.Items) > 0 || first {
			if err := enc.Encode(p); err != nil {
				return err
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if !opt.Follow {
			return nil
		}
		after = p.Next
		// Woken by a new flow or its deletion; every 30 s it looks whether
		// the sandbox is still here (deleted as this began, say).
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := l.Flows.Wait(wctx, sb.ID, after)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if _, gerr := l.N.Get(ctx, sb.ID); errors.Is(err, egresslog.ErrDropped) || errors.Is(gerr, errdefs.ErrNotFound) {
			// Said, so that its reader knows the log is over, not cut.
			return enc.Encode(api.EgressPage{Items: []api.EgressFlow{}, Next: after, End: api.EgressEndGone})
		}
	}
}

// checkEgress refuses egress rules that do not parse (400), and names in
// allow_out that the policy does not grant the sandbox's principal (403):
// they could never go out, and a team asking for them is told so at once
// rather than finding its flows refused. (The rules only narrow, so this
// is the user's answer, not the fence: the boundary checks every flow.)
func (l *Side) checkEgress(principal string, e *api.Egress) error {
	if e == nil {
		return nil
	}
	r, err := egress.Parse(e.AllowOut, e.DenyOut)
	if err != nil {
		return errdefs.New(errdefs.ErrBadInput, "egress: %v", err)
	}
	var p *policy.Policy
	if l.Policy != nil {
		p = l.Policy()
	}
	var missing []string
	for _, n := range r.Names() {
		if p == nil || !p.For(principal).Egress(n) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 && principal == "" {
		return errdefs.New(errdefs.ErrForbidden, "egress: allow_out %s: a sandbox with no name and no principal is principal sb-<id>, which no policy grants anything; create it from a template with a principal the policy grants these (sandstormd template create … --principal P; E2B's SDK names only a template), or name it on our API", strings.Join(missing, ", "))
	}
	if len(missing) > 0 {
		return errdefs.New(errdefs.ErrForbidden, "egress: allow_out %s: not granted to principal %q by the policy; a sandbox's rules only narrow what its policy grants", strings.Join(missing, ", "), principal)
	}
	return nil
}
