package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/memguard"
)

// TestSnapshotShipped (issue 31, item 2): a snapshot lives on its
// sandbox's node. A sandbox made from it while that node has no room is
// made on another node: the snapshot is shipped there first (moved live:
// its image and volume, nothing woken), and the new sandbox has the
// memory the snapshot was taken with. Master and nodes agree after.
func TestSnapshotShipped(t *testing.T) {
	avail, err := memguard.AvailableMiB()
	if err != nil {
		t.Fatal(err)
	}
	n1 := fleetMachine(t, 1, "--memory-reserve", "0")
	n2 := fleetMachine(t, 2, "--memory-reserve", "0")
	m := startDaemon(t, masterOnly)
	pair(t, m, n1)
	pair(t, m, n2)
	// Warm, so that what is made of its memory is reseeded (SIGUSR1).
	if _, err := m.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "web", RootfsDir: webRootfs,
		Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports,
		Warm: &api.Warm{Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, id := range m.trackedIDs() {
			m.C.DeleteSandbox(ctxT(t), id)
		}
	})
	// The sandbox and its snapshot on node-1: node-2 takes nothing new
	// meanwhile.
	drainOut(t, m, n2.name)
	sb, err := m.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "web", Name: "shipped"})
	if err != nil {
		t.Fatal(err)
	}
	m.track(sb.ID)
	count := callN(t, sb, 3)
	snap, err := m.C.TakeSnapshot(ctxT(t), sb.ID, "before")
	if err != nil {
		t.Fatal(err)
	}
	m.track(snap.ID)
	if got, err := m.C.Sandbox(ctxT(t), snap.ID); err != nil || got.Node != n1.name || got.Tier != api.TierSnapshot {
		t.Fatalf("the snapshot: %+v %v; want it on %s in the snapshot tier", got, err, n1.name)
	}
	if err := m.C.Undrain(ctxT(t), n2.name); err != nil {
		t.Fatal(err)
	}
	// Node-1 has no room any more: it starts again keeping more memory
	// free than the machine has.
	n1.stop(syscall.SIGTERM)
	n1.args = append(n1.args, "--memory-reserve", fmt.Sprint(avail+100_000))
	n1.start()
	waitNode(t, m, n1.name, 60*time.Second, n1.name+" back", nodeReconciled)

	child, err := m.C.FromSnapshot(ctxT(t), snap.ID, api.SandboxRequest{Name: "from-shipped"})
	if err != nil {
		t.Fatalf("a sandbox from a snapshot whose node has no room: %v", err)
	}
	m.track(child.ID)
	if child.Node != n2.name {
		t.Errorf("made on %s, want %s (the node with room)", child.Node, n2.name)
	}
	if c := getCount(t, endpoint(t, child)); c != count+1 {
		t.Errorf("its counter says %d, want %d: not the snapshot's memory", c, count+1)
	}
	if got, err := m.C.Sandbox(ctxT(t), snap.ID); err != nil || got.Node != n2.name || got.Tier != api.TierSnapshot {
		t.Errorf("the snapshot after: %+v %v; want it shipped to %s, still in the snapshot tier", got, err, n2.name)
	}
	agree(t, "after the shipping", m, n1, n2)
}
