package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// TestMasterFailover: two masters on one PostgreSQL store. One leads; the
// other stands by, answering 503 "standby" that names the leader, with the
// same API token. kill -9 the leader: the standby leads within 10 s with
// every template still there (desired state lives in PostgreSQL), and
// serves new sandboxes. The killed master, started again, stands by.
func TestMasterFailover(t *testing.T) {
	url := testenv.Postgres(t)
	a := startDaemon(t, "--store", url, "--node-name", "node-a")
	a.registerWeb(t, "shared")
	b := startDaemon(t, "--store", url, "--node-name", "node-b")
	if a.Token != b.Token {
		t.Errorf("masters of one store have different API tokens")
	}
	_, err := b.C.Templates(ctxT(t))
	e := expectAPIError(t, err, http.StatusServiceUnavailable, api.CodeStandby)
	if !strings.Contains(e.Body.Message, "node node-a") {
		t.Errorf("the standby's 503 does not name the leader: %q", e.Body.Message)
	}
	sbA := a.create(t, "shared", "on-a")
	getCount(t, endpoint(t, sbA))

	a.Kill(t)
	killed := time.Now()
	testenv.WaitFor(t, 15*time.Second, "the standby leads", func() bool {
		_, err := b.C.Node(ctxT(t))
		return err == nil
	})
	if d := time.Since(killed); d > 10*time.Second {
		t.Errorf("takeover took %v, want ≤ 10 s", d)
	}
	t.Logf("takeover after kill -9 of the leader: %v", time.Since(killed).Round(time.Millisecond))
	ts, err := b.C.Templates(ctxT(t))
	if err != nil || len(ts) != 1 || ts[0].Name != "shared" {
		t.Fatalf("templates on the new leader: %+v, %v", ts, err)
	}
	sbB := b.create(t, "shared", "on-b")
	if c := getCount(t, endpoint(t, sbB)); c != 1 {
		t.Errorf("new sandbox on the new leader counted %d", c)
	}

	a.Start(t)
	_, err = a.C.Templates(ctxT(t))
	e = expectAPIError(t, err, http.StatusServiceUnavailable, api.CodeStandby)
	if !strings.Contains(e.Body.Message, "node node-b") {
		t.Errorf("the restarted master's 503 does not name the new leader: %q", e.Body.Message)
	}
}

// TestFailoverKeepsNodes: two masters on one PostgreSQL and a node apart
// (its own network namespace). The node is paired through the leader and
// runs a sandbox; kill -9 the leader: the standby leads with the node in
// its fleet (the pairing and the placement are in PostgreSQL, the CA is
// shared, so the node takes the new leader's certificate), and reaches the
// sandbox, which kept running all along.
func TestFailoverKeepsNodes(t *testing.T) {
	url := testenv.Postgres(t)
	nd := fleetMachine(t, 3, "--memory-reserve", "0")
	a := startDaemon(t, masterOnly, "--store", url, "--node-name", "master-a")
	b := startDaemon(t, masterOnly, "--store", url, "--node-name", "master-b")
	r := a.raw(t, "POST", "/v1/nodes", a.Token, "application/json", strings.NewReader(fmt.Sprintf(`{"address": %q, "pairing_code": %q}`, nd.listen, nd.code())))
	if r.Status != http.StatusCreated {
		t.Fatalf("pair through the leader: HTTP %d %s", r.Status, r.Body)
	}
	a.registerWeb(t, "web")
	sb := a.create(t, "web", "kept")
	if sb.Node != nd.name {
		t.Fatalf("placed on %q", sb.Node)
	}
	getCount(t, endpoint(t, sb))

	a.Kill(t)
	testenv.WaitFor(t, 15*time.Second, "the standby leads", func() bool {
		var l api.List[api.NodeStatus]
		return b.C.Do(ctxT(t), "GET", "/v1/nodes", nil, &l) == nil
	})
	nodes := listNodes(t, b)
	if len(nodes) != 1 || nodes[0].Name != nd.name || nodes[0].State != "ready" {
		t.Fatalf("the new leader's nodes: %+v", nodes)
	}
	got := b.get(t, "kept")
	if got.ID != sb.ID || got.Node != nd.name || got.Tier != api.TierHot {
		t.Errorf("the new leader sees %+v", got)
	}
	if c := getCount(t, endpoint(t, got)); c != 2 {
		t.Errorf("the sandbox counted %d through the new leader's era, want 2 (it kept running)", c)
	}
	b.transition(t, "kept", "freeze", api.TierFrozen)
}
