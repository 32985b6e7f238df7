package e2e

import (
	"testing"

	"sandstorm/api"
)

// TestTwoDaemons runs two daemons on one machine, each with its own data
// dir, subnet and gateway ports (as a benchmark next to a test run, or two
// CI jobs, do). Starting the second must not touch the first one's
// sandboxes: its reconcile may only remove what its own node made.
func TestTwoDaemons(t *testing.T) {
	a := startDaemon(t)
	a.registerWeb(t, "web")
	sb := a.create(t, "web", "first")
	ep := endpoint(t, sb)
	expectCount(t, ep, 1, "first call")

	b := startDaemon(t)
	b.registerWeb(t, "web")
	other := b.create(t, "web", "second")
	expectCount(t, endpoint(t, other), 1, "the second daemon's sandbox")

	if !exists(netnsPath(sb.ID)) {
		t.Errorf("starting a second daemon removed the first daemon's network namespace %s", netnsPath(sb.ID))
	}
	if !linkExists(hostLink(sb.ID)) {
		t.Errorf("starting a second daemon removed the first daemon's host link %s", hostLink(sb.ID))
	}
	a.checkKernelObjects(t)
	b.checkKernelObjects(t)
	if t.Failed() {
		t.FailNow()
	}
	expectCount(t, ep, 2, "the first daemon's sandbox after a second daemon started")
	a.transition(t, sb.ID, "snapshot", api.TierSnapshot)
	expectCount(t, ep, 3, "the first daemon's sandbox restored after a second daemon started")
}
