package routes

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/ingress"
	"sandstorm/internal/nodeapi"
)

func route(id, node string, gen int64) nodeapi.Route {
	return nodeapi.Route{ID: id, Node: node, Generation: gen, AccessToken: "t-" + id}
}

func TestDiff(t *testing.T) {
	from := map[string]nodeapi.Route{"a": route("a", "n1", 1), "b": route("b", "n1", 2), "c": route("c", "n2", 3)}
	to := map[string]nodeapi.Route{"a": route("a", "n1", 1), "b": route("b", "n2", 4), "d": route("d", "n2", 5)}
	set, drop := Diff(from, to)
	if len(set) != 2 || set[0].ID != "b" || set[1].ID != "d" || !slices.Equal(drop, []string{"c"}) {
		t.Errorf("Diff: set %+v drop %v", set, drop)
	}
	if set, drop := Diff(to, to); len(set)+len(drop) != 0 {
		t.Errorf("no change: %v %v", set, drop)
	}
}

// TestPublisher: a node gets the table whole first, then only changes;
// nothing when nothing changed; a node that lost its table (a restart)
// refuses the next change and gets the table whole again.
func TestPublisher(t *testing.T) {
	table := []nodeapi.Route{route("a", "n1", 1)}
	n := fleettest.NewNode()
	peers := []nodeapi.Peer{{Name: "n1"}}
	p := NewPublisher(func(context.Context) (Snapshot, error) {
		return Snapshot{Routes: slices.Clone(table), Peers: slices.Clone(peers)}, nil
	},
		func() []nodeapi.Node { return []nodeapi.Node{n} }, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	count := func() int {
		c := 0
		for _, call := range n.Calls {
			if call == "routes" {
				c++
			}
		}
		return c
	}
	p.Publish(ctx)
	if r, ok := n.Routes.Get("a"); !ok || r.Node != "n1" || count() != 1 {
		t.Fatalf("first push: %+v %v, %d pushes", r, ok, count())
	}
	p.Publish(ctx)
	if count() != 1 {
		t.Errorf("a push with nothing changed")
	}
	table = []nodeapi.Route{route("a", "n2", 2), route("b", "n1", 3)}
	p.Publish(ctx)
	if r, _ := n.Routes.Get("a"); r.Node != "n2" || count() != 2 {
		t.Errorf("the change: %+v, %d pushes", r, count())
	}
	if !n.Routes.AllowPeer("n1", time.Now()) || n.Routes.AllowPeer("n2", time.Now()) {
		t.Errorf("peers: n1 is paired, n2 is not")
	}
	// A node forgotten and paired again: only its new certificates.
	at := time.Now()
	peers = []nodeapi.Peer{{Name: "n1", RevokedAt: at}}
	p.Publish(ctx)
	if count() != 3 || n.Routes.AllowPeer("n1", at.Add(-time.Minute)) || !n.Routes.AllowPeer("n1", at.Add(time.Second)) {
		t.Errorf("after n1's revocation: %d pushes; an older certificate allowed %v", count(), n.Routes.AllowPeer("n1", at.Add(-time.Minute)))
	}
	n.Routes = ingress.NewTable() // the node restarted
	table = append(table, route("c", "n1", 4))
	p.Publish(ctx)
	if _, n2 := n.Routes.Stat(); n2 != 3 || count() != 5 {
		t.Errorf("after the node's restart: %d routes, %d pushes (want the change refused, then the table whole)", n2, count())
	}
	// A restart while nothing changes: no push would reach it, until the
	// fleet says its node came back (Forget).
	n.Routes = ingress.NewTable()
	p.Publish(ctx)
	if _, n2 := n.Routes.Stat(); n2 != 0 || count() != 5 {
		t.Fatalf("with nothing changed: %d routes, %d pushes (the test's premise)", n2, count())
	}
	p.Forget(n.Name())
	p.Publish(ctx)
	if _, n2 := n.Routes.Stat(); n2 != 3 || count() != 6 {
		t.Errorf("after Forget: %d routes, %d pushes; want the table whole at once", n2, count())
	}
}

// stuck is a node whose pushes wait until released.
type stuck struct {
	*fleettest.Node
	release chan struct{}
}

func (s stuck) Name() string { return "slow" }

func (s stuck) PutRoutes(ctx context.Context, u nodeapi.Routes) error {
	<-s.release
	return s.Node.PutRoutes(ctx, u)
}

// TestPublisherSlowNode: a node slow to take its routes (about to be
// taken for lost) holds no other node's back; a change made meanwhile
// reaches it once it answers.
func TestPublisherSlowNode(t *testing.T) {
	table := []nodeapi.Route{route("a", "n1", 1)}
	slow := stuck{Node: fleettest.NewNode(), release: make(chan struct{})}
	fast := fleettest.NewNode()
	p := NewPublisher(func(context.Context) (Snapshot, error) { return Snapshot{Routes: slices.Clone(table)}, nil },
		func() []nodeapi.Node { return []nodeapi.Node{slow, fast} }, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	p.publish(ctx, false)
	table = append(table, route("b", "n1", 2))
	p.publish(ctx, false) // the slow node's first push is still under way
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, n := fast.Routes.Stat(); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fast node did not get its routes while the slow one held its push")
		}
		p.publish(ctx, false)
	}
	close(slow.release)
	// Once its push is done, the next publish brings it the change.
	deadline = time.Now().Add(10 * time.Second)
	for {
		p.Publish(ctx)
		if _, n := slow.Routes.Stat(); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow node never got the change made while its push was under way")
		}
	}
}
