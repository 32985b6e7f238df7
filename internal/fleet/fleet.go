// Package fleet is the master's view of its nodes (issue 9): the node in
// its own process, if it runs one, and the nodes it paired with, reached
// over the seam (internal/nodeapi). Every node is held alike (issue 30):
// the fleet places new sandboxes by memory headroom (internal/placement
// decides; a node that refuses passes the sandbox to the next), records
// which node each sandbox is on (its placement), hears each node's
// reports, fences it, and says which nodes do not answer. What is a
// paired node's alone is its pairing: its certificate, renewed and
// revoked, and its address or tunnel.
package fleet

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/enrol"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/events"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/pki"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/store"
)

// statusWait bounds how long a node has to answer a status; one that does
// not is lost for that placement or listing.
const statusWait = 3 * time.Second

// Config configures a fleet.
type Config struct {
	Store *store.Store
	CA    *pki.CA
	// Local is the node in the master's process (nil: none). It is a
	// member as a paired node is; it must report (Watch) from a hub of its
	// own, not Events, which the fleet publishes what it hears into.
	Local nodeapi.Node
	Log   *slog.Logger
	// Events, if set, is the master's hub: paired nodes' reported events
	// are published there too (the console's live view).
	Events *events.Hub
	// Layer finds the master's directory of the image layer whose tree
	// digest is digest (layercache.Index.Layer), for a node that lacks
	// it (nil: templates go to nodes as whole trees only).
	Layer func(digest string) (dir string, ok bool)
	// Changed, if set, is told when a placement may have changed (a
	// create, a delete, a move confirmed): the routes every node's
	// ingress follows are pushed anew (internal/routes).
	Changed func()
	// Reconnected, if set, is told when a node's report stream comes up
	// (again): the node may have restarted and lost what it was pushed
	// (routes.Publisher.Forget).
	Reconnected func(node string)
	// Resume, if set, is told of a node's ask to resume a sandbox its
	// ingress had traffic for (nodeapi.Report.Resume): E2B's autoResume,
	// which only the master records (internal/e2b).
	Resume func(node, id string)
}

// changed tells Changed, if set.
func (c Config) changed() {
	if c.Changed != nil {
		c.Changed()
	}
}

// Fleet is the master's nodes.
type Fleet struct {
	cfg Config
	mu  sync.RWMutex
	// nodes is every member by name: the node in this process and the
	// paired ones (a *remote.Client each: over the network, or a tunnel).
	nodes   map[string]nodeapi.Node
	addrs   map[string]string
	links   map[string]*link // reports.go
	revoked map[string]time.Time
	runCtx  context.Context // set by Run: watchers live under it

	fly       inflight               // place.go
	deleting  deletes                // place.go
	resolving map[string]*sync.Mutex // place.go, under mu
	draining  draining               // move.go
}

// New loads the paired nodes from the store.
func New(ctx context.Context, cfg Config) (*Fleet, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	f := &Fleet{cfg: cfg, nodes: map[string]nodeapi.Node{}, addrs: map[string]string{}, links: map[string]*link{}}
	var err error
	if f.revoked, err = cfg.Store.Enrol().Revocations(ctx); err != nil {
		return nil, err
	}
	ns, err := cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		if err := f.add(n.Name, n.Address); err != nil {
			return nil, err
		}
		if n.Draining {
			f.draining.set(n.Name, true)
		}
	}
	// An attempt that never got as far as naming a node was cut short by
	// this master's own death before any node was asked: it only held the
	// name. (One that named a node is settled with that node's reports.)
	ps, err := cfg.Store.ListAllPlacements(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		if p.State == store.PlacementCreating && p.Node == "" {
			cfg.Store.DeletePlacement(ctx, p.ID)
		}
	}
	if cfg.Local != nil {
		f.nodes[cfg.Local.Name()] = cfg.Local
		if err := adopt(ctx, cfg, ps); err != nil {
			return nil, err
		}
	}
	// A template registered before templates had digests gets one now:
	// a node fetches and checks its rootfs by it.
	ts, err := cfg.Store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		if t.Digest != "" {
			continue
		}
		d, err := rootfs.Digest(t.Rootfs)
		if err != nil {
			cfg.Log.Warn("template: cannot read its rootfs to name it by digest; no paired node can take it", "template", t.Name, "err", err)
			continue
		}
		if err := cfg.Store.SetTemplateDigest(ctx, t.Name, d); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// adopt records a placement for each sandbox of the node in the master's
