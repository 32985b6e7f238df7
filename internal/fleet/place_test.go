package fleet

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi"
	noderemote "sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// roomyRemote is a fleet whose paired node "far" has the most headroom,
// so every create goes there first.
func roomyRemote(t *testing.T) (local, remote *node, f *Fleet) {
	local = &node{name: "local", availMiB: 100}
	remote = &node{name: "far", availMiB: 9000}
	return local, remote, fleetOf(t, local, remote)
}

// cut makes n's Create end with its connection broken, as a node killed
// mid-create does: after it made the sandbox (made true) or before.
func cut(n *node, when bool) {
	n.onCreate = func(made bool) error {
		if made != when {
			return nil
		}
		n.onCreate = nil
		n.srv.CloseClientConnections()
		if !made {
			return errors.New("killed before it made anything")
		}
		return nil
	}
}

// TestCreateCutShortIsNotPlacedTwice (issue 14, "a create retried
// elsewhere leaves a twin"): a create whose node breaks the connection
// after it got the request is undecided — the caller gets ErrNodeDown,
// no other node is tried, the name stays taken (a retry is told to wait,
// not given a second copy) — until the node reports: a sandbox of that
// generation is adopted as the placement.
func TestCreateCutShortIsNotPlacedTwice(t *testing.T) {
	ctx := context.Background()
	local, remote, f := roomyRemote(t)
	cut(remote, true)
	_, err := f.Create(ctx, nodeapi.CreateRequest{Name: "u"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "may have made sandbox u") {
		t.Fatalf("a create whose connection broke: %v", err)
	}
	if len(local.made) != 0 {
		t.Fatalf("it was tried on another node too: %v", local.made)
	}
	// The report stream broke too; while the node is lost the name is
	// held by an undecided attempt (a retry waits), or, once it reports,
	// by what it made (a retry is refused: exists).
	_, err = f.Create(ctx, nodeapi.CreateRequest{Name: "u"})
	if !errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a retry of the undecided create: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the attempt adopted", func() bool {
		p, err := f.cfg.Store.GetPlacement(ctx, "u")
		return err == nil && p.State == "" && p.ID == "far-u" && p.Node == "far"
	})
	if _, err := f.Create(ctx, nodeapi.CreateRequest{Name: "u"}); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a retry once it was adopted: %v, want exists", err)
	}
	if slices.Contains(local.made, "u") || len(remote.made) != 1 {
		t.Errorf("copies: local %v, far %v", local.made, remote.made)
	}
	testenv.WaitFor(t, 10*time.Second, "a fence that keeps it", func() bool {
		fence, _ := remote.lastFence()
		return slices.Contains(fence.Keep, "far-u")
	})
	all, _ := f.List(ctx)
	if len(all) != 1 || all[0].ID != "far-u" || all[0].LeftBehind || strings.Contains(all[0].Note, "left behind") {
		t.Errorf("the list: %+v", all)
	}
}

