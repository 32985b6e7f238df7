package e2e

import (
	"net/http"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/testenv"
)

// TestDrainMastersNode (issue 30): the node in the master's own process
// is a member like a paired one — its sandboxes are placed, reported and
// fenced — so it drains as any other: its sandbox moves live to a paired
// node with its memory (the counter goes on), keeps its ID and name, and
// the master's node takes no new sandbox until it is undrained. A
// sandbox moves back onto it too.
func TestDrainMastersNode(t *testing.T) {
	n1 := fleetMachine(t, 1)
	m := startDaemon(t)
	pair(t, m, n1)
	m.registerWeb(t, "web")
	t.Cleanup(func() {
		for _, id := range m.trackedIDs() {
			m.C.DeleteSandbox(ctxT(t), id)
		}
	})
	nodes := listNodes(t, m)
	if len(nodes) != 2 || nodes[1].Name != n1.name {
		t.Fatalf("nodes: %+v; want the master's own, then %s", nodes, n1.name)
	}
	own := nodes[0].Name
	// Only the master's node takes work: node-1 drains meanwhile.
	drainOut(t, m, n1.name)
	sb, err := m.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "web", Name: "homebody"})
	if err != nil {
		t.Fatal(err)
	}
	m.track(sb.ID)
	if sb.Node != own {
		t.Fatalf("made on %s while %s drains; want %s", sb.Node, n1.name, own)
	}
	count := callN(t, sb, 3)
	if err := m.C.Undrain(ctxT(t), n1.name); err != nil {
		t.Fatal(err)
	}

	evs, sum := drainOut(t, m, own)
	if sum.Moved != 1 || sum.Failed != 0 || sum.Left != 0 || len(evs) != 1 || evs[0].To != n1.name {
		t.Fatalf("drain of the master's node: %+v, %+v", evs, sum)
	}
	moved, err := m.C.Sandbox(ctxT(t), sb.ID)
	if err != nil || moved.Node != n1.name || moved.Name != sb.Name {
		t.Fatalf("after the drain: %+v %v", moved, err)
	}
	if c := getCount(t, endpoint(t, moved)); c != count+1 {
		t.Errorf("its counter says %d after the move, want %d", c, count+1)
	}
	if _, err := m.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "web", Name: "newcomer"}); err != nil {
		t.Fatal(err)
	} else if got, _ := m.C.Sandbox(ctxT(t), "newcomer"); got.Node == own {
		t.Errorf("a new sandbox went to the draining master's node")
	} else {
		m.track(got.ID)
	}
	// Back onto the master's node, by name.
	if err := m.C.Undrain(ctxT(t), own); err != nil {
		t.Fatal(err)
	}
	// The copy the drain left is deleted after its answer: until then a
	// move of the sandbox is a conflict (409), which a caller retries.
	var back api.Sandbox
	testenv.WaitFor(t, 30*time.Second, "the sandbox moves back", func() bool {
		back, err = m.C.MoveTo(ctxT(t), sb.ID, own)
		if err != nil && client.StatusOf(err) != http.StatusConflict {
			t.Fatalf("move back: %v", err)
		}
		return err == nil
	})
	if back.Node != own {
		t.Fatalf("moved back to %s, want %s", back.Node, own)
	}
	if c := getCount(t, endpoint(t, back)); c != count+2 {
		t.Errorf("its counter says %d after moving back, want %d", c, count+2)
	}
}