// process (cfg.Local) that has none: those a master made there before
// every node was placed alike (issue 30), which the node's first fence
// would otherwise retire as not its master's.
func adopt(ctx context.Context, cfg Config, ps []store.Placement) error {
	n := cfg.Local
	placed := make(map[string]bool, len(ps))
	for _, p := range ps {
		placed[p.ID] = true
	}
	all, err := n.List(ctx)
	if err != nil {
		return fmt.Errorf("adopt the sandboxes of node %s: %w", n.Name(), err)
	}
	for _, sb := range all {
		if placed[sb.ID] || sb.LeftBehind {
			continue
		}
		p := store.Placement{ID: sb.ID, Name: sb.Name, Node: n.Name(), Template: sb.Template, Principal: sb.Principal, MemoryMiB: sb.MemoryMiB, Generation: sb.Generation}
		if err := cfg.Store.PutPlacement(ctx, p); err != nil {
			// Its name is another's placement: the fence retires it, as
			// any sandbox its master did not place.
			cfg.Log.Warn("a sandbox of the master's own node cannot be placed (its name is taken)", "node", n.Name(), "id", sb.ID, "name", sb.Name, "err", err)
			continue
		}
		cfg.Log.Info("placement recorded for a sandbox of the master's own node", "node", n.Name(), "id", sb.ID, "name", sb.Name)
	}
	return nil
}

// tunnelAddress is what the store has as the address of a node that dials
// in (enrol.Joiner): it is reached only through its tunnel.
func tunnelAddress(name string) string { return "tunnel:" + name }

func (f *Fleet) add(name, address string) error {
	if strings.HasPrefix(address, "tunnel:") {
		// Until it dials in, its calls fail: it is lost.
		f.mu.Lock()
		f.nodes[name], f.addrs[name] = enrol.NoTunnel(name), address
		f.mu.Unlock()
		f.startWatch(name)
		return nil
	}
	c, err := enrol.Dial(name, address, f.cfg.CA, func(cert *x509.Certificate) error { return f.checkCert(name, cert) })
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.nodes[name], f.addrs[name] = c, address
	f.mu.Unlock()
	f.startWatch(name)
	return nil
}

// checkCert refuses a certificate of node name issued before the node
// was forgotten. Forgetting a node that does not answer cannot take its
// certificate back, and it is good for up to enrol.NodeCertLifetime:
// this is its revocation, by time (pki.Backdate says when it was
// issued), so a node paired or joined again under the same name, whose
// new certificate is younger, is taken. To the second: one issued in the
// very second of the forgetting is not refused.
func (f *Fleet) checkCert(name string, cert *x509.Certificate) error {
	f.mu.RLock()
	at, ok := f.revoked[name]
	f.mu.RUnlock()
	if !ok {
		return nil
	}
	issued := cert.NotBefore.Add(pki.Backdate)
	if issued.Before(at.Truncate(time.Second)) {
		return fmt.Errorf("node %s's certificate (issued %s) was revoked when the node was forgotten at %s: pair it again (POST /v1/nodes) or join it with a new token",
			name, issued.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339))
	}
	return nil
}

// renewEvery is how often the master looks at its nodes' certificates.
const renewEvery = 10 * time.Minute

