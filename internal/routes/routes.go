// Package routes is the master's side of every node's ingress (issue 33,
// "an ingress that is not the master"): the fleet's routes — where each
// sandbox is, at which placement generation, with the tokens and E2B
// settings its traffic is checked by — computed from the store (FromStore)
// and pushed to every node (Publisher) when a placement or a sandbox's
// settings change, and again every few seconds in case a change was
// missed. A node serves traffic from its own copy (internal/ingress): the
// master is consulted only for where a sandbox is, never on a request's
// path, and a master that dies leaves every node's table as it was.
package routes

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/store"
)

// Source is the fleet's routes and nodes now.
type Source func(ctx context.Context) (Snapshot, error)

// Snapshot is what every node is pushed: the routes, and the nodes that
// may forward to each other.
type Snapshot struct {
	Routes []nodeapi.Route
	Peers  []nodeapi.Peer
}

// Tokens are sandbox id's envd access token and traffic access token
// (internal/e2b: HMACs of its ID under the master's key).
type Tokens func(id string) (access, traffic string)

// FromStore is the routes of st's placements: those placed (not an
// attempt, not being deleted) whose sandbox the API recorded (a
// sandbox's settings are written just after its placement: until then it
// has no route, so its traffic is refused rather than let through with
// settings it may not have, such as a private sandbox's). A node with no
// address peers can reach (the master's own, one behind NAT) gets
// routes with none.
func FromStore(st *store.Store, tokens Tokens) Source {
	return func(ctx context.Context) (Snapshot, error) {
		var snap Snapshot
		ps, err := st.ListAllPlacements(ctx)
		if err != nil {
			return snap, err
		}
		nodes, err := st.ListNodes(ctx)
		if err != nil {
			return snap, err
		}
		metas, err := st.Teams().SandboxMetas(ctx)
		if err != nil {
			return snap, err
		}
		revoked, err := st.Enrol().Revocations(ctx)
		if err != nil {
			return snap, err
		}
		addr := map[string]string{}
		for _, n := range nodes {
			if !strings.HasPrefix(n.Address, "tunnel:") {
				addr[n.Name] = n.Address
			}
			snap.Peers = append(snap.Peers, nodeapi.Peer{Name: n.Name, RevokedAt: revoked[n.Name]})
		}
		meta := map[string]store.SandboxMeta{}
		for _, m := range metas {
			meta[m.ID] = m
		}
		for _, p := range ps {
			m, ok := meta[p.ID]
			if !ok || p.State == store.PlacementCreating || p.State == store.PlacementDeleting {
				continue
			}
			access, traffic := tokens(p.ID)
			snap.Routes = append(snap.Routes, nodeapi.Route{ID: p.ID, Node: p.Node, Address: addr[p.Node], Generation: p.Generation,
				AccessToken: access, TrafficToken: traffic, Private: m.Private, Paused: m.Paused, AutoResume: m.AutoResume,
				Env: m.Env, MaskHost: m.MaskHost})
		}
		return snap, nil
	}
}

// Diff is what turns table from into to: the routes to set (new or
// changed) and the IDs to drop, in ID order.
func Diff(from, to map[string]nodeapi.Route) (set []nodeapi.Route, drop []string) {
	for id, r := range to {
		if old, ok := from[id]; !ok || !reflect.DeepEqual(old, r) {
			set = append(set, r)
		}
	}
	for id := range from {
		if _, ok := to[id]; !ok {
			drop = append(drop, id)
		}
	}
	sort.Slice(set, func(i, j int) bool { return set[i].ID < set[j].ID })
	sort.Strings(drop)
	return set, drop
}

// Publisher pushes the fleet's routes to its nodes.
type Publisher struct {
	src   Source
	nodes func() []nodeapi.Node
	log   *slog.Logger
	kick  chan struct{}

	mu      sync.Mutex
	version int64
	sent    map[string]pushed // by node: what it has, as far as this master knows
	busy    map[string]bool   // a push to the node is under way
	again   map[string]bool   // and another was asked for meanwhile
}

// pushed is what a node was last pushed.
type pushed struct {
	version int64
	table   map[string]nodeapi.Route
	peers   []nodeapi.Peer
}

// PushDeadline bounds one push to one node.
const PushDeadline = 10 * time.Second

// NewPublisher publishes src to the nodes nodes answers.
func NewPublisher(src Source, nodes func() []nodeapi.Node, log *slog.Logger) *Publisher {
	return &Publisher{src: src, nodes: nodes, log: log, kick: make(chan struct{}, 1), sent: map[string]pushed{}, busy: map[string]bool{}, again: map[string]bool{}}
}

