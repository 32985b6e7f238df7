package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/placement"
	"sandstorm/internal/store"
)

// A sandbox runs in one place (issue 14; docs/ARCHITECTURE.md, "One
// place"). The master's placements are its desired state, and every
// placement is numbered (store.NextGeneration) before a node is asked:
//
//   - A create reserves its name and records its attempt — generation,
//     the node it is trying — durably before it calls the node
//     (store.PlacementCreating). It goes to the next node only when the
//     first cannot have made it: the node answered that it would not, or
//     the request never left (nodeapi.ErrNotSent). Any other failure (the
//     connection broke, the node went lost, the deadline passed) leaves
//     the attempt undecided and its caller a 503: the node may have made
//     the sandbox, and the master learns which from its reports.
//   - An undecided attempt is settled when the node reports (resolve): a
//     sandbox of that generation becomes the placement; none, and the
//     node is fenced past it (node.Fence), which makes sure a request
//     still on its way can no longer make it, and only then is the name
//     free again.
//   - Each time a node's full report comes in (it restarted, the master
//     did, a partition healed) the master fences it: whatever it runs that
//     the master did not place there — a move's old copy, a create the
//     master gave up — is stopped and kept only for its volume.

// inflight is the generations of this master's creates and clones now
// calling a node: a fence must keep them (node.Fence's inFlight).
type inflight struct {
	mu   sync.Mutex
	gens map[int64]bool
}

// begin takes the next generation and marks it in flight, in one step
// under mu: a fence that reads the store's generation under the same lock
// sees every generation at or below it either in flight or done.
func (fl *inflight) begin(ctx context.Context, st *store.Store) (int64, error) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	gen, err := st.NextGeneration(ctx)
	if err != nil {
		return 0, err
	}
	if fl.gens == nil {
		fl.gens = map[int64]bool{}
	}
	fl.gens[gen] = true
	return gen, nil
}

func (fl *inflight) landed(gen int64) {
	fl.mu.Lock()
	delete(fl.gens, gen)
	fl.mu.Unlock()
}

// flying is the store's generation now and the generations in flight,
// read together under the lock begin takes (what a fence needs).
func (fl *inflight) flying(ctx context.Context, st *store.Store) (int64, map[int64]bool, error) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	g, err := st.Generation(ctx)
	return g, fl.locked(), err
}

// inFlight is the generations in flight now (no store read: a list or a
// name check needs only these).
func (fl *inflight) all() map[int64]bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.locked()
}

func (fl *inflight) locked() map[int64]bool {
	out := make(map[int64]bool, len(fl.gens))
	for k := range fl.gens {
		out[k] = true
	}
	return out
}

// deletes are the sandboxes this master's Delete calls are deleting now:
// a settle that meets one marked deleting leaves it to that call, rather
// than deleting it a second time and calling the delete lost (seen: a
// node's report arriving while a plain delete was under way).
type deletes struct {
	mu  sync.Mutex
	ids map[string]int
}

// begin marks id under way until the returned func is called.
func (d *deletes) begin(id string) func() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ids == nil {
		d.ids = map[string]int{}
	}
	d.ids[id]++
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.ids[id]--; d.ids[id] <= 0 {
			delete(d.ids, id)
		}
	}
}

func (d *deletes) underWay(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ids[id] > 0
}

// Create places req on the node with the most headroom that takes it
// (above for what happens when one does not answer).
func (f *Fleet) Create(ctx context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	defer f.cfg.changed()
	gen, err := f.fly.begin(ctx, f.cfg.Store)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer f.fly.landed(gen)
	req.Generation = gen
	att := store.Placement{ID: store.PendingID(gen), Name: req.Name, Template: req.Template.Name, Principal: req.Principal,
		MemoryMiB: req.MemoryMiB, Generation: gen, State: store.PlacementCreating}
	if att.Name == "" {
		att.Name = att.ID
	}
	if err := f.cfg.Store.PutPlacement(ctx, att); err != nil {
		if errors.Is(err, errdefs.ErrExists) {
			return api.Sandbox{}, f.taken(ctx, att.Name)
		}
		return api.Sandbox{}, err
	}
	// From here the attempt is the master's to settle whatever the
	// caller does.
	bg := context.WithoutCancel(ctx)
	sb, err := f.place(ctx, att, req)
	if err != nil && !errors.Is(err, errUndecided) {
		f.cfg.Store.DeletePlacement(bg, att.ID)
	}
	return sb, err
}