// Run hears every paired node's reports (reports.go) and renews their
// certificates once a third of their lifetime is left (enrol.Renew),
// until ctx ends.
func (f *Fleet) Run(ctx context.Context) {
	f.mu.Lock()
	f.runCtx = ctx
	names := make([]string, 0, len(f.nodes))
	for n := range f.nodes {
		names = append(names, n)
	}
	f.mu.Unlock()
	for _, n := range names {
		f.startWatch(n)
	}
	t := time.NewTicker(renewEvery)
	defer t.Stop()
	settle := time.NewTicker(resolveEvery)
	defer settle.Stop()
	f.renewDue(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.renewDue(ctx)
		case <-settle.C:
			f.resolveDue(ctx)
		}
	}
}

func (f *Fleet) renewDue(ctx context.Context) {
	f.mu.RLock()
	type due struct {
		c    *remote.Client
		addr string
	}
	var ds []due
	for n, m := range f.nodes {
		if c, ok := m.(*remote.Client); ok { // the node in this process has no certificate
			ds = append(ds, due{c, f.addrs[n]})
		}
	}
	f.mu.RUnlock()
	for _, d := range ds {
		if d.c.PeerNotAfter().IsZero() {
			sctx, cancel := context.WithTimeout(ctx, statusWait)
			d.c.Status(sctx) // to see its certificate
			cancel()
		}
		na := d.c.PeerNotAfter()
		if na.IsZero() || time.Until(na) > enrol.NodeCertLifetime/3 {
			continue
		}
		host, _, err := net.SplitHostPort(d.addr)
		if err != nil {
			host = d.addr
		}
		if until, err := enrol.Renew(ctx, d.c, f.cfg.CA, host); err != nil {
			f.cfg.Log.Warn("could not renew a node's certificate; retrying later", "node", d.c.NodeName, "ends", na, "err", err)
		} else {
			f.cfg.Log.Info("node certificate renewed", "node", d.c.NodeName, "until", until)
		}
	}
}

// Local is the node in the master's process (nil if none).
func (f *Fleet) Local() nodeapi.Node { return f.cfg.Local }

// Nodes is every node as the master's handlers call it: the one in this
// process first (if any), then the paired ones by name.
func (f *Fleet) Nodes() []nodeapi.Node {
	f.mu.RLock()
	defer f.mu.RUnlock()
	names := make([]string, 0, len(f.nodes))
	for n := range f.nodes {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if f.cfg.Local != nil && (a == f.cfg.Local.Name()) != (b == f.cfg.Local.Name()) {
			if a == f.cfg.Local.Name() {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	out := make([]nodeapi.Node, 0, len(names))
	for _, n := range names {
		out = append(out, recorder{f.nodes[n], f})
	}
	return out
}

// member is node name as the master's handlers call it (nil if the fleet
// has no such node).
func (f *Fleet) member(name string) nodeapi.Node {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if n := f.nodes[name]; n != nil {
		return recorder{n, f}
	}
	return nil
}

// Find is the sandbox whose ID or name is ref, and its node, without
// asking the node: the master's placement and the node's last report of
// it (reports.go), else a report with no placement — a copy a move left
// behind on a node that came back, which a person deletes by its ID.
func (f *Fleet) Find(ctx context.Context, ref string) (nodeapi.Node, api.Sandbox, error) {
	now := time.Now()
	p, err := f.cfg.Store.GetPlacement(ctx, ref)
	switch {
	case err == nil && p.State == store.PlacementCreating:
		n := f.member(p.Node)
		if n == nil {
			return nil, api.Sandbox{}, errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("sandbox %q: not found (a create of that name is under way)", ref))
		}
		return n, f.pending(p), nil
	case err == nil:
		n := f.member(p.Node)
		if n == nil {
			return nil, api.Sandbox{}, errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("sandbox %s is on node %s, which this master no longer has", p.Name, p.Node))
		}
		rs, err := f.cfg.Store.FindReported(ctx, p.ID)
		if err != nil {
			return nil, api.Sandbox{}, err
		}
		// The report of this ID: a name also finds a copy a move left
		// behind on a node that came back (another ID).
		for _, r := range rs {
			if r.Sandbox.ID == p.ID {
				return n, f.view(p.Node, r.Sandbox, now), nil
			}
		}
		if l, ok := f.linkOf(p.Node); !ok || l.young(now) {
			// The master has just started hearing the node and has not had its
			// full report yet: ask it, this once.
			gctx, cancel := context.WithTimeout(ctx, statusWait)
			defer cancel()
			if sb, err := n.Get(gctx, p.ID); err == nil {
				return n, sb, nil
			}
		}
		return n, f.unreported(p, now), nil
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, api.Sandbox{}, err
	}
	rs, err := f.cfg.Store.FindReported(ctx, ref)
	if err != nil {
		return nil, api.Sandbox{}, err
	}
	for _, r := range rs {
		if n := f.member(r.Node); n != nil {
			return n, leftBehind(r.Node, f.view(r.Node, r.Sandbox, now)), nil
		}
	}
	return nil, api.Sandbox{}, errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("sandbox %q: not found", ref))
}

