package fleet

import (
	"testing"
	"time"

	noderemote "sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/testenv"
)

// TestHealth: the master's view of its nodes for its metrics — the local
// node and a paired node each up with a recent report while it reports
// (every 100 ms here), the paired one lost once its stream is cut, its
// last report ageing.
func TestHealth(t *testing.T) {
	local := &node{name: "local", availMiB: 100}
	remote := &node{name: "far", availMiB: 9000}
	f := fleetOf(t, local, remote)
	hs := f.Health()
	if len(hs) != 2 || hs[0].Name != "local" || hs[0].Lost || time.Since(hs[0].LastReport) > time.Second {
		t.Fatalf("Health = %+v; want local first, reporting", hs)
	}
	if h := hs[1]; h.Name != "far" || h.Lost || time.Since(h.LastReport) > time.Second {
		t.Errorf("far while it reports: %+v", h)
	}
	f.mu.Lock()
	f.nodes["far"].(*noderemote.Client).Base = "https://127.0.0.1:1"
	f.mu.Unlock()
	remote.srv.CloseClientConnections()
	testenv.WaitFor(t, 10*time.Second, "far lost", func() bool { return f.Health()[1].Lost })
	last := f.Health()[1].LastReport
	if last.IsZero() || f.Health()[0].Lost {
		t.Errorf("after far was lost: %+v", f.Health())
	}
}