// errUndecided marks a create or clone whose node may or may not have
// made it: its attempt stays until the node's reports settle it.
var errUndecided = errors.New("undecided")

// place tries att on each node in order of headroom.
func (f *Fleet) place(ctx context.Context, att store.Placement, req nodeapi.CreateRequest) (api.Sandbox, error) {
	bg := context.WithoutCancel(ctx)
	byName := map[string]nodeapi.Node{}
	for _, n := range f.Nodes() {
		byName[n.Name()] = n
	}
	var sts []api.NodeStatus
	if len(byName) == 1 {
		// One node, no choice: no status to read (a node's status counts
		// its sandboxes, a scan of its store, which a create per request
		// must not pay on a node holding thousands). The node decides
		// itself whether it has room.
		for name := range byName {
			st := api.NodeStatus{Name: name, State: "ready"}
			if l, ok := f.linkOf(name); ok && !l.heard.IsZero() && l.lost(time.Now()) {
				st.State = "lost"
			}
			sts = []api.NodeStatus{st}
		}
	} else {
		sts = f.placementStatuses(ctx)
	}
	var cands []placement.Candidate
	var lost []string
	for _, st := range sts {
		if st.State == "lost" {
			lost = append(lost, st.Name)
		}
		cands = append(cands, placement.Candidate{Name: st.Name, AvailableMiB: st.MemAvailableMiB, ReserveMiB: st.MemReserveMiB, PromisedMiB: st.PromisedMiB, Lost: st.State == "lost", Draining: f.draining.has(st.Name)})
	}
	order := placement.Order(cands)
	if len(order) == 0 {
		why := "this master has no node: pair one (POST /v1/nodes), or run --node with --master"
		if len(lost) > 0 {
			why = "no node answers (lost: " + strings.Join(lost, ", ") + ")"
		} else if len(cands) > 0 {
			why = "every node is draining (node undrain NAME takes new work again)"
		}
		return api.Sandbox{}, errdefs.Mark(errdefs.ErrNoRoom, errors.New(why))
	}
	var refusals []string
	var last error
	for _, c := range order {
		n := byName[c.Name]
		// The attempt names its node before the node is asked: a master
		// that dies now leaves a record of where to look.
		if err := f.cfg.Store.SetPlacementNode(ctx, att.ID, c.Name); err != nil {
			return api.Sandbox{}, err
		}
		sb, err := n.Create(ctx, req)
		switch {
		case err == nil:
			p := store.Placement{ID: sb.ID, Name: sb.Name, Node: c.Name, Template: req.Template.Name, Principal: req.Principal, MemoryMiB: req.MemoryMiB, Generation: att.Generation}
			if err := f.cfg.Store.ResolveAttempt(bg, att.Generation, []store.Placement{p}); err != nil {
				// Made, but not recorded: the node's next report is, and
				// resolve adopts it then.
				f.cfg.Log.Error("placement: a sandbox made but not recorded; its node's reports will settle it", "node", c.Name, "id", sb.ID, "err", err)
			}
			return sb, nil
		case errors.Is(err, nodeapi.ErrNotSent), errors.Is(err, errdefs.ErrNoRoom) && !errors.Is(err, errdefs.ErrUnavailable):
			// The node cannot have made it: it never got the request, or it
			// answered that it has no room.
			refusals = append(refusals, c.Name+": "+err.Error())
			last = err
			f.cfg.Log.Info("placement: node refused; trying the next", "node", c.Name, "headroom_mib", c.Headroom(), "err", err)
			continue
		case errors.Is(err, errdefs.ErrUnavailable):
			f.cfg.Log.Warn("placement: a create's node did not answer; the attempt waits for its reports", "node", c.Name, "generation", att.Generation, "name", att.Name, "err", err)
			return api.Sandbox{}, errdefs.Mark(errUndecided, fmt.Errorf("%w; it may have made sandbox %s there: the master learns which from its reports once it answers again, and keeps the name until then (retry in a few seconds: a retry with the same name answers 409 if it was made)", err, att.Name))
		default:
			return sb, err
		}
	}
	if len(refusals) == 1 {
		return api.Sandbox{}, last // the one node's own words, and its Retry-After
	}
	return api.Sandbox{}, errdefs.Mark(errdefs.ErrNoRoom, fmt.Errorf("no node has room for it now: %s", strings.Join(refusals, "; ")))
}