// leftBehind is sb, which its node has but the master did not put there
// (node.Fence stops it as soon as the node hears the master; until then
// it may still run).
func leftBehind(node string, sb api.Sandbox) api.Sandbox {
	if !sb.LeftBehind {
		sb.Note = "left behind on " + node + ": this master did not place it there (a create cut short, or a move while the node was lost); it is stopped as soon as the node hears the master. Delete it by its ID (" + sb.ID + ")"
	}
	return sb
}

// Move creates sandbox ref again, cold, on another node, when its own
// node is lost: same name, template, principal and memory; a new ID, and
// a note saying what stayed behind (its memory, its volume). A sandbox
// whose node answers is moved with its memory instead (LiveMove, move.go).
func (f *Fleet) Move(ctx context.Context, ref string) (api.Sandbox, error) {
	defer f.cfg.changed()
	p, err := f.cfg.Store.GetPlacement(ctx, ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s is not on a paired node (only a sandbox whose node is lost can be moved)", ref))
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	switch p.State {
	case store.PlacementCreating:
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s is a create its node %s has not answered yet, which is not moved: wait for the node, or give the create up (DELETE /v1/sandboxes/%s: while the node is lost, what it made may still run there until it hears this master, as with a move)", p.Name, p.Node, p.ID))
	case store.PlacementDeleting:
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s is being deleted; it is not moved", p.Name))
	case store.PlacementMoving, store.PlacementMoved:
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s is being moved live between nodes %s and %s; that move is settled when both answer", p.Name, p.Node, p.MoveNode))
	}
	// Lost is what its reports say (or, with none heard, whether it
	// answers a status now).
	answers := false
	if l, ok := f.linkOf(p.Node); ok && !l.heard.IsZero() {
		answers = !l.lost(time.Now())
	} else if n := f.member(p.Node); n != nil {
		answers = f.liveStatus(ctx, n).State != "lost"
	}
	if answers {
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s's node %s answers: it is moved live (LiveMove), not cold", p.Name, p.Node))
	}
	t, err := f.cfg.Store.GetTemplate(ctx, p.Template)
	if err != nil {
		return api.Sandbox{}, err
	}
	// The name is free for the new one only once the old placement goes;
	// if the create fails, it comes back.
	if err := f.cfg.Store.DeletePlacement(ctx, p.ID); err != nil {
		return api.Sandbox{}, err
	}
	note := fmt.Sprintf("moved from node %s, which was lost, as a cold start: its memory and its volume stayed on %s (as sandbox %s). Until %s hears this master again, that copy may still run and answer whoever reaches it, as principal %s; once it does, the copy is stopped and never runs again (kept detached only if its volume holds files)",
		p.Node, p.Node, p.ID, p.Node, principalOr(p))
	sb, err := f.Create(ctx, nodeapi.CreateRequest{Template: Wire(t), Name: p.Name, Principal: p.Principal, MemoryMiB: p.MemoryMiB, Note: note})
	if err != nil {
		f.cfg.Store.PutPlacement(context.WithoutCancel(ctx), p)
		return api.Sandbox{}, err
	}
	f.cfg.Log.Info("sandbox moved off a lost node", "name", p.Name, "from", p.Node, "old_id", p.ID, "to", sb.Node, "id", sb.ID)
	return sb, nil
}

func principalOr(p store.Placement) string {
	if p.Principal != "" {
		return p.Principal
	}
	return p.Name
}

// taken is why a create of name cannot have it: a sandbox has it (409),
// or an attempt whose node has not said whether it made it (503: retry).
func (f *Fleet) taken(ctx context.Context, name string) error {
	p, err := f.cfg.Store.GetPlacement(ctx, name)
	if err == nil && p.State == store.PlacementCreating {
		if !f.fly.all()[p.Generation] {
			return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("a create of sandbox %q on node %s is not settled: the node did not answer it, and the master learns whether it was made when the node reports again; retry in a few seconds", name, p.Node))
		}
	}
	return errdefs.Mark(errdefs.ErrExists, fmt.Errorf("sandbox %q: already exists", name))
}

