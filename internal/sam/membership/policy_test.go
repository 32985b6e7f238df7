package membership

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sandstorm/internal/sam/policy"
	"sandstorm/internal/testenv"
)

const (
	policyV1 = "roles: [{name: coder, services: [\"inference://llama\"]}]\nbindings: [{principal: agent-a, roles: [coder]}]\n"
	policyV2 = "roles: [{name: coder, services: [\"inference://llama\", \"mcp://calc\"]}]\nbindings: [{principal: agent-a, roles: [coder]}, {principal: agent-b, roles: [coder]}]\n"
)

// TestPolicyReachesAMember: a member that never received a policy grants
// nothing; a running member takes the operator's policy, and a change of
// it, within a poll (2 s) and tells its hook; a policy the control plane
// refuses changes nothing; with the control plane gone the member keeps
// the last good policy and says it is stale since then; restarted with the
// control plane still down, it enforces the policy it kept (0600).
func TestPolicyReachesAMember(t *testing.T) {
	f := newFixture(t, 10*time.Minute)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "a")
	// The member reads the real clock (the control plane's stays put: its
	// credentials stay good).
	cfg := Config{ControlPlane: f.client(), Log: slog.New(slog.DiscardHandler)}
	m, err := Join(ctx, dir, "node-a", f.token(t, 1), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if pol := m.Policy().Current(); pol.For("agent-a").Model("llama") || len(pol.Principals()) != 0 {
		t.Fatal("a member with no policy received grants something")
	}
	if st := m.Policy().State(); st.Version != 0 || !st.Stale {
		t.Errorf("before any fetch: %+v, want version 0, stale", st)
	}
	if _, err := f.admin.SetPolicy(ctx, []byte(policyV1)); err != nil {
		t.Fatal(err)
	}
	taken := make(chan *policy.Policy, 4)
	m.Policy().OnChange(func(p *policy.Policy) { taken <- p })
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { m.Run(rctx); close(ran) }()
	testenv.WaitFor(t, 5*time.Second, "the member takes policy version 1", func() bool { return m.Policy().State().Version == 1 })
	if p := <-taken; !p.For("agent-a").Model("llama") {
		t.Error("the hook was not given version 1")
	}

	set := time.Now()
	if _, err := f.admin.SetPolicy(ctx, []byte(policyV2)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the change reaches the member", func() bool { return m.Policy().Current().For("agent-b").MCPServer("calc") })
	t.Logf("a policy change reached the member in %v (polling every 2 s)", time.Since(set).Round(time.Millisecond))
	select {
	case p := <-taken:
		if !p.For("agent-b").Model("llama") {
			t.Error("the hook was not given version 2")
		}
	case <-time.After(5 * time.Second):
		t.Error("the hook was not called for version 2")
	}
	if st := m.Policy().State(); st.Version != 2 || st.Stale || st.Err != nil {
		t.Errorf("after the change: %+v", st)
	}
	if fi, err := os.Stat(filepath.Join(dir, PolicyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, mode %v; want 0600", PolicyFile, err, fi.Mode().Perm())
	}

	// A refused policy is never served: two polls later the member still
	// has version 2.
	if _, err := f.admin.SetPolicy(ctx, []byte("roles: [{name: x, egress: [\"*\"]}]")); err == nil {
		t.Fatal("a bad policy was accepted")
	}
	fetched := m.Policy().State().FetchedAt
	testenv.WaitFor(t, 10*time.Second, "two more polls", func() bool { return m.Policy().State().FetchedAt.After(fetched.Add(2 * time.Second)) })
	if st := m.Policy().State(); st.Version != 2 {
		t.Errorf("after a refused put: version %d, want 2", st.Version)
	}

	f.srv.Close()
	down := time.Now()
	testenv.WaitFor(t, 10*time.Second, "the member says its policy is stale", func() bool { return m.Policy().State().Stale })
	st := m.Policy().State()
	if st.Version != 2 || st.UnreachableSince.Before(down) || st.Err == nil || !m.Policy().Current().For("agent-b").MCPServer("calc") {
		t.Errorf("with the control plane gone: %+v; want version 2 kept, unreachable since it stopped", st)
	}
	if _, err := m.Status(); err == nil {
		t.Error("Status says all is well with the control plane gone")
	}
	cancel()
	<-ran

	// Restarted while the control plane is still down: the kept policy.
	again, err := Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Policy().Current().For("agent-b").MCPServer("calc") || again.Policy().State().Version != 2 {
		t.Fatal("a member restarted with the control plane down does not enforce the policy it kept")
	}
	again.step(ctx)
	if st := again.Policy().State(); !st.Stale || st.Version != 2 || st.UnreachableSince.IsZero() {
		t.Errorf("restarted, the control plane down: %+v; want version 2, stale", st)
	}
}

// TestKeptPolicyUnusable: a policy file that does not parse is not used
// (nothing is granted), rather than failing open or refusing to start.
func TestKeptPolicyUnusable(t *testing.T) {
	f := newFixture(t, 10*time.Minute)
	dir := filepath.Join(t.TempDir(), "a")
	cfg := Config{ControlPlane: f.client(), Log: slog.New(slog.DiscardHandler)}
	if _, err := Join(context.Background(), dir, "node-a", f.token(t, 1), cfg); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, PolicyFile), []byte(`{"version":3,"document":"roles: [{name: x, egress: [\"*\"]}]"}`), 0o600)
	m, err := Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st := m.Policy().State(); st.Version != 0 || len(m.Policy().Current().Principals()) != 0 {
		t.Errorf("an unusable kept policy: %+v", st)
	}
}