// ErrDraining marks a call refused because its node is draining (it
// takes no new sandboxes): a conflict, which its caller may resolve by
// moving what it needs to another node (a snapshot is shipped so).
var ErrDraining = errdefs.Refine(errdefs.ErrConflict, "node draining")

// Clone makes children of parent on its node n, numbered as one
// placement; the children become placements when the node answers, or,
// if it does not, when it reports them (resolve).
func (f *Fleet) Clone(ctx context.Context, n nodeapi.Node, parent api.Sandbox, req api.CloneRequest) (api.CloneResult, error) {
	defer f.cfg.changed()
	if f.draining.has(n.Name()) {
		return api.CloneResult{}, errdefs.Mark(ErrDraining, fmt.Errorf("node %s is draining: its sandboxes are not cloned there (undrain it, or clone once %s has moved)", n.Name(), parent.Name))
	}
	gen, err := f.fly.begin(ctx, f.cfg.Store)
	if err != nil {
		return api.CloneResult{}, err
	}
	defer f.fly.landed(gen)
	att := store.Placement{ID: store.PendingID(gen), Name: store.PendingID(gen), Node: n.Name(), Template: parent.Template,
		Generation: gen, State: store.PlacementCreating}
	if err := f.cfg.Store.PutPlacement(ctx, att); err != nil {
		return api.CloneResult{}, err
	}
	bg := context.WithoutCancel(ctx)
	res, err := n.Clone(ctx, parent.ID, nodeapi.CloneRequest{CloneRequest: req, Generation: gen})
	if errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, nodeapi.ErrNotSent) {
		// Some children may be there: the reports settle it.
		return res, err
	}
	var ps []store.Placement
	for _, c := range res.Children {
		ps = append(ps, store.Placement{ID: c.ID, Name: c.Name, Node: n.Name(), Template: c.Template, Principal: c.Principal, MemoryMiB: c.MemoryMiB, Generation: gen})
	}
	if rerr := f.cfg.Store.ResolveAttempt(bg, gen, ps); rerr != nil {
		f.cfg.Log.Error("placement: a clone's children made but not recorded; its node's reports will settle them", "node", n.Name(), "err", rerr)
	}
	return res, err
}

// Delete deletes sandbox sb on its node n. Its placement is marked
// deleting first, so that a delete whose answer is lost is
// finished when the node reports again (resolve), and the name stays
// taken until then.
func (f *Fleet) Delete(ctx context.Context, n nodeapi.Node, sb api.Sandbox) error {
	defer f.cfg.changed()
	bg := context.WithoutCancel(ctx)
	if p, err := f.cfg.Store.GetPlacement(ctx, sb.ID); err == nil && p.State == store.PlacementCreating {
		if f.fly.all()[p.Generation] {
			return errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s is being created now; delete it once the create has answered", p.Name))
		}
		if l, ok := f.linkOf(p.Node); ok && l.full && !l.lost(time.Now()) {
			// Its node answers: settle it with the node first (the fence
			// makes sure nothing of it runs), then delete what was made,
			// if anything.
			if err := f.settle(ctx, p.Node); err != nil {
				return err
			}
			if q, err := f.cfg.Store.GetPlacement(ctx, p.Name); err == nil && q.State == "" && q.Node == p.Node {
				return f.Delete(ctx, n, api.Sandbox{ID: q.ID, Name: q.Name})
			}
			return nil
		}
		// Its node is lost: the create is given up now, as a move gives up
		// a sandbox, and with the same risk — until that node hears this
		// master again, what it made of the create may run there; then the
		// fence retires it (its generation is below the fence and kept by
		// no one).
		return f.cfg.Store.ResolveAttempt(ctx, p.Generation, nil)
	}
	if p, err := f.cfg.Store.GetPlacement(ctx, sb.ID); err == nil && (p.State == store.PlacementMoving || p.State == store.PlacementMoved) {
		return errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("sandbox %s is being moved between nodes %s and %s; delete it once the move is settled", p.Name, p.Node, p.MoveNode))
	}
	defer f.deleting.begin(sb.ID)()
	placed := false
	if p, err := f.cfg.Store.GetPlacement(ctx, sb.ID); err == nil && p.ID == sb.ID {
		placed = true
		if err := f.cfg.Store.SetPlacementState(ctx, sb.ID, store.PlacementDeleting); err != nil {
			return err
		}
	}
	err := n.Delete(ctx, sb.ID)
	if err != nil && !(placed && errors.Is(err, errdefs.ErrNotFound)) {
		if placed && errors.Is(err, errdefs.ErrUnavailable) {
			return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("%w; sandbox %s is marked for deletion, and is deleted once its node answers again", err, sb.Name))
		}
		if placed {
			f.cfg.Store.SetPlacementState(bg, sb.ID, "")
		}
		return err
	}
	f.Deleted(bg, n.Name(), sb.ID)
	return nil
}