// Statuses is every node's status: the local node's read now, a paired
// node's from its last heartbeat (reports.go), or "lost" with why. Only
// in the first seconds after the master starts, before a node has
// reported, or in those after its pairing, is it asked (within
// statusWait).
func (f *Fleet) Statuses(ctx context.Context) []api.NodeStatus {
	nodes := f.Nodes()
	out := make([]api.NodeStatus, len(nodes))
	now := time.Now()
	var wg sync.WaitGroup
	for i, n := range nodes {
		name := n.Name()
		f.mu.RLock()
		addr := f.addrs[name]
		f.mu.RUnlock()
		draining := f.draining.has(name)
		if l, ok := f.linkOf(name); ok && !l.young(now) {
			st := l.status
			if l.lost(now) {
				st = api.NodeStatus{State: "lost", Error: lostNote(name, l)}
			}
			st.Name, st.Address, st.Draining = name, addr, draining
			out[i] = st
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f.liveStatus(ctx, n)
			out[i].Address, out[i].Draining = addr, draining
		}()
	}
	wg.Wait()
	return out
}

// liveStatus asks n for its status, within statusWait.
func (f *Fleet) liveStatus(ctx context.Context, n nodeapi.Node) api.NodeStatus {
	sctx, cancel := context.WithTimeout(ctx, statusWait)
	defer cancel()
	st, err := n.Status(sctx)
	if err != nil {
		st = api.NodeStatus{State: "lost", Error: err.Error()}
	}
	st.Name = n.Name()
	return st
}

// placementStatuses is every node's status for a placement: asked now
// (a create must see what starting sandboxes have promised), except of a
// node known to be lost, which is not waited for.
func (f *Fleet) placementStatuses(ctx context.Context) []api.NodeStatus {
	nodes := f.Nodes()
	out := make([]api.NodeStatus, len(nodes))
	now := time.Now()
	var wg sync.WaitGroup
	for i, n := range nodes {
		if l, ok := f.linkOf(n.Name()); ok && !l.heard.IsZero() && l.lost(now) {
			out[i] = api.NodeStatus{Name: n.Name(), State: "lost", Error: lostNote(n.Name(), l)}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f.liveStatus(ctx, n)
		}()
	}
	wg.Wait()
	return out
}

// Deleted forgets where sandbox id was.
func (f *Fleet) Deleted(ctx context.Context, node, id string) {
	defer f.cfg.changed()
	f.cfg.Store.DeletePlacement(ctx, id)
	f.cfg.Store.DeleteReported(ctx, node, id)
}

