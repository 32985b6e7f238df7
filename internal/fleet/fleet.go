// Package fleet is the master's view of its nodes (issue 9): the node in
// its own process, if it runs one, and the nodes it paired with, reached
// over the seam (internal/nodeapi). It places new sandboxes by memory
// headroom (internal/placement decides; a node that refuses passes the
// sandbox to the next), remembers which node each sandbox of a paired node
// is on, and says which nodes do not answer.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/pki"
	"sandstorm/internal/placement"
	"sandstorm/internal/store"
)

// statusWait bounds how long a node has to answer a status; one that does
// not is lost for that placement or listing.
const statusWait = 3 * time.Second

// Config configures a fleet.
type Config struct {
	Store *store.Store
	CA    *pki.CA
	// Local is the node in the master's process (nil: none).
	Local nodeapi.Node
	Log   *slog.Logger
}

// Fleet is the master's nodes.
type Fleet struct {
	cfg    Config
	mu     sync.RWMutex
	remote map[string]*nodeapi.Client
	addrs  map[string]string
}

// New loads the paired nodes from the store.
func New(ctx context.Context, cfg Config) (*Fleet, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	f := &Fleet{cfg: cfg, remote: map[string]*nodeapi.Client{}, addrs: map[string]string{}}
	ns, err := cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		if err := f.add(n.Name, n.Address); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (f *Fleet) add(name, address string) error {
	c, err := nodeapi.Dial(name, address, f.cfg.CA)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.remote[name], f.addrs[name] = c, address
	f.mu.Unlock()
	return nil
}

// Local is the node in the master's process (nil if none).
func (f *Fleet) Local() nodeapi.Node { return f.cfg.Local }

// Nodes is every node: the local one first, then the paired ones by name.
func (f *Fleet) Nodes() []nodeapi.Node {
	var out []nodeapi.Node
	if f.cfg.Local != nil {
		out = append(out, f.cfg.Local)
	}
	f.mu.RLock()
	names := make([]string, 0, len(f.remote))
	for n := range f.remote {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		out = append(out, f.remote[n])
	}
	f.mu.RUnlock()
	return out
}

func (f *Fleet) isRemote(name string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.remote[name]
	return ok
}

// For is the node of the sandbox whose ID or name is ref.
func (f *Fleet) For(ctx context.Context, ref string) (nodeapi.Node, error) {
	p, err := f.cfg.Store.GetPlacement(ctx, ref)
	switch {
	case err == nil:
		f.mu.RLock()
		c := f.remote[p.Node]
		f.mu.RUnlock()
		if c == nil {
			return nil, nodeapi.Mark(nodeapi.ErrNodeDown, fmt.Errorf("sandbox %s is on node %s, which this master no longer has", p.Name, p.Node))
		}
		return c, nil
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	case f.cfg.Local != nil:
		return f.cfg.Local, nil
	}
	return nil, nodeapi.Mark(nodeapi.ErrNotFound, fmt.Errorf("sandbox %q: not found", ref))
}

// NameTaken reports whether a sandbox of a paired node is called name
// (the local node's own are in its store, which it checks itself).
func (f *Fleet) NameTaken(ctx context.Context, name string) bool {
	_, err := f.cfg.Store.GetPlacement(ctx, name)
	return err == nil
}

// Statuses is every node's status; a node that does not answer within
// statusWait is "lost", with why.
func (f *Fleet) Statuses(ctx context.Context) []api.NodeStatus {
	nodes := f.Nodes()
	out := make([]api.NodeStatus, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, statusWait)
			defer cancel()
			st, err := n.Status(sctx)
			if err != nil {
				st = api.NodeStatus{Name: n.Name(), State: "lost", Error: err.Error()}
			}
			st.Name = n.Name()
			f.mu.RLock()
			st.Address = f.addrs[n.Name()]
			f.mu.RUnlock()
			out[i] = st
		}()
	}
	wg.Wait()
	return out
}

// Create places req on the node with the most headroom that takes it.
func (f *Fleet) Create(ctx context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	sts := f.Statuses(ctx)
	byName := map[string]nodeapi.Node{}
	for _, n := range f.Nodes() {
		byName[n.Name()] = n
	}
	var cands []placement.Candidate
	var lost []string
	for _, st := range sts {
		if st.State == "lost" {
			lost = append(lost, st.Name)
		}
		cands = append(cands, placement.Candidate{Name: st.Name, AvailableMiB: st.MemAvailableMiB, ReserveMiB: st.MemReserveMiB, PromisedMiB: st.PromisedMiB, Lost: st.State == "lost"})
	}
	order := placement.Order(cands)
	if len(order) == 0 {
		why := "this master has no node: pair one (POST /v1/nodes), or run --node with --master"
		if len(lost) > 0 {
			why = "no node answers (lost: " + strings.Join(lost, ", ") + ")"
		}
		return api.Sandbox{}, nodeapi.Mark(nodeapi.ErrUnavailable, errors.New(why))
	}
	var refusals []string
	for _, c := range order {
		n := byName[c.Name]
		sb, err := n.Create(ctx, req)
		if errors.Is(err, nodeapi.ErrUnavailable) || errors.Is(err, nodeapi.ErrNodeDown) {
			refusals = append(refusals, c.Name+": "+err.Error())
			f.cfg.Log.Info("placement: node refused; trying the next", "node", c.Name, "headroom_mib", c.Headroom(), "err", err)
			continue
		}
		if err != nil {
			return sb, err
		}
		if f.isRemote(c.Name) {
			if perr := f.cfg.Store.PutPlacement(ctx, store.Placement{ID: sb.ID, Name: sb.Name, Node: c.Name}); perr != nil {
				// Made, but the master could not record where: undo it
				// rather than lose track of a running sandbox.
				n.Delete(context.WithoutCancel(ctx), sb.ID)
				return api.Sandbox{}, perr
			}
		}
		return sb, nil
	}
	return api.Sandbox{}, nodeapi.Mark(nodeapi.ErrUnavailable, fmt.Errorf("no node has room for it now: %s", strings.Join(refusals, "; ")))
}