// resolveEvery is how often the master looks for attempts and deletes
// its nodes' reports have not settled (a node that answers but whose
// answer to one call was lost).
const resolveEvery = 2 * time.Second

// resolveDue settles what is unsettled on every node that reports.
func (f *Fleet) resolveDue(ctx context.Context) {
	ps, err := f.cfg.Store.ListUnsettled(ctx)
	if err != nil {
		return
	}
	fly := f.fly.all()
	due := map[string]bool{}
	for _, p := range ps {
		if p.State == store.PlacementDeleting || p.State == store.PlacementCreating && !fly[p.Generation] {
			due[p.Node] = true
		}
		if (p.State == store.PlacementMoving || p.State == store.PlacementMoved) && !fly[p.Generation] && !fly[p.MoveGen] {
			due[p.Node], due[p.MoveNode] = true, true
		}
	}
	now := time.Now()
	for node := range due {
		if l, ok := f.linkOf(node); ok && l.full && !l.lost(now) {
			f.resolve(ctx, node)
		}
	}
}

// resolveLock is node's resolve lock: one resolve at a time per node.
func (f *Fleet) resolveLock(node string) *sync.Mutex {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resolving == nil {
		f.resolving = map[string]*sync.Mutex{}
	}
	m := f.resolving[node]
	if m == nil {
		m = &sync.Mutex{}
		f.resolving[node] = m
	}
	return m
}

// resolve settles node's attempts and deletes against what it reported,
// and fences it: called when its full report is in, and by resolveDue.
func (f *Fleet) resolve(ctx context.Context, node string) {
	defer f.cfg.changed()
	if err := f.settle(ctx, node); err != nil && ctx.Err() == nil {
		f.cfg.Log.Warn("cannot settle a node's sandboxes with it yet; retrying", "node", node, "err", err)
	}
}

func (f *Fleet) settle(ctx context.Context, node string) error {
	mu := f.resolveLock(node)
	mu.Lock()
	defer mu.Unlock()
	st := f.cfg.Store
	n := f.member(node)
	if n == nil {
		return nil
	}
	// Moves with an end here that no call has under way are settled
	// first (move.go): what they leave decides what is kept below.
	if err := f.settleMoves(ctx, node); err != nil {
		return err
	}
	// The order matters: the generation and what is in flight first, the
	// placements after, so every placement at or below gen is either in
	// the list or still in flight.
	gen, fly, err := f.fly.flying(ctx, f.cfg.Store)
	if err != nil {
		return err
	}
	ps, err := f.placedOn(ctx, node)
	if err != nil {
		return err
	}
	byGen, reported, err := f.reportedOf(ctx, node)
	if err != nil {
		return err
	}
	req := nodeapi.FenceRequest{Generation: gen, Keep: []string{}}
	for g := range fly {
		req.InFlight = append(req.InFlight, g)
	}
	slices.Sort(req.InFlight)
	var abort []store.Placement
	var del []store.Placement
	for _, p := range ps {
		switch {
		case p.State == store.PlacementCreating && fly[p.Generation]:
		case p.State == store.PlacementCreating:
			made := byGen[p.Generation]
			if len(made) == 0 {
				abort = append(abort, p)
				continue
			}
			var adopt []store.Placement
			for _, sb := range made {
				adopt = append(adopt, store.Placement{ID: sb.ID, Name: sb.Name, Node: node, Template: sb.Template, Principal: sb.Principal, MemoryMiB: p.MemoryMiB, Generation: p.Generation})
				req.Keep = append(req.Keep, sb.ID)
			}
			if err := st.ResolveAttempt(ctx, p.Generation, adopt); err != nil {
				return err
			}
			f.cfg.Log.Info("placement: a create its caller did not hear the end of was made; it is the sandbox of its name", "node", node, "generation", p.Generation, "name", made[0].Name, "id", made[0].ID)
		case p.State == store.PlacementDeleting && f.deleting.underWay(p.ID):
			req.Keep = append(req.Keep, p.ID) // its Delete call finishes it
		case p.State == store.PlacementDeleting:
			if !reported[p.ID] {
				st.DeletePlacement(ctx, p.ID)
				continue
			}
			del = append(del, p)
			req.Keep = append(req.Keep, p.ID) // deleted outright below, not kept as left behind
		default:
			req.Keep = append(req.Keep, p.ID)
		}
	}
	res, err := n.Fence(ctx, req) // bounded by the recorder (nodeapi.FenceDeadline)
	if err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	if len(res.Retired) > 0 {
		f.cfg.Log.Warn("fenced: the node ran sandboxes this master had not placed there; they are stopped", "node", node, "retired", res.Retired)
	}
	// The node now refuses every create at or below gen that is not in
	// flight: an attempt it did not make never will be, and its name is
	// free.
	for _, p := range abort {
		if err := st.ResolveAttempt(ctx, p.Generation, nil); err != nil {
			return err
		}
		f.cfg.Log.Info("placement: a create its node never made is given up; its name is free", "node", node, "generation", p.Generation, "name", p.Name)
	}
	for _, p := range del {
		err := n.Delete(ctx, p.ID) // bounded by the recorder (nodeapi.DeleteDeadline)
		if err == nil || errors.Is(err, errdefs.ErrNotFound) {
			f.Deleted(ctx, node, p.ID)
			f.cfg.Log.Info("a delete whose answer was lost is finished", "node", node, "id", p.ID)
		}
	}
	return nil
}