// List is every sandbox of every node, from their reports (reports.go),
// never waiting on one. A node that does not report has its sandboxes
// listed as lost, with why; a placed sandbox its node did not report is
// listed too: nothing goes missing from the list because its node is
// down.
func (f *Fleet) List(ctx context.Context) ([]api.Sandbox, error) {
	var out []api.Sandbox
	ps, err := f.cfg.Store.ListAllPlacements(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := f.cfg.Store.ListReported(ctx)
	if err != nil {
		return nil, err
	}
	placed := make(map[string]bool, len(ps))
	type attempt struct {
		node string
		gen  int64
	}
	attempts := map[attempt]bool{} // made, as reported, but not yet recorded
	for _, p := range ps {
		placed[p.ID] = true
		if p.State == store.PlacementCreating {
			attempts[attempt{p.Node, p.Generation}] = false
		}
	}
	now := time.Now()
	seen := make(map[string]bool, len(rs))
	for _, r := range rs {
		if f.member(r.Node) == nil {
			continue // a forgotten node's
		}
		sb := f.view(r.Node, r.Sandbox, now)
		a := attempt{r.Node, sb.Generation}
		if _, ok := attempts[a]; ok && !sb.LeftBehind {
			attempts[a] = true
		} else if !placed[sb.ID] {
			sb = leftBehind(r.Node, sb)
		}
		seen[sb.ID] = true
		out = append(out, sb)
	}
	fly := f.fly.all()
	for _, p := range ps {
		switch {
		case p.State == store.PlacementCreating && (fly[p.Generation] || attempts[attempt{p.Node, p.Generation}]):
			// Being made now, or made: listed as it is.
		case p.State == store.PlacementCreating:
			out = append(out, f.pending(p))
		case !seen[p.ID]:
			out = append(out, f.unreported(p, now))
		}
	}
	return out, nil
}

// Pair pairs the node at address holding code, records it, and gives it
// every template the master has.
func (f *Fleet) Pair(ctx context.Context, address, code string) (string, error) {
	f.mu.RLock()
	for n, a := range f.addrs {
		if a == address {
			f.mu.RUnlock()
			return "", errdefs.Mark(errdefs.ErrExists, fmt.Errorf("node %s at %s is already this master's", n, address))
		}
	}
	f.mu.RUnlock()
	name, err := enrol.Pair(ctx, address, code, f.cfg.CA)
	if err != nil {
		return "", err
	}
	if f.member(name) != nil {
		return "", errdefs.Mark(errdefs.ErrExists, fmt.Errorf("the node at %s calls itself %s, a name this master's fleet already has: start it with another --node-name", address, name))
	}
	if err := f.cfg.Store.PutNode(ctx, store.Node{Name: name, Address: address, PairedAt: time.Now()}); err != nil {
		return "", err
	}
	if err := f.add(name, address); err != nil {
		return "", err
	}
	ts, err := f.cfg.Store.ListTemplates(ctx)
	if err != nil {
		return name, err
	}
	c := f.member(name)
	for _, t := range ts {
		if err := f.prepare(ctx, c, t); err != nil {
			f.cfg.Log.Warn("a paired node did not take a template", "node", name, "template", t.Name, "err", err)
		}
	}
	f.cfg.Log.Info("node paired", "node", name, "address", address)
	return name, nil
}

// Forget removes paired node name from the fleet; refused while the
// master has sandboxes on it.
func (f *Fleet) Forget(ctx context.Context, name string) error {
	defer f.cfg.changed()
	f.mu.RLock()
	m := f.nodes[name]
	f.mu.RUnlock()
	c, paired := m.(*remote.Client)
	switch {
	case m == nil:
		return errdefs.Mark(errdefs.ErrNotFound, fmt.Errorf("node %q: not found", name))
	case !paired:
		return errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("node %s is in this master's own process; stop the process to remove it", name))
	}
	k, err := f.cfg.Store.CountPlacements(ctx, name)
	if err != nil {
		return err
	}
	if k > 0 {
		return errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("node %s has %d sandbox(es); delete them first", name, k))
	}
	// The node forgets its master too, if it answers: its certificate is
	// no key to anything after this (one that does not answer keeps it
	// until it expires, at most enrol.NodeCertLifetime).
	uctx, cancel := context.WithTimeout(ctx, statusWait)
	if err := enrol.Unpair(uctx, c); err != nil {
		f.cfg.Log.Warn("a forgotten node did not unpair (it keeps its certificate until it expires)", "node", name, "err", err)
	}
	cancel()
	now := time.Now()
	if err := f.cfg.Store.Enrol().Revoke(ctx, name, now); err != nil {
		return err
	}
	if err := f.cfg.Store.DeleteNode(ctx, name); err != nil {
		return err
	}
	f.stopWatch(name)
	f.mu.Lock()
	f.revoked[name] = now
	f.mu.Unlock()
	f.mu.Lock()
	delete(f.nodes, name)
	delete(f.addrs, name)
	f.mu.Unlock()
	return nil
}

