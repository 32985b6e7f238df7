package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// setGen gives sandbox id generation gen.
func setGen(t *testing.T, n *Node, id string, gen int64) {
	t.Helper()
	if _, err := n.st.UpdateSandbox(context.Background(), id, func(s *store.Sandbox) error { s.Generation = gen; return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestFence: a fence retires exactly the sandboxes at or below its
// generation that the master neither placed here nor has in flight; a
// retired one is stopped, loses its principal, never wakes, and is
// deleted unless its volume holds files (then kept detached); a create
// the fence gave up on is refused, one in flight or newer is not; the
// fence's generation survives a restart of the node.
func TestFence(t *testing.T) {
	be := newFakeBackend()
	n := newFakeNode(t, be)
	ctx := context.Background()
	for i, c := range []struct {
		id  string
		gen int64
	}{{"kept", 3}, {"stray", 4}, {"data", 2}, {"flying", 5}, {"newer", 9}, {"old", 0}} {
		addFakeSandbox(t, n, be, c.id, i, api.TierHot)
		setGen(t, n, c.id, c.gen)
	}
	// "old" predates generations: placed here, so kept by its ID.
	if err := os.MkdirAll(filepath.Join(string(n.h.Dir("data")), "upper", "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(string(n.h.Dir("data")), "upper", "home", "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The node's own resolver file is not data.
	if err := os.MkdirAll(filepath.Join(string(n.h.Dir("stray")), "upper", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(string(n.h.Dir("stray")), "upper", "etc", "resolv.conf"), []byte("nameserver 10.0.0.1\n"), 0o644)

	retired, err := n.Fence(ctx, 8, []string{"kept", "old"}, []int64{5})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(retired)
	if strings.Join(retired, ",") != "data,stray" {
		t.Fatalf("retired %v, want data,stray (newer is above the fence, flying in flight, kept and old placed)", retired)
	}
	testenv.WaitFor(t, 5*time.Second, "stray deleted (its volume held only the node's resolv.conf)", func() bool {
		_, err := n.st.GetSandbox(ctx, "stray")
		return errors.Is(err, errdefs.ErrNotFound)
	})
	testenv.WaitFor(t, 5*time.Second, "data detached", func() bool {
		sb, err := n.st.GetSandbox(ctx, "data")
		return err == nil && sb.Tier == api.TierDetached && sb.Transition == ""
	})
	if be.stateOf("stray") == sandbox.StateRunning || be.stateOf("data") == sandbox.StateRunning {
		t.Errorf("a retired sandbox still runs: stray %v, data %v", be.stateOf("stray"), be.stateOf("data"))
	}
	data, _ := n.st.GetSandbox(ctx, "data")
	if !data.LeftBehind || data.Principal != "left-behind.data" || !strings.Contains(data.Note, "left behind") || !strings.Contains(data.Note, "delete it by its ID") {
		t.Errorf("the retired copy with data: %+v", data)
	}
	if _, err := os.Stat(filepath.Join(string(n.h.Dir("data")), "upper", "home", "notes.txt")); err != nil {
		t.Errorf("its files went: %v", err)
	}
	if err := n.Wake(ctx, "data"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("waking a left-behind sandbox: %v, want a conflict", err)
	}
	for _, id := range []string{"kept", "flying", "newer", "old"} {
		if sb, _ := n.st.GetSandbox(ctx, id); sb.LeftBehind || be.stateOf(id) != sandbox.StateRunning {
			t.Errorf("%s was touched: %+v %v", id, sb, be.stateOf(id))
		}
	}

	// Creates: given up (6, at or below 8 and not in flight) refused; in
	// flight (5) and above the fence (9) go through to the start (which
	// fails here on the fake template's missing rootfs, not on the fence).
	tm, _ := n.st.GetTemplate(ctx, "t")
	if _, err := n.Create(ctx, tm, "late", "", 0, 6, nil, nil); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "given up") {
		t.Errorf("a create the fence gave up on: %v", err)
	}
	for _, g := range []int64{5, 9, 0} {
		if _, err := n.Create(ctx, tm, "", "", 0, g, nil, nil); err == nil || strings.Contains(err.Error(), "given up") {
			t.Errorf("create of generation %d: %v, want it past the fence", g, err)
		}
	}

	// A fence never lowers the mark, and the mark outlives the process.
	if _, err := n.Fence(ctx, 3, []string{"kept", "old", "flying", "newer", "data"}, nil); err != nil {
		t.Fatal(err)
	}
	if g, _ := n.st.Counter(ctx, fenceCounter); g != 8 {
		t.Errorf("fence mark stored %d, want 8", g)
	}
	n2, err := New(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n2.Close)
	if _, err := n2.Create(ctx, tm, "late2", "", 0, 7, nil, nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("after a restart, a create below the fence: %v", err)
	}
}