// settleMoves settles the moves with an end on node that no call has
// under way (settleMove).
func (f *Fleet) settleMoves(ctx context.Context, node string) error {
	st := f.cfg.Store
	for _, list := range []func(context.Context, string) ([]store.Placement, error){st.ListPlacements, st.ListMovesTo} {
		ms, err := list(ctx, node)
		if err != nil {
			return err
		}
		for _, p := range ms {
			if p.State == store.PlacementMoving || p.State == store.PlacementMoved {
				f.settleMove(ctx, p)
			}
		}
	}
	return nil
}

// placedOn is node's placements, and the copies a committed move left
// there: each is kept until its new node has confirmed it (it never runs:
// it is marked leaving).
func (f *Fleet) placedOn(ctx context.Context, node string) ([]store.Placement, error) {
	ps, err := f.cfg.Store.ListPlacements(ctx, node)
	if err != nil {
		return nil, err
	}
	away, err := f.cfg.Store.ListMovesTo(ctx, node)
	if err != nil {
		return nil, err
	}
	for _, p := range away {
		if p.State == store.PlacementMoved {
			ps = append(ps, store.Placement{ID: p.ID, Name: p.Name, Node: node, Generation: p.MoveGen})
		}
	}
	return ps, nil
}

// reportedOf is what node last reported: its sandboxes by the generation
// that made them (not left behind), and every ID it has.
func (f *Fleet) reportedOf(ctx context.Context, node string) (map[int64][]api.Sandbox, map[string]bool, error) {
	rs, err := f.cfg.Store.ListReportedOf(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	byGen := map[int64][]api.Sandbox{}
	reported := map[string]bool{}
	for _, r := range rs {
		reported[r.Sandbox.ID] = true
		if r.Sandbox.Generation > 0 && !r.Sandbox.LeftBehind {
			byGen[r.Sandbox.Generation] = append(byGen[r.Sandbox.Generation], r.Sandbox)
		}
	}
	return byGen, reported, nil
}

// pending is an attempt as the list shows it while it is undecided.
func (f *Fleet) pending(p store.Placement) api.Sandbox {
	name := p.Name
	if name == p.ID {
		name = ""
	}
	return api.Sandbox{ID: p.ID, Name: name, Node: p.Node, Template: p.Template, Principal: p.Principal, MemoryMiB: p.MemoryMiB,
		Tier: api.TierLost, Transition: api.TierHot, Generation: p.Generation,
		Note: "being created on node " + p.Node + ", which did not answer in time: whether it was made there is known when the node reports again (its name is taken until then)"}
}
