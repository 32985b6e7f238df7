package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// Issue 18, item 4: node maintenance without loss. A sandbox moves to
// another node with its memory and volume; a drain moves every sandbox of
// a node; a move cut short by the death of the node it was going to
// leaves every sandbox whole, in one place.

// drainOut drains node name through d and returns what it said.
func drainOut(t *testing.T, d *Daemon, name string) ([]api.DrainEvent, api.DrainEvent) {
	t.Helper()
	var evs []api.DrainEvent
	sum, err := d.C.Drain(ctxT(t), name, func(ev api.DrainEvent) {
		t.Logf("drain %s: %+v", name, ev)
		evs = append(evs, ev)
	})
	if err != nil {
		t.Fatalf("drain %s: %v", name, err)
	}
	return evs, sum
}

func nodeStatus(t *testing.T, d *Daemon, name string) api.NodeStatus {
	t.Helper()
	for _, n := range listNodes(t, d) {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return api.NodeStatus{}
}

// counted is a sandbox and what its counter said last.
type counted struct {
	sb    api.Sandbox
	count int
	tier  api.Tier
}

// callN calls sb's endpoint n times and returns the last count.
func callN(t *testing.T, sb api.Sandbox, n int) int {
	t.Helper()
	c := 0
	for range n {
		c = getCount(t, endpoint(t, sb))
	}
	return c
}

// TestDrain: three nodes, each in a network namespace of its own, paired
// over mutual TLS with a master. Four sandboxes on node-1, one in every
// tier, each with a counter in its memory and a file in its volume, are
// drained off it: each keeps its ID, name, principal, labels and tier, is
// on another node with that node's endpoints, answers there with its
// counter where it was (the detached one starts cold, its file with it),
// and commands reach it at its new node; nothing of them runs on node-1,
// which takes no new sandbox until it is undrained. Then a drain of
// node-2 whose only target, node-3, is killed with -9 as the sandboxes
// arrive: after node-3 is back every sandbox answers with its counter
// intact, in one place, and the master and the nodes agree.
func TestDrain(t *testing.T) {
	n1 := fleetMachine(t, 1)
	n2 := fleetMachine(t, 2)
	n3 := fleetMachine(t, 3)
	m := startDaemon(t, masterOnly)
	for _, n := range []*machine{n1, n2, n3} {
		pair(t, m, n)
	}
	m.registerWeb(t, "web")
	t.Cleanup(func() {
		// The master lets go of the nodes before their namespaces go.
		for _, id := range m.trackedIDs() {
			m.C.DeleteSandbox(ctxT(t), id)
		}
	})

	// Only node-1 takes work: the others are drained (they are empty).
	for _, n := range []*machine{n2, n3} {
		if _, sum := drainOut(t, m, n.name); sum.Moved != 0 || sum.Left != 0 {
			t.Fatalf("drain of empty %s: %+v", n.name, sum)
		}
	}
	if st := nodeStatus(t, m, n2.name); !st.Draining {
		t.Fatalf("%s is not listed draining: %+v", n2.name, st)
	}
	env := []string{"SANDSTORM_API=" + m.API, "SANDSTORM_DATA_DIR=" + m.DataDir, "SANDSTORM_TOKEN="}
	tiers := map[string]api.Tier{"dr-hot": api.TierHot, "dr-frozen": api.TierFrozen, "dr-snap": api.TierSnapshot, "dr-det": api.TierDetached}
	before := map[string]counted{}
	for name, tier := range tiers {
		sb, err := m.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "web", Name: name, Labels: map[string]string{"app": "drain"}})
		if err != nil {
			t.Fatal(err)
		}
		m.track(sb.ID)
		if sb.Node != n1.name {
			t.Fatalf("%s went to %s while the others drain", name, sb.Node)
		}
		c := callN(t, sb, 3)
		// A file in its volume, written by the sandbox itself.
		cli(t, env, "sandbox", "exec", name, "--", py, "-c", "open('/keep.txt','w').write('"+name+"')").ok(t, "write a file in "+name)
		if tier != api.TierHot {
			m.transition(t, sb.ID, map[api.Tier]string{api.TierFrozen: "freeze", api.TierSnapshot: "snapshot", api.TierDetached: "detach"}[tier], tier)
		}
		before[name] = counted{sb: sb, count: c, tier: tier}
	}
	for _, n := range []*machine{n2, n3} {
		cli(t, env, "node", "undrain", n.name).ok(t, "undrain "+n.name)
	}

	began := time.Now()
	r := cli(t, env, "node", "drain", n1.name)
	r.ok(t, "drain "+n1.name)
	t.Logf("drain of %s with a sandbox in every tier: %v\n%s", n1.name, time.Since(began), r.Stdout)
	if !strings.Contains(r.Stdout, "4 moved, 0 not moved, 0 left") {
		t.Errorf("drain said: %s", r.Stdout)
	}
	// Its tier counts come with its next heartbeat (a second).
	testenv.WaitFor(t, 10*time.Second, n1.name+" listed drained", func() bool {
		st := nodeStatus(t, m, n1.name)
		return st.Draining && st.Sandboxes[api.TierHot]+st.Sandboxes[api.TierFrozen]+st.Sandboxes[api.TierSnapshot]+st.Sandboxes[api.TierDetached] == 0
	})
	if ls := cli(t, env, "node", "ls"); !strings.Contains(ls.Stdout, "drained") {
		t.Errorf("node ls does not show %s drained:\n%s", n1.name, ls.Stdout)
	}
	agree(t, "after the drain", m, n1, n2, n3)
	if run := n1.running(t); len(run) != 0 {
		t.Errorf("%s still runs %v", n1.name, run)
	}
	for name, b := range before {
		sb := m.get(t, name)
		switch {
		case sb.ID != b.sb.ID || sb.Principal != b.sb.Principal:
			t.Errorf("%s: ID %s principal %s, was %s %s", name, sb.ID, sb.Principal, b.sb.ID, b.sb.Principal)
		case sb.Node == n1.name || sb.Tier != b.tier || sb.Moving != "":
			t.Errorf("%s after the drain: node %s tier %s moving %q (was %s)", name, sb.Node, sb.Tier, sb.Moving, b.tier)
		case sb.Labels["app"] != "drain":
			t.Errorf("%s lost its labels: %v", name, sb.Labels)
		case endpoint(t, sb) == endpoint(t, b.sb):
			t.Errorf("%s kept its endpoint %s on another node", name, endpoint(t, sb))
		}
		if addr := map[string]string{n2.name: n2.addr, n3.name: n3.addr}[sb.Node]; addr == "" || !strings.Contains(endpoint(t, sb), addr+":") {
			t.Errorf("%s's endpoint %s is not its node %s's", name, endpoint(t, sb), sb.Node)
		}
		want := b.count + 1
		if b.tier == api.TierDetached {
			want = 1 // a detached sandbox holds no memory: a cold start
		}
		if c := getCount(t, endpoint(t, sb)); c != want {
			t.Errorf("%s (%s) counts %d after its move, want %d", name, b.tier, c, want)
		}
		got := cli(t, env, "sandbox", "exec", name, "--", py, "-c", "print(open('/keep.txt').read())")
		if got.Code != 0 || strings.TrimSpace(got.Stdout) != name {
			t.Errorf("%s's file after its move, by exec at its new node: exit %d %q %q", name, got.Code, got.Stdout, got.Stderr)
		}
		if _, err := os.Stat(filepath.Join(n1.dataDir, "sandboxes", sb.ID)); err == nil {
			t.Errorf("%s's directory is still on %s", name, n1.name)
		}
		before[name] = counted{sb: sb, count: want, tier: sb.Tier}
	}
	if sb, err := m.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "web", Name: "dr-new"}); err != nil || sb.Node == n1.name {
		t.Errorf("a create while %s drains: %+v %v", n1.name, sb.Node, err)
	} else {
		m.track(sb.ID)
		m.C.DeleteSandbox(ctxT(t), sb.ID)
	}

	// A drain cut short: node-2's sandboxes (all hot now) go to node-3
	// only (node-1 still drains), and node-3 is killed as they arrive.
	var onN2 []string
	for name := range before {
		sb := m.get(t, name)
		if sb.Node == n3.name {
			if _, err := m.C.MoveTo(ctxT(t), name, n2.name); err != nil {
				t.Fatalf("move %s to %s: %v", name, n2.name, err)
			}
		}
		if sb := m.get(t, name); sb.Tier != api.TierHot {
			m.transition(t, sb.ID, "wake", api.TierHot)
		}
		onN2 = append(onN2, name)
	}
	for _, name := range onN2 {
		sb := m.get(t, name)
		if sb.Node != n2.name {
			t.Fatalf("%s is on %s, want %s", name, sb.Node, n2.name)
		}
		before[name] = counted{sb: sb, count: getCount(t, endpoint(t, sb)), tier: api.TierHot}
	}
	done := make(chan api.DrainEvent, 1)
	go func() {
		sum, err := m.C.Drain(ctxT(t), n2.name, func(ev api.DrainEvent) { t.Logf("cut drain: %+v", ev) })
		if err != nil {
			t.Logf("cut drain: %v", err)
		}
		done <- sum
	}()
	startedOn(t, n3)
	n3.stop(syscall.SIGKILL)
	sum := <-done
	t.Logf("the drain with %s killed: %+v", n3.name, sum)
	n3.start()
	ready(t, m, n3)
	agree(t, "after the target node came back", m, n1, n2, n3)
	for _, name := range onN2 {
		sb := m.get(t, name)
		if sb.ID != before[name].sb.ID || sb.Node == n1.name {
			t.Errorf("%s after the cut drain: %+v", name, sb)
			continue
		}
		if c := getCount(t, endpoint(t, sb)); c != before[name].count+1 {
			t.Errorf("%s (on %s, %s) counts %d after the cut drain, want %d: its memory was not kept whole", name, sb.Node, sb.Tier, c, before[name].count+1)
		}
	}
	agree(t, "after every sandbox answered", m, n1, n2, n3)

	// A drain cut short by the master's death: the master is killed with
	// -9 as the first sandbox arrives on node-3, and started again; it
	// settles each move it left (given up before its commit point,
	// finished after it) from the nodes' reports.
	for _, name := range onN2 {
		sb := m.get(t, name)
		before[name] = counted{sb: sb, count: getCount(t, endpoint(t, sb)), tier: api.TierHot}
	}
	go m.C.Drain(ctxT(t), n2.name, nil)
	startedOn(t, n3)
	m.Kill(t)
	m.Start(t)
	agree(t, "after the master came back mid-drain", m, n1, n2, n3)
	for _, l := range strings.Split(m.logTail(400), "\n") {
		if strings.Contains(l, "left unfinished") || strings.Contains(l, "has no move under way") {
			t.Log("the master after its restart:", l)
		}
	}
	for _, name := range onN2 {
		sb := m.get(t, name)
		if sb.ID != before[name].sb.ID || sb.Node == n1.name || sb.Moving != "" {
			t.Errorf("%s after the master's death: %+v", name, sb)
			continue
		}
		if c := getCount(t, endpoint(t, sb)); c != before[name].count+1 {
			t.Errorf("%s (on %s, %s) counts %d after the master died mid-drain, want %d", name, sb.Node, sb.Tier, c, before[name].count+1)
		}
	}
	agree(t, "after every sandbox answered again", m, n1, n2, n3)
	// Undrained, node-1 takes work again.
	cli(t, env, "node", "undrain", n1.name).ok(t, "undrain "+n1.name)
	if st := nodeStatus(t, m, n1.name); st.Draining {
		t.Errorf("%s still draining after undrain", n1.name)
	}
	if r := m.raw(t, "POST", "/v1/nodes/"+n1.name+"/drain", "", "", nil); r.Status != http.StatusUnauthorized {
		t.Errorf("a drain without the token: HTTP %d", r.Status)
	}
}