// TestCreateNeverMadeIsGivenUp: a create whose node broke the connection
// before it made anything is settled when the node reports without it:
// the node is fenced past its generation first (so the request, were it
// still on its way, would be refused), and only then is the name free.
func TestCreateNeverMadeIsGivenUp(t *testing.T) {
	ctx := context.Background()
	_, remote, f := roomyRemote(t)
	cut(remote, false)
	if _, err := f.Create(ctx, nodeapi.CreateRequest{Name: "v"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a create whose connection broke: %v", err)
	}
	gen, _ := f.cfg.Store.Generation(ctx)
	testenv.WaitFor(t, 10*time.Second, "the attempt given up", func() bool {
		_, err := f.cfg.Store.GetPlacement(ctx, "v")
		return errors.Is(err, errdefs.ErrNotFound)
	})
	fence, _ := remote.lastFence()
	if fence.Generation < gen || slices.Contains(fence.InFlight, gen) {
		t.Errorf("the name was freed without a fence past generation %d: %+v", gen, fence)
	}
	if sb, err := f.Create(ctx, nodeapi.CreateRequest{Name: "v"}); err != nil || sb.Node != "far" {
		t.Errorf("the name once free: %+v %v", sb, err)
	}
}

// TestCreateNotSentTriesTheNext: a create that never reached its node (the
// dial failed) cannot have been made there, so the next node is tried.
func TestCreateNotSentTriesTheNext(t *testing.T) {
	ctx := context.Background()
	_, _, f := roomyRemote(t)
	// Its report stream keeps its connection; new ones go nowhere.
	f.mu.Lock()
	f.nodes["far"].(*noderemote.Client).Base = "https://127.0.0.1:1"
	f.mu.Unlock()
	sb, err := f.Create(ctx, nodeapi.CreateRequest{Name: "w"})
	if err != nil || sb.Node != "local" {
		t.Fatalf("a create whose dial failed: %+v %v", sb, err)
	}
}

// TestInFlightCreatesAreKept: a fence sent while a create is under way
// names its generation in flight, so the node neither retires what it is
// making nor refuses it.
func TestInFlightCreatesAreKept(t *testing.T) {
	ctx := context.Background()
	_, remote, f := roomyRemote(t)
	_, before := remote.lastFence()
	var during nodeapi.FenceRequest
	remote.onCreate = func(made bool) error {
		if !made {
			f.resolve(ctx, "far")
			during, _ = remote.lastFence()
		}
		return nil
	}
	if _, err := f.Create(ctx, nodeapi.CreateRequest{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	gen, _ := f.cfg.Store.Generation(ctx)
	if _, n := remote.lastFence(); n <= before || !slices.Contains(during.InFlight, gen) || during.Generation < gen {
		t.Errorf("a fence during create %d: %+v", gen, during)
	}
}

// TestDeleteUnderWayIsNotRedone: a settle with a node (its report came)
// while a delete of one of its sandboxes is under way leaves that
// sandbox to the delete: it is deleted once, and its placement goes with
// the delete's answer.
func TestDeleteUnderWayIsNotRedone(t *testing.T) {
	ctx := context.Background()
	_, remote, f := roomyRemote(t)
	sb, err := f.Create(ctx, nodeapi.CreateRequest{Name: "d"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "far reports d", func() bool {
		_, got, err := f.Find(ctx, "d")
		return err == nil && got.ID == sb.ID
	})
	n, _, _ := f.Find(ctx, "d")
	remote.onDelete = func() {
		remote.onDelete = nil
		f.resolve(ctx, "far") // as a report arriving now would
		if fence, _ := remote.lastFence(); !slices.Contains(fence.Keep, sb.ID) {
			t.Errorf("a fence during the delete does not keep %s: %+v", sb.ID, fence)
		}
	}
	if err := f.Delete(ctx, n, sb); err != nil {
		t.Fatal(err)
	}
	remote.mu.Lock()
	deletes := remote.deletes
	remote.mu.Unlock()
	if deletes != 1 {
		t.Errorf("the node was asked to delete %d times, want once", deletes)
	}
	if _, err := f.cfg.Store.GetPlacement(ctx, "d"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("its placement after the delete: %v", err)
	}
}

// TestUndecidedCreateDeleted: an undecided create its caller deletes
// while its node is lost is dropped at once (its name is free), and what
// its node made of it is not kept by the next fence: the node retires it.
func TestUndecidedCreateDeleted(t *testing.T) {
	ctx := context.Background()
	_, remote, f := roomyRemote(t)
	cut(remote, true)
	if _, err := f.Create(ctx, nodeapi.CreateRequest{Name: "z"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a create whose connection broke: %v", err)
	}
	gen, _ := f.cfg.Store.Generation(ctx)
	// Deleted while its node is lost (its report stream broke with the
	// create): given up at once. (While the node answers, a delete settles
	// with it first.)
	testenv.WaitFor(t, 10*time.Second, "far lost", func() bool { l, _ := f.linkOf("far"); return l.lost(time.Now()) })
	n, sb, err := f.Find(ctx, "z")
	if err != nil || sb.ID != store.PendingID(gen) {
		t.Fatalf("the undecided create: %+v %v", sb, err)
	}
	if err := f.Delete(ctx, n, sb); err != nil {
		t.Fatalf("delete the undecided create: %v", err)
	}
	if _, err := f.cfg.Store.GetPlacement(ctx, "z"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("its name is still taken: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "a fence past it", func() bool {
		fence, _ := remote.lastFence()
		return fence.Generation >= gen
	})
	if fence, _ := remote.lastFence(); slices.Contains(fence.Keep, "far-z") || slices.Contains(fence.InFlight, gen) {
		t.Errorf("the fence keeps what the deleted create made: %+v", fence)
	}
}