// PrepareTemplate gives t to every node; on a failure it takes it back
// from those that had it and says which node refused.
func (f *Fleet) PrepareTemplate(ctx context.Context, t store.Template) error {
	var done []nodeapi.Node
	for _, n := range f.Nodes() {
		if err := f.prepare(ctx, n, t); err != nil {
			for _, d := range done {
				d.DropTemplate(context.WithoutCancel(ctx), t.Name)
			}
			if len(f.Nodes()) > 1 {
				return fmt.Errorf("node %s: %w", n.Name(), err)
			}
			return err
		}
		done = append(done, n)
	}
	return nil
}

// DropTemplate takes template name back from every node that answers.
func (f *Fleet) DropTemplate(ctx context.Context, name string) {
	for _, n := range f.Nodes() {
		if err := n.DropTemplate(ctx, name); err != nil {
			f.cfg.Log.Warn("a node did not drop a template", "node", n.Name(), "template", name, "err", err)
		}
	}
}

// Wire is template t as the seam carries it: its rootfs by digest only,
// never the master's path of it.
func Wire(t store.Template) api.Template {
	return api.Template{Name: t.Name, Digest: t.Digest, Layers: t.Layers, Process: t.Process, Ports: t.Ports, MemoryMiB: t.MemoryMiB, Principal: t.Principal, Warm: t.Warm, Serves: t.Serves, CreatedAt: t.CreatedAt}
}

// prepare gives t to node n; a node that has not got t's rootfs says so
// (errdefs.ErrPrecondition). A template of an image is sent the layers
// the node lacks (layers.go) and asked again: the node makes the tree
// from its layers. Failing that, or for any other template, the node is
// sent the tree once, packed from the master's tree as it streams
// (rootfs.Pack: no copy on the master's disk), then asked again. If the
// tree changed since it was registered, the node finds the digest wrong
// and refuses it: a template's rootfs is what it was when registered, or
// nothing.
func (f *Fleet) prepare(ctx context.Context, n nodeapi.Node, t store.Template) error {
	err := n.PrepareTemplate(ctx, Wire(t))
	if !errors.Is(err, errdefs.ErrPrecondition) {
		return err
	}
	if len(t.Layers) > 0 && f.cfg.Layer != nil {
		err = sendLayers(ctx, f.cfg, n, t)
		if err == nil {
			err = n.PrepareTemplate(ctx, Wire(t))
		}
		if !errors.Is(err, errdefs.ErrPrecondition) && !errors.Is(err, errLayers) {
			return err
		}
		f.cfg.Log.Warn("a node did not take a template by its layers; sending its tree whole", "template", t.Name, "node", n.Name(), "err", err)
	}
	start := time.Now()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(rootfs.Pack(t.Rootfs, pw)) }()
	err = n.PutRootfs(ctx, t.Digest, pr)
	pr.Close()
	if err != nil {
		return fmt.Errorf("sending template %s's rootfs %s to node %s: %w", t.Name, t.Digest, n.Name(), err)
	}
	f.cfg.Log.Info("template rootfs sent to a node", "template", t.Name, "digest", t.Digest, "node", n.Name(), "ms", time.Since(start).Milliseconds())
	return n.PrepareTemplate(ctx, Wire(t))
}

// JoinTokenLifetime is how long a join token is good for.
const JoinTokenLifetime = time.Hour