// Changed asks for a push soon; it never blocks (changes coalesce).
func (p *Publisher) Changed() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Forget drops what was pushed to node name, so that its next push is
// the table whole, and asks for it now: the fleet calls it when a node's
// report stream comes up again, which is how a node that restarted (its
// table empty) is told apart from one that has its routes. Without it a
// node that came back while nothing changed waited for the next change
// (a newcomer's trial, 12-07: 45 s of 502s from a restarted node's
// ingress, and its peers refused).
func (p *Publisher) Forget(name string) {
	p.mu.Lock()
	delete(p.sent, name)
	p.mu.Unlock()
	p.Changed()
}

// Run publishes at each change and every interval, until ctx ends.
func (p *Publisher) Run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		p.publish(ctx, false)
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// Publish pushes the routes now to every node whose table differs from
// them, each node at once: a change, or the table whole to a node this
// master has not pushed yet or whose table was not what it thought. It
// returns when every push it started is done.
func (p *Publisher) Publish(ctx context.Context) { p.publish(ctx, true) }

// publish is Publish; without wait it returns once the pushes are
// started, so that a node slow to answer (about to be taken for lost)
// holds no other node's routes back. A node whose last push is still
// under way is pushed again when it is done.
func (p *Publisher) publish(ctx context.Context, wait bool) {
	snap, err := p.src(ctx)
	if err != nil {
		p.log.Warn("routes: the fleet's routes could not be read; the nodes keep theirs", "err", err)
		return
	}
	now := make(map[string]nodeapi.Route, len(snap.Routes))
	for _, r := range snap.Routes {
		now[r.ID] = r
	}
	peers := append([]nodeapi.Peer{}, snap.Peers...)
	sort.Slice(peers, func(i, j int) bool { return peers[i].Name < peers[j].Name })
	var wg sync.WaitGroup
	live := map[string]bool{}
	p.mu.Lock()
	for _, n := range p.nodes() {
		name := n.Name()
		live[name] = true
		if p.busy[name] {
			p.again[name] = true
			continue
		}
		p.busy[name] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.push(ctx, n, now, peers)
			p.mu.Lock()
			again := p.again[name]
			delete(p.busy, name)
			delete(p.again, name)
			p.mu.Unlock()
			if again {
				p.Changed()
			}
		}()
	}
	for name := range p.sent {
		if !live[name] {
			delete(p.sent, name)
		}
	}
	p.mu.Unlock()
	if wait {
		wg.Wait()
	}
}

// push brings n's table to now.
func (p *Publisher) push(ctx context.Context, n nodeapi.Node, now map[string]nodeapi.Route, peers []nodeapi.Peer) {
	p.mu.Lock()
	prev, known := p.sent[n.Name()]
	p.mu.Unlock()
	u := nodeapi.Routes{Full: !known, Base: prev.version, Peers: peers}
	if known {
		if u.Set, u.Drop = Diff(prev.table, now); len(u.Set) == 0 && len(u.Drop) == 0 && reflect.DeepEqual(peers, prev.peers) {
			return
		}
	} else {
		u.Set, _ = Diff(nil, now)
	}
	err := p.send(ctx, n, &u)
	if errors.Is(err, errdefs.ErrPrecondition) {
		// Its table is not the one this master pushed (it restarted):
		// whole, then.
		u = nodeapi.Routes{Full: true, Peers: peers}
		u.Set, _ = Diff(nil, now)
		err = p.send(ctx, n, &u)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		delete(p.sent, n.Name())
		if ctx.Err() == nil {
			p.log.Debug("routes: a node did not take its routes; sent whole next time", "node", n.Name(), "err", err)
		}
		return
	}
	p.sent[n.Name()] = pushed{version: u.Version, table: now, peers: peers}
}

// send numbers u and pushes it to n.
func (p *Publisher) send(ctx context.Context, n nodeapi.Node, u *nodeapi.Routes) error {
	p.mu.Lock()
	p.version++
	u.Version = p.version
	if !u.Full && u.Version <= u.Base {
		u.Version = u.Base + 1
	}
	p.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, PushDeadline)
	defer cancel()
	return n.PutRoutes(cctx, *u)
}

// Resync is how often the routes are pushed when nothing said they
// changed: a change no hook told of (a node's own repair) reaches every
// node within it.
const Resync = 2 * time.Second