// Placed records children a paired node made (a clone) as on that node.
func (f *Fleet) Placed(ctx context.Context, node string, sbs []api.Sandbox) {
	if !f.isRemote(node) {
		return
	}
	for _, sb := range sbs {
		if err := f.cfg.Store.PutPlacement(ctx, store.Placement{ID: sb.ID, Name: sb.Name, Node: node}); err != nil {
			f.cfg.Log.Error("placement: cannot record a clone's child", "node", node, "id", sb.ID, "err", err)
		}
	}
}

// Deleted forgets where sandbox id was.
func (f *Fleet) Deleted(ctx context.Context, node, id string) {
	if f.isRemote(node) {
		f.cfg.Store.DeletePlacement(ctx, id)
	}
}

// List is every sandbox of every node. A node that does not answer has
// its sandboxes listed from the master's record, as lost, with why:
// nothing goes missing from the list because its node is down.
func (f *Fleet) List(ctx context.Context) ([]api.Sandbox, error) {
	nodes := f.Nodes()
	lists := make([][]api.Sandbox, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, statusWait)
			defer cancel()
			lists[i], errs[i] = n.List(lctx)
		}()
	}
	wg.Wait()
	var out []api.Sandbox
	for i, n := range nodes {
		if errs[i] == nil {
			out = append(out, lists[i]...)
			continue
		}
		if n == f.cfg.Local {
			return nil, errs[i]
		}
		ps, err := f.cfg.Store.ListPlacements(ctx, n.Name())
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			out = append(out, api.Sandbox{ID: p.ID, Name: p.Name, Node: p.Node, Tier: api.TierLost,
				Note: "its node " + p.Node + " does not answer (" + errs[i].Error() + "); it is shown again as it is once the node is back"})
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
			return "", nodeapi.Mark(nodeapi.ErrExists, fmt.Errorf("node %s at %s is already this master's", n, address))
		}
	}
	f.mu.RUnlock()
	name, err := nodeapi.Pair(ctx, address, code, f.cfg.CA)
	if err != nil {
		return "", err
	}
	if f.cfg.Local != nil && f.cfg.Local.Name() == name || f.isRemote(name) {
		return "", nodeapi.Mark(nodeapi.ErrExists, fmt.Errorf("the node at %s calls itself %s, a name this master's fleet already has: start it with another --node-name", address, name))
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
	f.mu.RLock()
	c := f.remote[name]
	f.mu.RUnlock()
	for _, t := range ts {
		if err := c.PrepareTemplate(ctx, wireTemplate(t)); err != nil {
			f.cfg.Log.Warn("a paired node did not take a template", "node", name, "template", t.Name, "err", err)
		}
	}
	f.cfg.Log.Info("node paired", "node", name, "address", address)
	return name, nil
}

// Forget removes paired node name from the fleet; refused while the
// master has sandboxes on it.
func (f *Fleet) Forget(ctx context.Context, name string) error {
	if !f.isRemote(name) {
		if f.cfg.Local != nil && f.cfg.Local.Name() == name {
			return nodeapi.Mark(nodeapi.ErrConflict, fmt.Errorf("node %s is in this master's own process; stop the process to remove it", name))
		}
		return nodeapi.Mark(nodeapi.ErrNotFound, fmt.Errorf("node %q: not found", name))
	}
	k, err := f.cfg.Store.CountPlacements(ctx, name)
	if err != nil {
		return err
	}
	if k > 0 {
		return nodeapi.Mark(nodeapi.ErrConflict, fmt.Errorf("node %s has %d sandbox(es); delete them first", name, k))
	}
	if err := f.cfg.Store.DeleteNode(ctx, name); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.remote, name)
	delete(f.addrs, name)
	f.mu.Unlock()
	return nil
}

// PrepareTemplate gives t to every node; on a failure it takes it back
// from those that had it and says which node refused.
func (f *Fleet) PrepareTemplate(ctx context.Context, t store.Template) error {
	var done []nodeapi.Node
	for _, n := range f.Nodes() {
		if err := n.PrepareTemplate(ctx, wireTemplate(t)); err != nil {
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

func wireTemplate(t store.Template) api.Template {
	return api.Template{Name: t.Name, Rootfs: t.Rootfs, Process: t.Process, Ports: t.Ports, MemoryMiB: t.MemoryMiB, Principal: t.Principal, Warm: t.Warm, CreatedAt: t.CreatedAt}
}