// NewJoinToken makes a join token, good once within JoinTokenLifetime.
func (f *Fleet) NewJoinToken(ctx context.Context) (string, time.Time, error) {
	tok, hash := enrol.NewJoinToken()
	until := time.Now().Add(JoinTokenLifetime)
	return tok, until, f.cfg.Store.Enrol().PutJoinToken(ctx, hash, until)
}

// Join admits a node that dials in with a join token: it signs the
// node's key and records the node, which is lost until its tunnel is up.
func (f *Fleet) Join(ctx context.Context, req enrol.JoinRequest) (enrol.JoinReply, error) {
	ok, err := f.cfg.Store.Enrol().UseJoinToken(ctx, enrol.JoinTokenHash(req.Token), time.Now())
	if err != nil {
		return enrol.JoinReply{}, err
	}
	if !ok {
		f.cfg.Log.Warn("join refused: unknown, used or expired join token", "node", req.Name)
		return enrol.JoinReply{}, errdefs.Mark(errdefs.ErrForbidden, errors.New("join refused: the join token is unknown, used or expired (make one: POST /v1/nodes/join-tokens)"))
	}
	if req.Name == "" || f.member(req.Name) != nil {
		return enrol.JoinReply{}, errdefs.Mark(errdefs.ErrExists, fmt.Errorf("node name %q is empty or taken in this fleet: start the node with another --node-name", req.Name))
	}
	der, err := f.cfg.CA.SignCSRFor(req.CSR, "node "+req.Name, nil, enrol.NodeCertLifetime, false, true)
	if err != nil {
		return enrol.JoinReply{}, errdefs.Mark(errdefs.ErrBadInput, err)
	}
	if err := f.cfg.Store.PutNode(ctx, store.Node{Name: req.Name, Address: tunnelAddress(req.Name), PairedAt: time.Now()}); err != nil {
		return enrol.JoinReply{}, err
	}
	f.add(req.Name, tunnelAddress(req.Name))
	f.cfg.Log.Info("node joined (it dials in)", "node", req.Name)
	return enrol.JoinReply{Cert: der}, nil
}

// Tunnel serves a joined node's GET /v1/nodes/tunnel (enrol.AcceptTunnel):
// the fleet lets in a node that joined and was not forgotten, with a
// certificate not revoked; its tunnel becomes the node's client, and the
// templates are given to it each time it connects.
func (f *Fleet) Tunnel() http.HandlerFunc {
	d := dialIns{f}
	return enrol.AcceptTunnel(d.admit, d.up)
}

// dialIns is the fleet's side of the nodes that dial in.
type dialIns struct{ f *Fleet }

func (d dialIns) admit(name string, cert *x509.Certificate) error {
	f := d.f
	if err := f.checkCert(name, cert); err != nil {
		f.cfg.Log.Warn("tunnel refused: revoked certificate", "node", name)
		return err
	}
	f.mu.RLock()
	addr := f.addrs[name]
	f.mu.RUnlock()
	if addr != tunnelAddress(name) {
		return errors.New("this node has not joined this master (or was forgotten)")
	}
	return nil
}

func (d dialIns) up(t enrol.Tunnel) {
	f := d.f
	f.mu.Lock()
	f.nodes[t.Node] = t.Client
	f.mu.Unlock()
	f.kickWatch(t.Node)
	f.cfg.Log.Info("tunnel from a node up", "node", t.Node, "from", t.From)
	go func() {
		ts, err := f.cfg.Store.ListTemplates(context.Background())
		if err == nil {
			for _, tp := range ts {
				if err := f.prepare(context.Background(), t.Client, tp); err != nil {
					f.cfg.Log.Warn("a node that dialled in did not take a template", "node", t.Node, "template", tp.Name, "err", err)
				}
			}
		}
		<-t.Session.CloseChan()
		f.cfg.Log.Warn("tunnel from a node down; it is lost until it dials again", "node", t.Node)
	}()
}
